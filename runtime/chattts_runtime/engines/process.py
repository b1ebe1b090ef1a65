"""An engine in its own process: the speech API's event loop and the generation loop stop sharing a GIL.

Why: at a few hundred streams one Python process is bound by its interpreter lock, not
by the GPU. The engine loop (launching graphs, reading codes, cutting audio windows) and
the event loop (HTTP parsing, validation, tokenising, streaming bytes) each need most of
a core; in one process they take turns, and the measured end-to-end throughput at 256
streams fell a quarter short of the same engine driven directly
(bench/results/runtime-h200-*-summary.md). This is the split vLLM makes between its API
server and its engine core.

:class:`ProcessEngine` is the API side: an :class:`Engine` whose ``submit`` sends the
request over a pipe to a child process and whose streams are fed from the event pipe, which the event loop
reads itself (:class:`_FrameReader`).
The child (:func:`engine_process_main`) loads the model itself, runs a normal engine's
worker thread, and sends each batch of chunks back as one message, with the observer's
readings (scheduler waits, batch sizes) and the queue lengths. Nothing else crosses:
prompts and sampling parameters go in, frames and audio come out.

If the child dies, every open stream ends with an error, new requests are refused and
``on_failure`` is called (the server then exits, so the pod is restarted).
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import multiprocessing
import os
import struct
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any, AsyncIterator, Callable

import numpy as np

from chattts_runtime.engines.base import (
    Engine, EngineError, EngineStopped, FrameChunk, NullObserver, QueueFull, SchedulerObserver, SynthesisRequest,
    TextJobs, stream_chunks)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ChildEngine:
    """What the child needs to build the engine: the checkpoint and the engine's arguments."""

    kind: str  # "graph" | "reference"
    checkpoint: str
    device: str
    dtype: str  # torch dtype name, e.g. "bfloat16"
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    audio_tf32: bool = False  # ChatTTSModel.audio_tf32 of the parent's model


class _Readings:
    """Observer of the child: collects readings until the next message carries them."""

    def __init__(self):
        self._lock = threading.Lock()
        self.scheduled: list[tuple[str, float]] = []
        self.steps: list[int] = []

    def on_scheduled(self, request: SynthesisRequest, wait_seconds: float) -> None:
        with self._lock:
            self.scheduled.append((request.request_id, wait_seconds))

    def on_step(self, batch_size: int) -> None:
        with self._lock:
            self.steps.append(batch_size)

    def take(self) -> tuple[list, list]:
        with self._lock:
            out = self.scheduled, self.steps
            self.scheduled, self.steps = [], []
        return out


def _build_engine(spec: ChildEngine, observer):
    import torch  # noqa: PLC0415

    from chattts_runtime.model import load_chattts  # noqa: PLC0415

    model = load_chattts(spec.checkpoint, device=spec.device, dtype=getattr(torch, spec.dtype),
                         audio_tf32=spec.audio_tf32)
    from chattts_runtime.engines.factory import in_process_engine  # noqa: PLC0415

    return in_process_engine(spec.kind, model, observer, spec.kwargs)


# Linux's F_SETPIPE_SZ: a pipe that holds a whole step's chunks (audio of a dozen windows, about
# half a MiB) is written and read in one system call each instead of 64 KiB turns.
_F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20


def _widen(connection) -> None:
    try:
        import fcntl  # noqa: PLC0415

        fcntl.fcntl(connection.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, OSError):  # not Linux, or above /proc/sys/fs/pipe-max-size: default size
        pass


class _Sender:
    """Sends messages from its own thread, in order, so the child's engine loop never waits for the
    parent's reader."""

    def __init__(self, connection):
        import queue  # noqa: PLC0415

        self._connection = connection
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.broken = False
        self._thread = threading.Thread(target=self._run, name="chattts-engine-sender", daemon=True)
        self._thread.start()

    def send(self, message) -> bool:
        if self.broken:
            return False
        self._queue.put(message)
        return True

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                self._connection.send(message)
            except (BrokenPipeError, OSError):
                self.broken = True
                return


