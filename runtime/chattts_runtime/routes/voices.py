"""``POST /v1/audio/voices``: a speaker string from a voice sample (the DVAE encoder's codes)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from chattts_runtime import voices as voice_api
from chattts_runtime.limits import parse_json_object, read_body
from chattts_runtime.routes.common import holder_of, ready_service
from chattts_runtime.errors import APIError

router = APIRouter()


@router.post("/v1/audio/voices")
async def voices(request: Request):
    service = ready_service(request)
    limits = holder_of(request).config.server
    if service.model.encoder is None:
        raise APIError(400, "this checkpoint's asset/DVAE.safetensors carries no encoder: voices from a "
                       "sample are not available", code="no_voice_encoder")
    raw = await read_body(request.stream(), request.headers.get("content-length"),
                          max_bytes=voice_api.MAX_BODY_BYTES, timeout=limits.body_timeout_seconds)
    payload = await asyncio.to_thread(parse_json_object, raw, max_depth=limits.max_json_depth)
    try:
        samples = voice_api.clip_from_payload(payload)
    except voice_api.VoiceError as err:
        raise APIError(400, str(err), param=err.param) from None
    return await service.run_model(voice_api.encode_clip, service.model, samples)
