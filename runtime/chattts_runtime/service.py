"""Speech synthesis on top of an engine: request validation, prompts, audio decoding, metrics.

Used by the HTTP server (``server.py``) and by the offline ``synthesize`` command, so
both validate input the same way and produce the same audio.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import AsyncIterator, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from chattts_runtime.audio_io import (
    BatchedDecoder, StreamingDecoder, StreamWindows, UnsupportedFormat, check_format, encode)
from chattts_runtime.config import RuntimeConfig
from chattts_runtime.errors import APIError  # noqa: F401  (imported from here by the server)
from chattts_runtime.limits import quote
from chattts_runtime.engines.base import Engine, EngineStopped, FrameChunk, QueueFull, SamplingParams, SynthesisRequest
from chattts_runtime.metrics import RuntimeMetrics
from chattts_runtime.model.config import SAMPLE_RATE

log = logging.getLogger(__name__)

MIN_SPEED, MAX_SPEED = 0.25, 4.0
# OpenAI's model names are accepted as aliases of the served model, so existing clients work unchanged.
OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
INT32_MAX = 2**31 - 1


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech`` body (OpenAI's fields plus ChatTTS sampling extensions)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    input: str
    voice: str
    response_format: str = "wav"
    speed: float = 1.0
    stream: bool | None = None  # None (unset): streamed, as OpenAI's endpoint; false: one whole body
    stream_format: Literal["audio", "sse"] | None = None
    instructions: str | None = None  # accepted for compatibility; ChatTTS has no instruction input
    # Extensions (not in OpenAI's API):
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # what a torch generator takes

    @property
    def streaming(self) -> bool:
        return self.stream is not False or self.stream_format is not None


def parse_speech_request(payload: object) -> SpeechRequest:
    try:
        return SpeechRequest.model_validate(payload)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from None


@dataclass
class Synthesis:
    """A validated request, ready for the engine."""

    request: SynthesisRequest
    response_format: str
    streaming: bool
    sse: bool


class SpeechService:
    def __init__(self, config: RuntimeConfig, model, engine: Engine, metrics: RuntimeMetrics):
        self.config = config
        self.model = model
        self.engine = engine
        self.metrics = metrics
        self.ready = False
        self.draining = False
        self.in_flight = 0
        # One decode thread: stream windows are batched (BatchedDecoder), whole responses go one by one.
        self._decode_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chattts-decode")
        self._batched = BatchedDecoder(self._decode_batch, self._decode_pool)
        self._cuda_stream = None
        metrics.bind_engine(engine)

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.config.model.served_name, *OPENAI_MODEL_ALIASES)

    # -- validation ------------------------------------------------------------------------

    def prepare(self, req: SpeechRequest) -> Synthesis:
        if req.model not in self.model_names:
            raise APIError(404, f"model {quote(req.model)} is not served here; use {self.config.model.served_name!r}",
                           param="model", code="model_not_found")
        if not req.input.strip():
            raise APIError(400, "input is empty", param="input")
        limit = self.config.server.max_input_chars
        if len(req.input) > limit:
            raise APIError(400, f"input is {len(req.input)} characters; the limit is {limit}", param="input")
        if not MIN_SPEED <= req.speed <= MAX_SPEED:
            raise APIError(400, f"speed must be between {MIN_SPEED} and {MAX_SPEED}; got {req.speed}",
                           param="speed")
        try:
            check_format(req.response_format, req.streaming)
        except UnsupportedFormat as err:
            raise APIError(400, str(err), param="response_format") from None
        from chattts_runtime.model.speaker import SpeakerError  # noqa: PLC0415

        if len(req.voice) > self.config.server.max_voice_chars:
            raise APIError(400, f"voice is {len(req.voice)} characters; the limit is "
                           f"{self.config.server.max_voice_chars}", param="voice")
        try:
            speaker = self.model.speaker_for(req.voice).numpy()
        except SpeakerError as err:
            raise APIError(400, str(err), param="voice") from None
        prompt = self.model.tokenizer.build(req.input, with_speaker=True, speed=req.speed)
        gen = self.config.generation
        max_frames = min(gen.max_new_frames, self.config.engine.max_model_len - len(prompt.input_ids) - 1)
        if max_frames < 1:
            raise APIError(400, f"input is {len(prompt.input_ids)} tokens: too long for max_model_len "
                           f"{self.config.engine.max_model_len}", param="input")
        params = SamplingParams(
            temperature=gen.temperature if req.temperature is None else req.temperature,
            top_p=gen.top_p if req.top_p is None else req.top_p,
            top_k=gen.top_k if req.top_k is None else req.top_k,
            repetition_penalty=gen.repetition_penalty,
            max_new_frames=max_frames,
            min_new_frames=1,  # never answer with empty audio (ChatTTS retries an immediate end)
            seed=gen.seed if req.seed is None else req.seed,
        )
        hidden = gen.audio_decoder == "decoder"
        request = SynthesisRequest(
            request_id=f"speech-{uuid.uuid4().hex}", prompt_ids=prompt.input_ids, speaker=speaker,
            params=params, want_hidden=hidden,
            # Engines that decode audio in their own loop do it for streams (same windows as ours).
            want_audio=req.streaming and not hidden and self.engine.decodes_audio)
        return Synthesis(request, req.response_format, req.streaming, req.stream_format == "sse")

    # -- generation ------------------------------------------------------------------------

    def submit(self, synthesis: Synthesis) -> AsyncIterator[FrameChunk]:
        if self.draining:
            raise APIError(503, "server is shutting down", err_type="server_error", code="shutting_down")
        synthesis.request.arrival = time.monotonic()
        try:
            return self.engine.submit(synthesis.request)
        except QueueFull as err:
            raise APIError(429, f"server is at capacity ({err}); retry later", err_type="rate_limit_error",
                           code="queue_full", headers={"Retry-After": str(max(1, round(err.retry_after)))}) from None
        except EngineStopped:
            raise APIError(503, "server is shutting down", err_type="server_error", code="shutting_down") from None

    def _decode_batch(self, frames: np.ndarray) -> np.ndarray:
        """``frames`` [B, T, num_vq] codes, or [B, T, hidden] hidden states on the decoder path."""
        import torch  # noqa: PLC0415

        batch = torch.from_numpy(np.ascontiguousarray(frames))
        decode = self.model.hidden_to_audio if self.config.generation.audio_decoder == "decoder" \
            else self.model.codes_to_audio
        if self.model.device.type != "cuda":
            return decode(batch).numpy()
        # Its own CUDA stream: the GPT's per-step host sync does not wait for vocoder kernels.
        if self._cuda_stream is None:
            self._cuda_stream = torch.cuda.Stream(device=self.model.device)
        with torch.cuda.stream(self._cuda_stream):
            return decode(batch).cpu().numpy()

    def _decode_frames(self, frames: np.ndarray) -> np.ndarray:
        return self._decode_batch(frames[None])[0]

    async def _in_pool(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._decode_pool, fn, *args)

    @staticmethod
    def _frames_of(chunk: FrameChunk, hidden: bool) -> np.ndarray:
        return chunk.hidden if hidden and chunk.hidden is not None else chunk.codes

    def _finish(self, arrival: float, samples: int, status: str) -> None:
        seconds = samples / SAMPLE_RATE
        self.metrics.requests.labels(status).inc()
        if samples:
            self.metrics.audio_seconds.inc(seconds)
            self.metrics.rtf.observe((time.monotonic() - arrival) / seconds)

    async def synthesize(self, synthesis: Synthesis, stream: AsyncIterator[FrameChunk], *,
                         record: bool = True) -> np.ndarray:
        """Whole-utterance path: all frames, then one decode. Counted ``ok`` when ``record``; other
        outcomes (errors, a client that left) are counted by the caller that sees them."""
        req = synthesis.request
        hidden = req.want_hidden
        parts: list[np.ndarray] = []
        self.in_flight += 1
        try:
            async for chunk in stream:
                if chunk.error:
                    raise APIError(500, f"generation failed: {chunk.error}", err_type="server_error")
                if len(chunk.codes):
                    parts.append(self._frames_of(chunk, hidden))
            frames = np.concatenate(parts) if parts else np.zeros((0, 1))
            audio = await self._in_pool(self._decode_frames, frames) if len(frames) else np.zeros(0, np.float32)
            if record:
                self.metrics.ttfa.observe(time.monotonic() - req.arrival)
                self._finish(req.arrival, len(audio), "ok")
            return audio
        finally:
            self.in_flight -= 1

    async def stream_audio(self, synthesis: Synthesis, stream: AsyncIterator[FrameChunk]) -> AsyncIterator[np.ndarray]:
        """Streaming path: audio chunks as frames arrive (first chunk smaller for latency).

        Windows follow ``StreamWindows``; the engine decodes them itself when the request
        has ``want_audio``, else they are decoded here, batched across streams.
        """
        req = synthesis.request
        windows = StreamWindows(self.config.generation.stream_chunk_frames)
        decoder = StreamingDecoder(self.model.sizes.samples_per_frame, windows=windows)
        produced = 0
        status = "aborted"
        self.in_flight += 1
        try:
            async for chunk in stream:
                if chunk.error:
                    status = "error"
                    log.error("request %s failed mid-stream: %s", req.request_id, chunk.error)
                    return
                samples = None
                if req.want_audio:
                    samples = chunk.audio
                else:
                    if len(chunk.codes):
                        decoder.push(self._frames_of(chunk, req.want_hidden))
                    due = windows.first_frames if produced == 0 else windows.chunk_frames
                    if decoder.pending_frames >= due or (chunk.finished and decoder.pending_frames):
                        frames, start, n = decoder.next_window()
                        samples = decoder.accept(await self._batched.decode(frames), start, n)
                if samples is not None and len(samples):
                    if produced == 0:
                        self.metrics.ttfa.observe(time.monotonic() - req.arrival)
                    produced += len(samples)
                    yield samples
                if chunk.finished:
                    status = "ok" if chunk.finish_reason in ("eos", "length") else chunk.finish_reason or "ok"
        finally:
            self.in_flight -= 1
            self._finish(req.arrival, produced, status)

    def encode(self, samples: np.ndarray, fmt: str) -> bytes:
        return encode(samples, fmt)

    async def warmup(self) -> None:
        """One short greedy synthesis through the whole path, so the first user pays no start-up cost."""
        gen = self.config.generation
        prompt = self.model.tokenizer.build("warm up", with_speaker=False)
        # The configured sampling path, so its first use (kernels, allocations) is paid here.
        request = SynthesisRequest("warmup", prompt.input_ids, None, SamplingParams(
            temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k,
            repetition_penalty=gen.repetition_penalty, max_new_frames=4, min_new_frames=1, seed=0))
        synthesis = Synthesis(request, "wav", False, False)
        await self.synthesize(synthesis, self.engine.submit(request), record=False)  # not a user request

    async def close(self) -> None:
        await self.engine.stop()
        self._decode_pool.shutdown(wait=False)