# The frames of ``multiprocessing.Connection.send``/``recv`` (a big-endian int32 size, or -1 and then an
# uint64 size for frames over 2 GiB, then the pickle), written and read here on the event loop while the
# child keeps its plain ``Connection``.
def encode_frame(message) -> bytes:
    data = ForkingPickler.dumps(message)
    size = len(data)
    header = struct.pack("!i", size) if size <= 0x7FFFFFFF else struct.pack("!i", -1) + struct.pack("!Q", size)
    return header + data


def frame_at(buffer, start: int, end: int) -> tuple[int, int] | None:
    """(header bytes, body bytes) of the whole frame at ``buffer[start:end]``, or None until it has all come."""
    if end - start < 4:
        return None
    (size,) = struct.unpack_from("!i", buffer, start)
    head = 4
    if size == -1:
        if end - start < 12:
            return None
        (size,) = struct.unpack_from("!Q", buffer, start + 4)
        head = 12
    return (head, size) if end - start >= head + size else None


class _LoopWriter:
    """The parent's end of the request pipe, written by its event loop without ever waiting for the child.

    A blocking ``Connection.send`` would stall every stream of the speech API while the pipe is full (the
    child's request reader gets the interpreter lock only between its engine worker's turns); a sender
    thread instead costs a thread hand-off and interpreter-lock traffic per message on the API's busiest
    core. So each message is framed as ``Connection.send`` frames it (the child reads with ``recv``) and
    handed to an asyncio pipe transport, which writes what the pipe takes now and keeps the rest until the
    pipe drains, in order. Call it on the event loop; a call from another thread is passed to the loop."""

    def __init__(self):
        self._transport: asyncio.WriteTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self.broken = False

    async def open(self, connection) -> None:
        """Write to ``connection``'s pipe from now on (the connection itself is closed)."""
        writer = self

        class Lost(asyncio.BaseProtocol):
            def connection_lost(self, exc):  # the child is gone (EPIPE) or the writer was closed
                writer.broken = True

        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        pipe = os.fdopen(os.dup(connection.fileno()), "wb", buffering=0)
        connection.close()
        self._transport, _ = await self._loop.connect_write_pipe(Lost, pipe)

    def send(self, message) -> bool:
        """Queue ``message`` (never waits); False once the pipe is known to be broken."""
        if self.broken or self._transport is None or self._transport.is_closing():
            return False
        if threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self.send, message)
            return True
        self._transport.write(encode_frame(message))
        return True

    def close(self) -> None:
        """Close the pipe once what is queued is written (at once if the child is gone)."""
        if self._transport is not None:
            self._transport.close()


class _FrameReader(asyncio.Protocol):
    """The parent's end of the event pipe, read by its event loop: each frame ``Connection.send`` wrote
    (the child's ``_Sender``) is unpickled and handed to ``on_message`` in order; ``on_closed`` once the
    child's end is closed.

    A reader thread would cost an interpreter-lock hand-off and a wake-up of the loop
    (``call_soon_threadsafe``) for every message, on the speech API's busiest core; the loop reads the pipe
    between its other callbacks instead."""

    def __init__(self, on_message: Callable[[Any], None], on_closed: Callable[[], None]):
        self._on_message = on_message
        self._on_closed = on_closed
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start, end = 0, len(buffer)
        messages = []
        while (frame := frame_at(buffer, start, end)) is not None:
            head, size = frame
            with memoryview(buffer) as view:
                messages.append(ForkingPickler.loads(view[start + head:start + head + size]))
            start += head + size
        if start:
            del buffer[:start]  # once per read, not once per frame
        for message in messages:
            try:
                self._on_message(message)
            except Exception:  # noqa: BLE001  (one message's handling; the pipe itself is intact)
                log.exception("handling the engine process's %r message failed", message[0])

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc) -> None:
        self._on_closed()


async def read_frames(connection, on_message: Callable[[Any], None], on_closed: Callable[[], None]):
    """Read ``connection``'s frames on the running loop from now on (the connection itself is closed)."""
    pipe = os.fdopen(os.dup(connection.fileno()), "rb", buffering=0)
    connection.close()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: _FrameReader(on_message, on_closed), pipe)
    return transport


