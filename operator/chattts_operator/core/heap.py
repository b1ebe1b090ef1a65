"""Python's cyclic garbage collector kept off the latency of changes.

The operator's heap is mostly parsed JSON: every cached child and pod, every ChatTTSDeployment
(ours and kopf's copies). A full collection walks all of it while nothing else runs: no watch
event is read, no request is sent. At 1,000 managed objects that is hundreds of thousands of
containers and a pause of hundreds of milliseconds on a busy core, and with watch events
replacing cached objects all the time Python starts one whenever a quarter of the heap is new
survivors: every few seconds during rollouts. Those pauses were the tail of a spec change's
reaction (bench/results/operator-scale-findings.md, fifth round).

What ``HeapCollector`` does, on CPython's generational collector:

- after each full collection it freezes the survivors (``gc.freeze``): they were just found
  live, and the next full collection walks only what was allocated since, so a pause is in
  proportion to the recent churn, not to the cache. Reference counting frees frozen objects as
  usual (a replaced cache entry goes at once: nearly all of our garbage is acyclic JSON);
- every ``thaw_seconds`` it unfreezes everything, so one full collection sees the whole heap
  again and frees any reference cycle that became garbage while frozen (an exception's
  traceback held by a finished task, say). One long pause per interval, not one every few
  seconds;
- it measures every collection's pause by generation (``chattts_operator_gc_pause_seconds``),
  freezing or not. Not the number of frozen objects: ``gc.get_freeze_count()`` walks the whole
  frozen list, ~50 ms at 1,000 managed objects, which is the very pause this avoids (measured:
  counting it every second raised the loop's mean lag from 2 ms to 7 ms).

The collector's callback only appends to a deque: it runs inside whatever allocation started
the collection, possibly while that code holds a metric's lock, so metrics are fed from the
event loop (``run``), never from the callback.
"""
from __future__ import annotations

import asyncio
import collections
import gc
import time
from typing import Any

from chattts_operator.core import metrics

FULL = 2  # the oldest generation: a collection of it walks every tracked (unfrozen) object
DRAIN_SECONDS = 1.0  # pauses reach the metrics this often


class HeapCollector:
    def __init__(self, freeze_survivors: bool, thaw_seconds: float) -> None:
        self.freeze_survivors = freeze_survivors
        self.thaw_seconds = thaw_seconds
        self.pauses: collections.deque[tuple[int, float]] = collections.deque(maxlen=10_000)
        self._started: float | None = None
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_collection)
            self._installed = True

    def uninstall(self) -> None:
        """Stop measuring and freezing; what is frozen is handed back to the collector."""
        if self._installed:
            gc.callbacks.remove(self._on_collection)
            self._installed = False
        if self.freeze_survivors:
            gc.unfreeze()

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is not None:
            self.pauses.append((info.get("generation", -1), time.perf_counter() - self._started))
            self._started = None
        if self.freeze_survivors and info.get("generation") == FULL:
            gc.freeze()  # what survived the whole heap's walk is live: keep it out of the next

    def drain(self) -> None:
        """Move the pauses measured so far into the metrics."""
        while self.pauses:
            generation, seconds = self.pauses.popleft()
            metrics.GC_PAUSE_SECONDS.labels(str(generation)).observe(seconds)

    async def run(self) -> None:
        """Forever: feed the metrics; thaw every ``thaw_seconds`` when freezing."""
        last_thaw = time.monotonic()
        while True:
            await asyncio.sleep(DRAIN_SECONDS)
            self.drain()
            if self.freeze_survivors and time.monotonic() - last_thaw >= self.thaw_seconds:
                gc.unfreeze()  # the next full collection (soon: the heap looks all new) sees everything
                last_thaw = time.monotonic()
