"""The request side of an engine whose worker is a thread: waiting queue, streams, aborts, delivery.

The reference and the graph engine each own one (``engine.requests``) and differ only in their
worker. On the event loop: :meth:`RequestPlumbing.submit` registers a stream and queues the
request, :meth:`abort` marks it for the worker; on the worker thread: :meth:`wait_for_work`
sleeps until something is to be done, :meth:`take_aborted` collects the aborts (dropping
aborted requests that still wait) and :meth:`emit` hands a batch of chunks back to the loop,
or to ``outlet`` where the engine runs in a process of its own (``engines.process``).

Every field the worker and the loop share is guarded by ``cond`` (a re-entrant lock: an
engine's ``enqueue`` may run inside :meth:`submit`).
"""
from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, AsyncIterator, Callable

import numpy as np

from chattts_runtime.engines.base import EngineError, EngineStopped, FrameChunk, QueueFull, stream_chunks

Events = list[tuple[str, FrameChunk]]


def check_prompt_fits(request, max_model_len: int) -> None:
    """A prompt longer than the context (plus the first generated position) is refused at enqueue."""
    if request.prompt_length + 1 > max_model_len:
        raise EngineError(f"prompt of {request.prompt_length} tokens does not fit max_model_len {max_model_len}")


class RequestPlumbing:
    """Queue, streams and worker thread of one engine (see the module docstring).

    ``request_id(item)``: the request id of a waiting item (what :meth:`take_aborted` drops by).
    """

    def __init__(self, *, max_waiting: int, num_vq: int, request_id: Callable[[Any], str]):
        self.max_waiting = max_waiting
        self.cond = threading.Condition()
        self.waiting: collections.deque = collections.deque()
        self.aborted: set[str] = set()
        self.stopping = False
        # Where the worker's chunks go instead of the event loop's streams (a pipe to the parent).
        self.outlet: Callable[[Events], bool] | None = None
        self._num_vq = num_vq
        self._request_id = request_id
        self._streams: dict[str, asyncio.Queue[FrameChunk]] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the event-loop side -------------------------------------------------------------

    def bind_loop(self) -> None:
        """Streams are served on the running event loop (an engine's ``start``)."""
        self._loop = asyncio.get_running_loop()

    @property
    def started(self) -> bool:
        return self._loop is not None

    def submit(self, request, enqueue: Callable[[Any], None],
               abort: Callable[[str], None]) -> AsyncIterator[FrameChunk]:
        """Register ``request``'s stream and ``enqueue(request)`` (it raises what refuses it); the stream's
        consumer stopping early calls ``abort(request_id)``."""
        if self._loop is None:
            raise EngineError("engine not started")
        queue: asyncio.Queue[FrameChunk] = asyncio.Queue()
        rid = request.request_id
        with self.cond:
            if rid in self._streams:
                raise EngineError(f"duplicate request id {rid}")
            enqueue(request)
            self._streams[rid] = queue
        return stream_chunks(queue, lambda: abort(rid), lambda: self._streams.pop(rid, None))

    def add(self, item, queue: collections.deque | None = None) -> None:
        """Append ``item`` to ``queue`` (default: ``waiting``; another queue the worker replaces is passed
        with ``cond`` held) and wake the worker; refused while stopping or when ``max_waiting`` items
        already wait there."""
        with self.cond:  # the worker replaces ``waiting`` under the lock: read it inside
            queue = self.waiting if queue is None else queue
            if self.stopping:
                raise EngineStopped("engine is stopping")
            if len(queue) >= self.max_waiting:
                raise QueueFull(len(queue), retry_after=1.0)
            queue.append(item)
            self.cond.notify()

    def abort(self, request_id: str) -> None:
        with self.cond:
            self.aborted.add(request_id)
            self.cond.notify()

    def close_streams(self) -> None:
        """After the worker stopped: every stream still open ends ``aborted``."""
        for queue in list(self._streams.values()):
            queue.put_nowait(FrameChunk(np.zeros((0, self._num_vq), np.int64), finished=True,
                                        finish_reason="aborted"))
        self._streams.clear()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def _deliver(self, events: Events) -> None:
        for rid, chunk in events:
            queue = self._streams.get(rid)
            if queue is not None:
                queue.put_nowait(chunk)

    # -- the worker thread ---------------------------------------------------------------

    def start_worker(self, target: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    def stop_worker(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def wait_for_work(self, busy: Callable[[], bool]) -> bool:
        """Under ``cond``: sleep until something waits, an abort came, ``busy()`` or a stop; False on a stop."""
        while not self.stopping and not self.waiting and not self.aborted and not busy():
            self.cond.wait()
        return not self.stopping

    def take_aborted(self) -> set[str]:
        """Under ``cond``: the request ids aborted since the last call; aborted requests still waiting are dropped."""
        aborted, self.aborted = self.aborted, set()
        if aborted:
            self.waiting = collections.deque(s for s in self.waiting if self._request_id(s) not in aborted)
        return aborted

    def emit(self, events: Events) -> bool:
        """Hand a batch of chunks to their streams (worker thread); False once nobody can listen."""
        if self.outlet is not None:
            return self.outlet(events)
        return self.call_on_loop(self._deliver, events)

    def call_on_loop(self, fn: Callable[..., None], *args) -> bool:
        """Run ``fn(*args)`` on the event loop (from the worker thread); False when there is none (any more)."""
        if self._loop is None:
            return False
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is gone
            return False
        return True