def engine_process_main(spec: ChildEngine, requests, events) -> None:
    """The child: build the engine, then serve messages from ``requests`` until "stop" or EOF."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s [engine] %(message)s")
    sender = _Sender(events)
    send = sender.send
    readings = _Readings()

    try:
        engine = _build_engine(spec, readings)
        engine.start_worker()
    except BaseException as err:  # noqa: BLE001  (reported to the parent's start())
        log.exception("engine start-up failed")
        send(("failed", f"{type(err).__name__}: {err}"))
        sender.close()
        return

    def emit(batch: list[tuple[str, FrameChunk]]) -> bool:
        scheduled, steps = readings.take()
        return send(("chunks", batch, scheduled, steps, engine.num_waiting, engine.num_running))

    engine.requests.outlet = emit  # chunks go to the pipe instead of an event loop
    refines = bool(getattr(engine, "refines_text", False))
    if refines:
        engine._text_result = lambda job_id, tokens, error, wait=None: send(("refined", job_id, tokens, error, wait))
    # torch and the model stay for the process's life: out of the cyclic collector's full passes,
    # which would otherwise stall the engine loop for 100s of ms now and then.
    gc.collect()
    gc.freeze()
    send(("ready", engine.describe(), bool(getattr(engine, "decodes_audio", False)), engine.model.sizes.gpt.num_vq,
          refines))
    try:
        while True:
            try:
                message = requests.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if message[0] == "submit":
                request = message[1]
                try:
                    engine.enqueue(request)
                except EngineError as err:  # refused after all (the parent checked most of it)
                    emit([(request.request_id, FrameChunk(engine._empty(), finished=True, finish_reason="error",
                                                          error=str(err)))])
            elif message[0] == "refine" and refines:
                _, job_id, prompt_ids, params = message
                try:
                    engine.enqueue_text(job_id, prompt_ids, params)
                except EngineError as err:
                    send(("refined", job_id, None, str(err)))
            elif message[0] == "abort":
                engine.abort(message[1])
            elif message[0] == "stop":
                break
    finally:
        engine.stop_worker()
        send(("stopped",))
        sender.close()


class ProcessEngine(Engine):
    """The API side of an engine running in a child process (see the module docstring)."""

    def __init__(self, spec: ChildEngine, *, max_waiting: int, max_model_len: int,
                 observer: SchedulerObserver | None = None, on_failure: Callable[[str], None] | None = None,
                 start_timeout: float = 900.0):
        self.spec = spec
        self.name = spec.kind
        self.max_waiting = max_waiting
        self.max_model_len = max_model_len
        self.max_num_seqs = spec.kwargs.get("max_num_seqs")
        self.observer = observer or NullObserver()
        self.on_failure = on_failure
        self.start_timeout = start_timeout
        self.decodes_audio = False  # known once the child is ready
        self.refines_text = False  # likewise
        self._text_jobs = TextJobs()
        self.failed: str | None = None
        self._described: dict[str, Any] = {}
        self._streams: dict[str, asyncio.Queue[FrameChunk]] = {}
        self._requests: dict[str, SynthesisRequest] = {}  # submitted, not yet scheduled
        self._running = 0
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process = None
        self._to_child: _LoopWriter | None = None
        self._from_child = None
        self._reader: asyncio.ReadTransport | None = None
        self._reaping: asyncio.Future | None = None  # the child is reaped after its event pipe closed
        self._ready: asyncio.Future | None = None
        self._num_vq = 1

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        ctx = multiprocessing.get_context("spawn")  # never fork a process that holds CUDA or threads
        child_requests, to_child = ctx.Pipe(duplex=False)
        self._from_child, child_events = ctx.Pipe(duplex=False)
        _widen(self._from_child)
        _widen(to_child)
        self._to_child = _LoopWriter()
        await self._to_child.open(to_child)
        self._process = ctx.Process(target=engine_process_main, args=(self.spec, child_requests, child_events),
                                    name=f"chattts-{self.spec.kind}-engine", daemon=True)
        self._process.start()
        child_requests.close()
        child_events.close()
        self._reader = await read_frames(self._from_child, self._on_message, self._child_closed)
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self.start_timeout)
        except asyncio.TimeoutError:
            self._process.kill()
            raise EngineError(f"engine process did not start within {self.start_timeout:.0f} s") from None

    async def stop(self) -> None:
        self._stopping = True
        if self._process is not None and self._process.is_alive():
            self._send(("stop",))
            await asyncio.to_thread(self._process.join, 30)
            if self._process.is_alive():
                self._process.kill()
        if self._to_child is not None:
            self._to_child.close()
        if self._reader is not None:
            self._reader.close()
        self._end_all("aborted", None)

    # -- requests ------------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self._requests)

    @property
    def num_running(self) -> int:
        return self._running

    def describe(self) -> dict[str, Any]:
        return {**self._described, "process": "separate", "pid": self._process.pid if self._process else None}

    def submit(self, request: SynthesisRequest) -> AsyncIterator[FrameChunk]:
        if self.failed is not None:
            raise EngineStopped(f"engine process failed: {self.failed}")
        if self._stopping or self._loop is None:
            raise EngineStopped("engine is not running")
        if request.prompt_length + 1 > self.max_model_len:
            raise EngineError(f"prompt of {request.prompt_length} tokens does not fit max_model_len "
                              f"{self.max_model_len}")
        if len(self._requests) >= self.max_waiting:
            raise QueueFull(len(self._requests), retry_after=1.0)
        if request.request_id in self._streams:
            raise EngineError(f"duplicate request id {request.request_id}")
        queue: asyncio.Queue[FrameChunk] = asyncio.Queue()
        self._streams[request.request_id] = queue
        self._requests[request.request_id] = request
        if not self._send(("submit", request)):
            del self._streams[request.request_id], self._requests[request.request_id]
            raise EngineStopped("engine process is gone")
        rid = request.request_id
        return stream_chunks(queue, lambda: self.abort(rid), lambda: self._forget(rid))

    async def refine_text(self, job_id: str, prompt_ids, params, on_wait=None) -> list[int]:
        if not self.refines_text:
            return await super().refine_text(job_id, prompt_ids, params, on_wait)

        def enqueue() -> None:
            if self.failed is not None:
                raise EngineStopped(f"engine process failed: {self.failed}")
            if self._stopping or not self._send(("refine", job_id, tuple(prompt_ids), params)):
                raise EngineStopped("engine process is not running")

        return await self._text_jobs.run(job_id, enqueue, lambda: self.abort(job_id), on_wait)

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._requests.pop(request_id, None)


    def abort(self, request_id: str) -> None:
        self._send(("abort", request_id))

    def _send(self, message) -> bool:
        """Queue a message for the child (never waits); False once the pipe is known to be broken."""
        return self._to_child is not None and self._to_child.send(message)

    # -- messages from the child, on the event loop ----------------------------------------------

    def _child_closed(self) -> None:
        """The child's end of the event pipe closed: it stopped, failed or died (reaped off the loop)."""
        async def reap() -> None:
            code = None
            if self._process is not None:
                # EOF can come a moment before the child is reaped.
                await asyncio.to_thread(self._process.join, 10)
                code = self._process.exitcode
            self._on_message(("died", code))

        self._reaping = asyncio.ensure_future(reap())

    def _on_message(self, message) -> None:
        kind = message[0]
        if kind == "chunks":
            _, batch, scheduled, steps, _waiting, running = message
            for request_id, wait in scheduled:
                request = self._requests.pop(request_id, None)
                if request is not None:
                    self.observer.on_scheduled(request, wait)
            for size in steps:
                self.observer.on_step(size)
            self._running = running
            for request_id, chunk in batch:
                queue = self._streams.get(request_id)
                if queue is not None:
                    queue.put_nowait(chunk)
        elif kind == "refined":
            self._text_jobs.settle(*message[1:])
        elif kind == "ready":
            self._described, self.decodes_audio, self._num_vq, self.refines_text = message[1:5]
            if not self._ready.done():
                self._ready.set_result(None)
        elif kind == "failed":
            self._fail(f"engine process failed to start: {message[1]}")
        elif kind == "died" and not self._stopping:
            self._fail(f"engine process exited with code {message[1]}")

    def _fail(self, reason: str) -> None:
        if self.failed is not None:
            return
        self.failed = reason
        log.error("%s", reason)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineError(reason))
            return
        self._end_all("error", reason)
        if self.on_failure is not None:
            self.on_failure(reason)

    def _end_all(self, reason: str, error: str | None) -> None:
        self._text_jobs.fail_all(error or reason)
        for queue in list(self._streams.values()):
            queue.put_nowait(FrameChunk(np.zeros((0, self._num_vq), np.int64), finished=True, finish_reason=reason,
                                        error=error))
        self._requests.clear()
