"""The HTTP server: OpenAI-compatible speech API, health, readiness, metrics.

FastAPI + uvicorn: both are already in the runtime's dependencies (pydantic is shared
with the config contract), uvicorn closes its listening socket on SIGTERM and waits for
in-flight responses up to a timeout (our shutdown grace), and streaming responses are
plain async generators. The request body is parsed by hand (not a FastAPI body model)
so every bad input gets OpenAI's error shape with a 4xx we choose.

Routes: ``POST /v1/audio/speech``, ``GET /v1/models``, ``GET /health`` (process alive),
``GET /ready`` (model loaded and warmed, not draining), ``GET /metrics``.
"""


import asyncio
import base64
import gc
import signal
import json
import logging
import time
from typing import Any

from chattts_runtime.config import RuntimeConfig
from chattts_runtime.engines.factory import create_engine, resolve_device, resolve_dtype

log = logging.getLogger(__name__)


def _error_response(err) -> Any:
    from fastapi.responses import JSONResponse  # noqa: PLC0415

    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def build_app(holder: "ServiceHolder"):
    from fastapi import FastAPI, Request  # noqa: PLC0415
    from fastapi.exceptions import RequestValidationError  # noqa: PLC0415
    from fastapi.responses import JSONResponse, Response, StreamingResponse  # noqa: PLC0415
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # noqa: PLC0415
    from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: PLC0415

    from chattts_runtime.audio_io import CONTENT_TYPES, to_pcm16, wav_header  # noqa: PLC0415
    from chattts_runtime.controls import refined_text_headers  # noqa: PLC0415
    from chattts_runtime.service import APIError, parse_speech_request  # noqa: PLC0415

    app = FastAPI(title="chattts-runtime", lifespan=holder.lifespan)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError):
        return _error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, err: StarletteHTTPException):
        return _error_response(APIError(err.status_code, str(err.detail), code="not_found"
                                        if err.status_code == 404 else None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, err: RequestValidationError):
        return _error_response(APIError(400, str(err.errors()[0].get("msg", "invalid request"))))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        service = holder.service
        if holder.failed:
            return JSONResponse({"status": "failed", "reason": holder.failed}, status_code=503)
        if service is None or not service.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        if service.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ready", **service.engine.describe()}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(holder.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        name = holder.config.model.served_name
        return {"object": "list", "data": [{"id": name, "object": "model", "created": holder.started,
                                             "owned_by": "chattts-runtime"}]}

    @app.post("/v1/audio/voices")
    async def voices(request: Request):
        from chattts_runtime import voices as voice_api  # noqa: PLC0415

        service = holder.service
        if service is None or not service.ready:
            raise APIError(503, "model is loading; retry when /ready answers 200", err_type="server_error",
                           code="not_ready", headers={"Retry-After": "5"})
        if service.model.encoder is None:
            raise APIError(400, "this checkpoint's asset/DVAE.safetensors carries no encoder: voices from a "
                           "sample are not available", code="no_voice_encoder")
        raw = await request.body()
        if len(raw) > voice_api.MAX_BODY_BYTES:
            raise APIError(413, f"body is {len(raw)} bytes; the limit is {voice_api.MAX_BODY_BYTES}",
                           code="body_too_large")
        try:
            samples = voice_api.clip_from_payload(json.loads(raw))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise APIError(400, f"request body is not valid JSON: {err}", code="invalid_json") from None
        except voice_api.VoiceError as err:
            raise APIError(400, str(err), param=err.param) from None
        return await service.run_model(voice_api.encode_clip, service.model, samples)

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        service = holder.service
        if service is None or not service.ready:
            raise APIError(503, "model is loading; retry when /ready answers 200", err_type="server_error",
                           code="not_ready", headers={"Retry-After": "5"})
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise APIError(415, f"Content-Type must be application/json; got {ctype or 'none'!r}",
                           code="unsupported_media_type")
        raw = await request.body()
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise APIError(400, f"request body is not valid JSON: {err}", code="invalid_json") from None
        if not isinstance(payload, dict):
            raise APIError(400, "request body must be a JSON object", code="invalid_json")
        speech_request = parse_speech_request(payload)
        # The text front-end tokenizes every piece of a long input (tens of ms for 4,096
        # characters, bench/results/text-frontend-*): off the event loop.
        synthesis = await asyncio.to_thread(service.prepare, speech_request)
        await service.refine(synthesis, speech_request)
        headers = refined_text_headers(synthesis.refined_text)
        frames = service.submit(synthesis)
        fmt = synthesis.response_format
        if not synthesis.streaming:
            try:
                audio = await service.synthesize(synthesis, frames)
            except BaseException:
                await frames.aclose()
                raise
            body = await asyncio.to_thread(service.encode, audio, fmt)
            return Response(body, media_type=CONTENT_TYPES[fmt], headers=headers)

        audio_chunks = service.stream_audio(synthesis, frames)

        async def audio_body():
            header_sent = fmt != "wav"
            try:
                async for samples in audio_chunks:
                    data = to_pcm16(samples)
                    if not header_sent:
                        data, header_sent = wav_header(None) + data, True
                    yield data
            finally:
                await audio_chunks.aclose()
                await frames.aclose()

        async def sse_body():
            header_sent = fmt != "wav"
            total = 0
            try:
                async for samples in audio_chunks:
                    data = to_pcm16(samples)
                    total += len(samples)
                    if not header_sent:
                        data, header_sent = wav_header(None) + data, True
                    event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                    yield f"data: {json.dumps(event)}\n\n"
                done = {"type": "speech.audio.done",
                        "usage": {"input_tokens": synthesis.prompt_tokens,
                                  "output_tokens": total // service.model.sizes.samples_per_frame,
                                  "total_tokens": synthesis.prompt_tokens
                                  + total // service.model.sizes.samples_per_frame}}
                if synthesis.refined_text is not None:
                    done["refined_text"] = synthesis.refined_text
                yield f"data: {json.dumps(done)}\n\n"
            finally:
                await audio_chunks.aclose()
                await frames.aclose()

        if synthesis.sse:
            return StreamingResponse(sse_body(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", **headers})
        return StreamingResponse(audio_body(), media_type=CONTENT_TYPES[fmt], headers=headers)

    return app


class ServiceHolder:
    """Owns start-up and shutdown: the model loads in the background so /health answers at once."""

    def __init__(self, config: RuntimeConfig):
        from chattts_runtime.metrics import RuntimeMetrics  # noqa: PLC0415

        self.config = config
        self.metrics = RuntimeMetrics()
        self.service = None
        self.failed: str | None = None
        self.started = int(time.time())
        self.on_fatal = None  # set by the runner: called when loading fails
        self._load_task: asyncio.Task | None = None

    async def _load(self) -> None:
        from chattts_runtime.model import load_chattts  # noqa: PLC0415
        from chattts_runtime.service import SpeechService  # noqa: PLC0415

        try:
            device = resolve_device(self.config)
            dtype = resolve_dtype(self.config, device)
            model = await asyncio.to_thread(load_chattts, self.config.model.path, device=device, dtype=dtype)
            engine = create_engine(self.config, model, self.metrics, on_failure=self._engine_failed)
            await engine.start()
            service = SpeechService(self.config, model, engine, self.metrics)
            self.service = service
            if self.config.generation.warmup:
                await service.warmup()
            # Everything loaded so far (torch, the model, the app) lives as long as the process: keep it
            # out of the cyclic collector, whose full passes over it stall the event loop for 100s of ms.
            gc.collect()
            gc.freeze()
            service.ready = True
            log.info("model %s loaded on %s (%s), engine %s ready", self.config.model.path, device, dtype,
                     engine.name)
        except Exception as err:  # noqa: BLE001  (reported through /ready and the exit code)
            log.exception("start-up failed")
            self.failed = f"{type(err).__name__}: {err}"
            if self.on_fatal is not None:
                self.on_fatal()

    def _engine_failed(self, reason: str) -> None:
        """The engine cannot serve any more (its process died): fail readiness and exit, so the pod restarts."""
        self.failed = reason
        if self.service is not None:
            self.service.ready = False
        if self.on_fatal is not None:
            self.on_fatal()

    def lifespan(self, app):
        holder = self

        class _Lifespan:
            async def __aenter__(self):
                holder._load_task = asyncio.create_task(holder._load())

            async def __aexit__(self, *exc):
                if holder._load_task is not None and not holder._load_task.done():
                    holder._load_task.cancel()
                if holder.service is not None:
                    await holder.service.close()

        return _Lifespan()

    def begin_drain(self) -> None:
        if self.service is not None:
            self.service.draining = True


def serve(config: RuntimeConfig) -> int:
    """Run until SIGTERM/SIGINT; in-flight requests get ``shutdown_grace_seconds`` to finish."""
    import uvicorn  # noqa: PLC0415

    holder = ServiceHolder(config)
    app = build_app(holder)

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):  # noqa: ANN001
            # Readiness drops first so load balancers stop sending; uvicorn then stops accepting.
            holder.begin_drain()
            super().handle_exit(sig, frame)
            # uvicorn re-raises captured signals after shutdown (the process would die of SIGTERM);
            # a drained SIGTERM is how a pod normally ends, so it exits 0 instead.
            captured = getattr(self, "_captured_signals", None)
            if sig == signal.SIGTERM and isinstance(captured, list) and sig in captured:
                captured.remove(sig)

    server = DrainingServer(uvicorn.Config(
        app, host=config.server.host, port=config.server.port, log_level="info", access_log=False,
        timeout_graceful_shutdown=config.server.shutdown_grace_seconds, lifespan="on"))

    def fatal() -> None:
        server.should_exit = True

    holder.on_fatal = fatal
    server.run()
    return 1 if holder.failed else 0
