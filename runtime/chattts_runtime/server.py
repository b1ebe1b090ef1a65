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
import sys
import json
import logging
import time
from typing import Any

from chattts_runtime.config import RuntimeConfig
from chattts_runtime.engines.factory import create_engine, resolve_device, resolve_dtype

log = logging.getLogger(__name__)


# Under these sizes the work takes well under a millisecond or two, less than a hop to a thread and
# back costs a loaded server (the hop waits for the interpreter lock): done on the event loop.
INLINE_JSON_BYTES = 16 * 1024
INLINE_PREPARE_CHARS = 256
# The interpreter lock's switch interval in the speech server (Python's default is 5 ms): its threads
# (the engine process's reader, decode and refine workers, to_thread hops) hand the lock back sooner.
SWITCH_INTERVAL_SECONDS = 0.001


async def off_loop_if(condition: bool, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a thread when ``condition`` (costly work), else right here on the loop."""
    if condition:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


def _error_response(err) -> Any:
    from fastapi.responses import JSONResponse  # noqa: PLC0415

    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


SPEECH_PATH = "/v1/audio/speech"


def speech_openapi(model) -> dict:
    """The speech route's body in the OpenAPI document (the route parses it by hand, for OpenAI-shaped errors)."""
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": model.model_json_schema()}}}}


def build_app(holder: "ServiceHolder"):
    from fastapi import FastAPI, Request  # noqa: PLC0415
    from fastapi.exceptions import RequestValidationError  # noqa: PLC0415
    from fastapi.responses import JSONResponse, Response, StreamingResponse  # noqa: PLC0415
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # noqa: PLC0415
    from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: PLC0415

    from starlette.requests import ClientDisconnect  # noqa: PLC0415

    from chattts_runtime.abandon import Stopped, client_disconnected, unless  # noqa: PLC0415
    from chattts_runtime.audio_io import CONTENT_TYPES, AudioEncoder  # noqa: PLC0415
    from chattts_runtime.auth import APIKeys, BearerAuth  # noqa: PLC0415
    from chattts_runtime.controls import refined_text_headers  # noqa: PLC0415
    from chattts_runtime.limits import names_for_header, parse_json_object, read_body, unknown_fields  # noqa: PLC0415
    from chattts_runtime.service import APIError, SpeechRequest, parse_speech_request  # noqa: PLC0415

    app = FastAPI(title="chattts-runtime", lifespan=holder.lifespan)
    limits = holder.config.server
    if limits.api_keys_path:
        keys = APIKeys(limits.api_keys_path, limits.api_keys_reload_seconds)
        app.add_middleware(BearerAuth, keys=keys, on_refused=holder.count_refused)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError):
        holder.count_error(request.url.path, err)
        return _error_response(err)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception):
        log.exception("unexpected error answering %s", request.url.path)
        return await _api_error(request, APIError(500, f"internal error ({type(err).__name__})",
                                                  err_type="server_error"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        return await _api_error(request, APIError(err.status_code, str(err.detail), code="not_found"
                                                  if err.status_code == 404 else None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, err: RequestValidationError):
        return await _api_error(request, APIError(400, str(err.errors()[0].get("msg", "invalid request"))))

    @app.get("/health")
    async def health():
        service = holder.service  # upstream_data: what start-up found (None while loading)
        return {"status": "ok", "upstream_data": None if service is None else service.upstream_data}

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
        raw = await read_body(request.stream(), request.headers.get("content-length"),
                              max_bytes=voice_api.MAX_BODY_BYTES, timeout=limits.body_timeout_seconds)
        payload = await asyncio.to_thread(parse_json_object, raw, max_depth=limits.max_json_depth)
        try:
            samples = voice_api.clip_from_payload(payload)
        except voice_api.VoiceError as err:
            raise APIError(400, str(err), param=err.param) from None
        return await service.run_model(voice_api.encode_clip, service.model, samples)

    @app.post("/v1/audio/speech", openapi_extra=speech_openapi(SpeechRequest))
    async def speech(request: Request):
        service = holder.service
        if service is None or not service.ready:
            raise APIError(503, "model is loading; retry when /ready answers 200", err_type="server_error",
                           code="not_ready", headers={"Retry-After": "5"})
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
        headers = unknown_field_policy(unknown_fields(payload, SpeechRequest))
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
        fmt = synthesis.response_format
        if not synthesis.streaming:
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

    def unknown_field_policy(names: list[str]) -> dict[str, str]:
        """Refuse the request or name the ignored fields in a header (and a log line)."""
        if not names:
            return {}
        listed = names_for_header(names)
        if limits.unknown_fields == "reject":
            raise APIError(400, f"unknown field(s): {listed}", param=names[0], code="unknown_field")
        log.warning("speech request: ignored unknown field(s) %s", listed)
        return {"X-ChatTTS-Ignored-Fields": listed}

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
        self._lag_task: asyncio.Task | None = None
        self.grace_expired = asyncio.Event()
        self.unfinished_at_expiry = 0  # requests still running when the shutdown grace ran out

    def count_outcome(self, path: str, outcome: str) -> None:
        if path == SPEECH_PATH:
            self.metrics.requests.labels(outcome).inc()

    def count_error(self, path: str, err) -> None:
        from chattts_runtime.metrics import outcome_of_status  # noqa: PLC0415

        self.count_outcome(path, outcome_of_status(err.status))

    def count_refused(self, path: str) -> None:
        """A request refused before routing (no valid API key)."""
        self.count_outcome(path, "client_error")

    def expire_grace(self) -> None:
        """The shutdown grace is over: whole requests still waiting get 503, the exit code says so."""
        self.unfinished_at_expiry = self.service.in_flight if self.service is not None else 0
        if self.unfinished_at_expiry:
            log.error("shutdown grace period over with %d request(s) unfinished", self.unfinished_at_expiry)
        self.grace_expired.set()

    async def _load(self) -> None:
        from chattts_runtime.model import load_chattts  # noqa: PLC0415
        from chattts_runtime.service import SpeechService  # noqa: PLC0415

        try:
            device = resolve_device(self.config)
            dtype = resolve_dtype(self.config, device)
            model = await asyncio.to_thread(load_chattts, self.config.model.path, device=device, dtype=dtype)
            engine = create_engine(self.config, model, self.metrics, on_failure=self._engine_failed)
            await engine.start()
            # Off the loop: it reads the homophone table and loads the language normalizers' grammars.
            service = await asyncio.to_thread(SpeechService, self.config, model, engine, self.metrics)
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
                holder._lag_task = asyncio.create_task(holder.metrics.watch_loop_lag())

            async def __aexit__(self, *exc):
                holder._lag_task.cancel()
                if holder._load_task is not None and not holder._load_task.done():
                    holder._load_task.cancel()
                if holder.service is not None:
                    await holder.service.close()

        return _Lifespan()

    def begin_drain(self) -> None:
        if self.service is not None:
            self.service.draining = True


GRACE_MARGIN_SECONDS = 1.0  # after our grace deadline, for the 503s to be written before uvicorn cancels


EXIT_PORT_IN_USE = 3  # exit codes: 0 drained, 1 start-up or engine failed / grace ran out, 2 bad config or model


def serve(config: RuntimeConfig) -> int:
    """Run until SIGTERM/SIGINT; in-flight requests get ``shutdown_grace_seconds`` to finish."""
    import uvicorn  # noqa: PLC0415

    from chattts_runtime.connections import ConnectionGuard, PortInUse, bind_listener, guarded_protocol  # noqa: PLC0415

    try:  # before the model loads: a taken port fails now, not after it
        listener = bind_listener(config.server.host, config.server.port)
    except PortInUse as err:
        log.error("cannot listen: %s (server.port)", err.strerror)
        return EXIT_PORT_IN_USE
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_SECONDS))
    holder = ServiceHolder(config)
    app = build_app(holder)
    guard = ConnectionGuard(config.server, count=lambda reason: holder.metrics.http_refused.labels(reason).inc())
    log.info("listening on %s:%d, at most %d connections (server.max_connections)", config.server.host,
             config.server.port, guard.max_connections)

    grace = config.server.shutdown_grace_seconds

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):  # noqa: ANN001
            # Readiness drops first so load balancers stop sending; uvicorn then stops accepting.
            if not self.should_exit:
                holder.begin_drain()
                # Our own deadline, a little before uvicorn's: whole requests still waiting then get a
                # 503 in OpenAI's shape (uvicorn would cancel them into a plain 500).
                asyncio.get_running_loop().call_later(grace, holder.expire_grace)
            super().handle_exit(sig, frame)
            # uvicorn re-raises captured signals after shutdown (the process would die of SIGTERM);
            # a drained SIGTERM is how a pod normally ends, so it exits 0 instead.
            captured = getattr(self, "_captured_signals", None)
            if sig == signal.SIGTERM and isinstance(captured, list) and sig in captured:
                captured.remove(sig)

    server = DrainingServer(uvicorn.Config(
        app, host=config.server.host, port=config.server.port, log_level="info", access_log=False,
        timeout_graceful_shutdown=grace + GRACE_MARGIN_SECONDS, lifespan="on",
        http=guarded_protocol(guard), ws="none", timeout_keep_alive=config.server.keep_alive_timeout_seconds))

    def fatal() -> None:
        server.should_exit = True

    holder.on_fatal = fatal
    server.run(sockets=[listener])
    return 1 if holder.failed or holder.unfinished_at_expiry else 0
