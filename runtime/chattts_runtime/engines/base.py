"""The engine interface: submit a synthesis request, stream audio-code frames out.

An engine turns a prompt (token ids + optional speaker vector) into ChatTTS frames
(4 codes each, plus the GPT hidden state when asked) and streams them as they are
produced. The speech API owns text handling, decoding to audio and HTTP; an engine
owns scheduling and generation. Two implementations: ``reference`` (PyTorch, this
package) and ``vllm`` (``engines/vllm*``).

Contract every engine keeps:

* ``submit()`` is non-blocking and raises :class:`QueueFull` when ``max_waiting``
  requests already wait; otherwise it returns an async iterator of :class:`FrameChunk`.
  The last chunk has ``finished=True`` and a ``finish_reason``.
* The engine calls ``observer.on_scheduled(request, wait_seconds)`` exactly once per
  request, when it first runs it: ``wait_seconds`` is the *scheduler deadline wait*
  (arrival -> first engine step that includes the request), exported as
  ``vllm:scheduler_deadline_wait_seconds``. It calls ``observer.on_step(batch_size)``
  after each generation step.
* ``num_waiting`` / ``num_running`` are cheap to read from the event loop.
* Greedy (``temperature == 0``) output of one request does not depend on what else is
  batched with it (tests compare codes token for token).
"""
from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Protocol

import numpy as np

from chattts_runtime.engines.schedule import Stage
from chattts_runtime.model.sampling import SamplingParams


class EngineError(RuntimeError):
    pass


class QueueFull(EngineError):
    """Too many requests are waiting; the caller should retry after ``retry_after`` seconds."""

    def __init__(self, waiting: int, retry_after: float = 1.0):
        super().__init__(f"{waiting} requests are already waiting")
        self.retry_after = retry_after


class EngineStopped(EngineError):
    pass


@dataclass
class SynthesisRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    speaker: np.ndarray | None  # float32 [hidden]; None = no speaker conditioning
    params: SamplingParams = field(default_factory=SamplingParams)
    arrival: float = field(default_factory=time.monotonic)
    want_hidden: bool = False  # stream GPT hidden states too (decoder audio path)
    # Stream decoded audio (``FrameChunk.audio``) instead of leaving decoding to the caller. Only
    # engines with ``decodes_audio = True`` honour it; the speech API asks only those.
    want_audio: bool = False
    # Audio codes ``[T, num_vq]`` after the text prompt (a voice from a reference clip, upstream's
    # ``spk_smp``, or a long input's first piece): embedded as generated frames are; every engine.
    prompt_codes: np.ndarray | None = None
    # What this request is to its response (engines.schedule): a first piece, a first-piece voice pass
    # or a later piece; first-audio work is admitted ahead of later pieces of playing responses.
    stage: Stage = Stage.FIRST
    # Set by the speech API's observer when the engine first runs the request: seconds it waited.
    scheduled_after: float | None = None
    # Its wait counts in scheduler_deadline_wait (false: upstream's voice pass, whose wait is added to the
    # first piece's), plus ``waited_before``: the response's queue waits in the stages before it
    # (refine-text, the voice pass), so the metric sees every queue a response waits in, once.
    counts_wait: bool = True
    waited_before: float = 0.0

    @property
    def prompt_length(self) -> int:
        return len(self.prompt_ids) + (0 if self.prompt_codes is None else len(self.prompt_codes))


@dataclass
class FrameChunk:
    codes: np.ndarray  # int64 [n, num_vq]; n may be 0 on the final chunk
    hidden: np.ndarray | None = None  # float32 [n, hidden] when requested
    finished: bool = False
    finish_reason: str | None = None  # "eos" | "length" | "aborted" | "error"
    error: str | None = None
    audio: np.ndarray | None = None  # float32 samples not sent before, for ``want_audio`` requests
    # The last chunk of one piece of a longer response (``longform.chain_pieces``): the next piece's
    # audio is decoded on its own, as upstream decodes every piece of a split text.
    piece_end: bool = False


class SchedulerObserver(Protocol):
    def on_scheduled(self, request: SynthesisRequest, wait_seconds: float) -> None: ...

    def on_step(self, batch_size: int) -> None: ...


class NullObserver:
    def on_scheduled(self, request: SynthesisRequest, wait_seconds: float) -> None:
        pass

    def on_step(self, batch_size: int) -> None:
        pass


