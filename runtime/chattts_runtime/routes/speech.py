"""``POST /v1/audio/speech``: OpenAI's speech endpoint, streamed (raw audio or SSE) or whole.

The body is parsed by hand (not a FastAPI body model), so every bad input gets OpenAI's error shape
with a 4xx we choose; small bodies are parsed on the loop, long inputs are prepared off it.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from chattts_runtime.abandon import Stopped, client_disconnected, unless
from chattts_runtime.audio_io import CONTENT_TYPES, AudioEncoder
from chattts_runtime.controls import refined_text_headers
from chattts_runtime.errors import APIError
from chattts_runtime.limits import names_for_header, parse_json_object, read_body, unknown_fields
from chattts_runtime.routes.common import holder_of, off_loop_if, ready_service
from chattts_runtime.server import SPEECH_PATH
from chattts_runtime.service import SpeechRequest, parse_speech_request

log = logging.getLogger("chattts_runtime.server")

# Under these sizes the work takes well under a millisecond or two, less than a hop to a thread and
# back costs a loaded server (the hop waits for the interpreter lock): done on the event loop.
INLINE_JSON_BYTES = 16 * 1024
INLINE_PREPARE_CHARS = 256

router = APIRouter()


def speech_openapi(model) -> dict:
    """The speech route's body in the OpenAPI document (the route parses it by hand, for OpenAI-shaped errors)."""
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": model.model_json_schema()}}}}


def unknown_field_policy(names: list[str], policy: str) -> dict[str, str]:
    """Refuse the request or name the ignored fields in a header (and a log line)."""
    if not names:
        return {}
    listed = names_for_header(names)
    if policy == "reject":
        raise APIError(400, f"unknown field(s): {listed}", param=names[0], code="unknown_field")
    log.warning("speech request: ignored unknown field(s) %s", listed)
    return {"X-ChatTTS-Ignored-Fields": listed}


@router.post(SPEECH_PATH, openapi_extra=speech_openapi(SpeechRequest))
async def speech(request: Request):
    holder = holder_of(request)
    limits = holder.config.server
    service = ready_service(request)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise APIError(415, f"Content-Type must be application/json; got {ctype or 'none'!r}",
                       code="unsupported_media_type")
    try:
        raw = await read_body(request.stream(), request.headers.get("content-length"),
                              max_bytes=limits.max_body_bytes, timeout=limits.body_timeout_seconds)
    except ClientDisconnect:
        holder.count_outcome(request.url.path, "aborted")
        return Response(status_code=400)  # nobody reads it
    payload = await off_loop_if(len(raw) > INLINE_JSON_BYTES, parse_json_object, raw,
                                max_depth=limits.max_json_depth)
    headers = unknown_field_policy(unknown_fields(payload, SpeechRequest), limits.unknown_fields)
    speech_request = parse_speech_request(payload)
    # Off the event loop when long: the text front-end tokenizes every piece of a long input (tens of
    # ms for 4,096 characters, bench/results/text-frontend-*), a long speaker string is decoded; and
    # always when a language normalizer may run (WeTextProcessing / nemo: 0.1-0.9 s for one piece).
    synthesis = await off_loop_if(len(speech_request.input) > INLINE_PREPARE_CHARS
                                  or len(speech_request.voice) > INLINE_PREPARE_CHARS
                                  or service.may_spell_out(speech_request),
                                  service.prepare, speech_request)
    if synthesis.waits_before_audio:  # refine-text, a voice pass: stopped there when the client leaves
        try:
            await unless(service.before_audio(synthesis, speech_request),
                         {"client left": client_disconnected(request.receive)})
        except Stopped:
            holder.count_outcome(request.url.path, "aborted")
            return Response(status_code=499)  # nobody reads it
    headers.update(refined_text_headers(synthesis.refined_text))
    headers.update(service.stage_headers(synthesis))
    frames = service.submit(synthesis)
    if not synthesis.streaming:
        return await _whole(request, holder, service, synthesis, frames, headers)
    return _streamed(service, synthesis, frames, headers)


async def _whole(request: Request, holder, service, synthesis, frames, headers: dict[str, str]) -> Response:
    """The whole response at once (``stream_format`` unset and not streaming)."""
    fmt = synthesis.response_format

    async def whole() -> bytes:
        try:
            audio = await service.synthesize(synthesis, frames)
        finally:
            await frames.aclose()
        return await asyncio.to_thread(service.encode, audio, fmt)

    try:
        body = await unless(whole(), {"client left": client_disconnected(request.receive),
                                      "grace expired": holder.grace_expired.wait()})
    except Stopped as stop:
        if stop.reason == "client left":
            holder.count_outcome(request.url.path, "aborted")
            return Response(status_code=499)  # nobody reads it
        raise APIError(503, "the server shut down before this request finished (shutdown grace "
                       "period over); retry", err_type="server_error", code="shutdown_timeout") from None
    return Response(body, media_type=CONTENT_TYPES[fmt], headers=headers)


def _streamed(service, synthesis, frames, headers: dict[str, str]) -> StreamingResponse:
    """Audio as it is produced: raw bytes of the format, or OpenAI's SSE events."""
    fmt = synthesis.response_format
    audio_chunks = service.stream_audio(synthesis, frames)

    async def encoded():
        """The response's bytes as audio is produced (compressed formats encoded incrementally)."""
        encoder = AudioEncoder(fmt)
        try:
            async for samples in audio_chunks:  # PCM and WAV are a cast: on the loop
                yield await off_loop_if(not encoder.cheap, encoder.push, samples), len(samples)
            tail = await off_loop_if(not encoder.cheap, encoder.finish)
            if tail:
                yield tail, 0
        finally:
            encoder.close()
            await audio_chunks.aclose()
            await frames.aclose()

    async def audio_body():
        async for data, _ in encoded():
            if data:
                yield data

    async def sse_body():
        async for data, _ in encoded():
            if not data:
                continue
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            yield f"data: {json.dumps(event)}\n\n"
        frames_out = synthesis.frames  # every frame generated (each piece's last one is half sent)
        done = {"type": "speech.audio.done",
                "usage": {"input_tokens": synthesis.prompt_tokens, "output_tokens": frames_out,
                          "total_tokens": synthesis.prompt_tokens + frames_out}}
        if synthesis.refined_text is not None:
            done["refined_text"] = synthesis.refined_text
        yield f"data: {json.dumps(done)}\n\n"

    if synthesis.sse:
        return StreamingResponse(sse_body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", **headers})
    return StreamingResponse(audio_body(), media_type=CONTENT_TYPES[fmt], headers=headers)
