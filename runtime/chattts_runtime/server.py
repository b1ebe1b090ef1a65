"""The HTTP server: OpenAI-compatible speech API, health, readiness, metrics.

FastAPI + uvicorn: both are already in the runtime's dependencies (pydantic is shared
with the config contract), uvicorn closes its listening socket on SIGTERM and waits for
in-flight responses up to a timeout (our shutdown grace), and streaming responses are
plain async generators. The request body is parsed by hand (not a FastAPI body model)
so every bad input gets OpenAI's error shape with a 4xx we choose.

Routes (``routes/``, one module each): ``POST /v1/audio/speech``, ``POST /v1/audio/voices``,
``GET /v1/models``, ``GET /health`` (process alive), ``GET /ready`` (model loaded and warmed, not
draining), ``GET /metrics``. This module owns start-up, draining and shutdown.
"""


import asyncio
import gc
import signal
import sys
import logging
import time

from chattts_runtime.config import RuntimeConfig
from chattts_runtime.engines.factory import create_engine, load_options, resolve_device

log = logging.getLogger(__name__)


SPEECH_PATH = "/v1/audio/speech"  # its outcomes are counted (chattts_requests_total); routes/speech.py serves it
# The interpreter lock's switch interval in the speech server (Python's default is 5 ms): its threads
# (the engine process's reader, decode and refine workers, to_thread hops) hand the lock back sooner.
SWITCH_INTERVAL_SECONDS = 0.001


def build_app(holder: "ServiceHolder"):
    """The FastAPI app: the routes of ``routes/`` (imported here: FastAPI loads with the server only)."""
    from chattts_runtime.routes import build_app as assemble  # noqa: PLC0415

    return assemble(holder)


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
            model = await asyncio.to_thread(load_chattts, self.config.model.path, **load_options(self.config, device))
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
            log.info("model %s loaded on %s (%s, audio matrix products in %s), engine %s ready",
                     self.config.model.path, device, str(model.gpt.dtype).removeprefix("torch."),
                     "tf32" if model.audio_tf32 else "float32", engine.name)
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