async def stream_chunks(queue, abandon: Callable[[], None], close: Callable[[], None]) -> AsyncIterator[FrameChunk]:
    """A request's chunks from ``queue`` up to the finished one.

    ``abandon()`` runs when the consumer stops before that (the client went away: the engine
    should drop the request); ``close()`` runs in every case (forget the queue).
    """
    finished = False
    try:
        while not finished:
            chunk = await queue.get()
            finished = chunk.finished
            yield chunk
    finally:
        if not finished:
            abandon()
        close()


class TextJobs:
    """Refine-text jobs awaited on the event loop and settled from an engine's worker (thread or process).

    An engine with ``refines_text`` runs upstream's refine pass itself, batched with other
    requests' (``Engine.refine_text``): the result is the generated text-token ids.
    """

    def __init__(self):
        self._futures: dict[str, asyncio.Future] = {}
        self._on_wait: dict[str, Callable[[float], None]] = {}

    async def run(self, job_id: str, enqueue: Callable[[], None], abandon: Callable[[], None],
                  on_wait: Callable[[float], None] | None = None) -> list[int]:
        """``enqueue()`` the job (it raises what refuses it), then wait for :meth:`settle`; ``on_wait`` is
        told the seconds the job waited for a slot."""
        if job_id in self._futures:
            raise EngineError(f"duplicate request id {job_id}")
        future = asyncio.get_running_loop().create_future()
        self._futures[job_id] = future
        if on_wait is not None:
            self._on_wait[job_id] = on_wait
        try:
            enqueue()
            return await future
        finally:
            # The caller went away (a cancelled await cancels the future too): the engine drops the job.
            if not future.done() or future.cancelled():
                abandon()
            self._futures.pop(job_id, None)
            self._on_wait.pop(job_id, None)

    def settle(self, job_id: str, tokens: list[int] | None, error: str | None, wait: float | None = None) -> None:
        """On the event loop: the job's tokens, or the error that ended it; ``wait``: its seconds in the queue."""
        on_wait = self._on_wait.pop(job_id, None)
        if on_wait is not None and wait is not None and error is None:
            on_wait(wait)
        future = self._futures.pop(job_id, None)
        if future is None or future.done():
            return
        if error is not None:
            future.set_exception(EngineError(f"refine-text failed: {error}"))
        else:
            future.set_result(list(tokens))

    def fail_all(self, error: str) -> None:
        for job_id in list(self._futures):
            self.settle(job_id, None, error)


class Engine(abc.ABC):
    """Base class: see the module docstring for the contract."""

    name: str = "engine"
    decodes_audio: bool = False  # honours SynthesisRequest.want_audio (see there)
    refines_text: bool = False  # has refine_text (runs refine-text batched with other requests)

    async def refine_text(self, job_id: str, prompt_ids: tuple[int, ...], params: SamplingParams,
                          on_wait: Callable[[float], None] | None = None) -> list[int]:
        """Refine-text's generated ids for one prompt (``engines.refine`` builds it and reads them);
        ``on_wait(seconds)``: how long it waited before the engine first ran it."""
        raise EngineError(f"the {self.name} engine does not run refine-text itself")

    @abc.abstractmethod
    async def start(self) -> None:
        """Load/warm up; returns when the engine can serve."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Abort what is still running and release resources."""

    @abc.abstractmethod
    def submit(self, request: SynthesisRequest) -> AsyncIterator[FrameChunk]:
        """Queue a request; raises QueueFull or EngineStopped at once."""

    @abc.abstractmethod
    def abort(self, request_id: str) -> None:
        """Drop a request (client went away); its iterator ends with finish_reason 'aborted'."""

    @property
    @abc.abstractmethod
    def num_waiting(self) -> int: ...

    @property
    @abc.abstractmethod
    def num_running(self) -> int: ...

    #: Sequences the engine runs at once (its slots); None where it has no fixed number.
    max_num_seqs: int | None = None

    def has_room(self) -> bool:
        """Whether a request submitted now would start at once: nobody waiting and a slot free (for an
        engine of no fixed size: nobody waiting). A hint read on the event loop, not a promise."""
        if self.num_waiting:
            return False
        return self.max_num_seqs is None or self.num_running < self.max_num_seqs

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name}
