"""Discrete-event simulation of a fleet of ChatTTS serving replicas behind a Service.

Model (every number is a parameter of ``FleetModel``; the defaults and their sources are
in ``calibration()``):
- A replica runs at most ``slots`` requests at once (the engine's maxNumSeqs). A request
  needs ``frames`` decode steps; every running request gets one frame per engine step,
  and a step lasts ``step_seconds(batch) * pipeline_factor`` for the replica's current
  batch (interpolated from the measured step time per batch size), so a request slows
  down when others join its replica and speeds up when they leave.
- A request that finds a free slot starts at the next step boundary (a uniform fraction
  of one step); otherwise it queues FIFO on that replica until a slot frees.
  scheduler_deadline_wait = start - arrival, as the runtime defines it.
- The Service routes each request to a uniformly random Ready replica (kube-proxy).
- A new replica serves ``cold_start_seconds`` after it is created; a removed one gets no
  new requests and finishes what it holds (graceful termination).
- Every ``sync_seconds`` the autoscaler sees a sample built as the runtime's /metrics
  would give it: the wait quantile over the last ``window_seconds`` of starts, and the
  running/waiting gauges summed over Ready replicas.
"""
from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from chattts_operator.autoscaling import FleetSample


@dataclass(frozen=True)
class FleetModel:
    slots: int = 16
    # (batch size, seconds per decode step)
    step_table: tuple[tuple[int, float], ...] = ((1, 0.00232), (16, 0.00252), (64, 0.00283), (256, 0.00388))
    pipeline_factor: float = 1.5
    cold_start_seconds: float = 90.0
    sync_seconds: float = 15.0
    window_seconds: float = 60.0
    quantile: float = 0.99

    def step_seconds(self, batch: int) -> float:
        table = self.step_table
        sizes = [b for b, _ in table]
        if batch <= sizes[0]:
            return table[0][1]
        if batch >= sizes[-1]:
            return table[-1][1]
        i = bisect.bisect_right(sizes, batch)
        (b0, t0), (b1, t1) = table[i - 1], table[i]
        return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)


class Autoscaler(Protocol):
    name: str

    def evaluate(self, now: float, current_replicas: int, sample: FleetSample) -> int: ...


@dataclass
class _Replica:
    ready_at: float
    removed: bool = False
    running: int = 0
    queue: deque = field(default_factory=deque)
    # Every running request advances one frame per engine step, and a step's duration
    # depends on the batch: ``frames_done`` counts the frames every running request has
    # received since the replica started; a request ends when it reaches its own mark.
    frames_done: float = 0.0
    updated_at: float = 0.0
    marks: list = field(default_factory=list)  # heap of (frames_done at its end, request)
    version: int = 0  # completion events of older versions are stale


@dataclass
class RunResult:
    name: str
    waits: np.ndarray  # per request, seconds, in arrival order
    timeline: list[tuple[float, int, int, float]]  # (time, replicas, ready, window wait quantile)
    changes: list[tuple[float, int]]  # (time, change)
    replica_seconds: float


def simulate(
    model: FleetModel,
    arrivals: np.ndarray,
    frames: np.ndarray,
    autoscaler: Autoscaler,
    initial_replicas: int,
    duration: float,
    seed: int,
) -> RunResult:
    rng = np.random.default_rng(seed)
    n = len(arrivals)
    route_draw = rng.random(n)
    phase_draw = rng.random(n)
    waits = np.full(n, np.nan)

    replicas: list[_Replica] = [_Replica(ready_at=0.0) for _ in range(initial_replicas)]
    routable: list[int] = list(range(initial_replicas))
    events: list[tuple[float, int, int, int]] = []  # (time, kind, replica, version); kind 0 = completion, 1 = ready
    started: deque = deque()  # (start time, wait) in time order, for the window quantile
    timeline: list[tuple[float, int, int, float]] = []
    changes: list[tuple[float, int]] = []
    step = model.step_seconds
    factor = model.pipeline_factor
    slots = model.slots

    def advance(rep: _Replica, now: float) -> None:
        if rep.running:
            rep.frames_done += (now - rep.updated_at) / (step(rep.running) * factor)
        rep.updated_at = now

    def reschedule(rid: int, now: float) -> None:
        rep = replicas[rid]
        rep.version += 1
        if rep.marks:
            left = max(rep.marks[0][0] - rep.frames_done, 0.0)
            heapq.heappush(events, (now + left * step(rep.running) * factor, 0, rid, rep.version))

    def start(rid: int, req: int, now: float) -> None:
        rep = replicas[rid]
        advance(rep, now)
        rep.running += 1
        step_now = step(rep.running)
        # It joins at the next step boundary: that part of a step is part of its wait.
        begin = now + phase_draw[req] * step_now
        wait = begin - arrivals[req]
        waits[req] = wait
        started.append((begin, wait))
        heapq.heappush(rep.marks, (rep.frames_done + frames[req], req))

    def handle(time: float, kind: int, rid: int, version: int) -> None:
        rep = replicas[rid]
        if kind == 1:
            if not rep.removed:
                routable.append(rid)
            while rep.queue and rep.running < slots:  # requests that waited for a first replica
                start(rid, rep.queue.popleft(), time)
            reschedule(rid, time)
            return
        if version != rep.version:
            return  # the batch changed since this completion was planned
        advance(rep, time)
        while rep.marks and rep.marks[0][0] <= rep.frames_done + 1e-6:
            heapq.heappop(rep.marks)
            rep.running -= 1
        while rep.queue and rep.running < slots:
            start(rid, rep.queue.popleft(), time)
        reschedule(rid, time)

    def sample(now: float) -> FleetSample:
        while started and started[0][0] < now - model.window_seconds:
            started.popleft()
        window_waits = [w for t, w in started if t <= now]
        quantile = float(np.quantile(window_waits, model.quantile)) if window_waits else 0.0
        ready = [replicas[r] for r in routable]
        return FleetSample(
            time=now,
            wait_quantile=quantile,
            observed_requests=float(len(window_waits)),
            ready_replicas=len(ready),
            requests_running=float(sum(r.running for r in ready)),
            requests_waiting=float(sum(len(r.queue) for r in ready)),
            slots_per_replica=float(slots),
        )

    def scale(now: float, desired: int) -> None:
        current = [i for i, r in enumerate(replicas) if not r.removed]
        if desired > len(current):
            for _ in range(desired - len(current)):
                replicas.append(_Replica(ready_at=now + model.cold_start_seconds))
                heapq.heappush(events, (now + model.cold_start_seconds, 1, len(replicas) - 1, 0))
        elif desired < len(current):
            # Like a ReplicaSet: not-yet-ready pods go first, then the newest.
            victims = sorted(current, key=lambda i: (replicas[i].ready_at <= now, -i))[: len(current) - desired]
            for i in victims:
                replicas[i].removed = True
                if i in routable:
                    routable.remove(i)
        if desired != len(current):
            changes.append((now, desired - len(current)))

    next_sync = model.sync_seconds
    replica_seconds = 0.0
    last_time = 0.0
    req = 0
    while True:
        next_arrival = arrivals[req] if req < n else math.inf
        next_event = events[0][0] if events else math.inf
        now = min(next_arrival, next_event, next_sync)
        if now > duration:
            break
        if now == next_event:  # completions and readiness first: a sync at the same instant sees them
            time, kind, rid, version = heapq.heappop(events)
            handle(time, kind, rid, version)
        elif now == next_sync:
            current = sum(1 for r in replicas if not r.removed)
            replica_seconds += current * (now - last_time)
            last_time = now
            s = sample(now)
            timeline.append((now, current, s.ready_replicas, s.wait_quantile))
            desired = autoscaler.evaluate(now, current, s)
            scale(now, desired)
            next_sync += model.sync_seconds
        else:
            if routable:
                rid = routable[int(route_draw[req] * len(routable))]
                rep = replicas[rid]
                if rep.running < slots:
                    start(rid, req, now)
                    reschedule(rid, now)
                else:
                    rep.queue.append(req)
            else:
                # No Ready replica: the request waits at the Service until one is. Modelled
                # as queued on the first replica that will become ready.
                pending = [i for i, r in enumerate(replicas) if not r.removed]
                if pending:
                    replicas[min(pending, key=lambda i: replicas[i].ready_at)].queue.append(req)
            req += 1
    current = sum(1 for r in replicas if not r.removed)
    replica_seconds += current * (duration - last_time)
    # Requests never started: they waited until the end at least.
    unstarted = np.isnan(waits)
    waits[unstarted] = duration - arrivals[unstarted]
    return RunResult(autoscaler.name, waits, timeline, changes, replica_seconds)


def minute_quantiles(arrivals: np.ndarray, waits: np.ndarray, duration: float, quantile: float) -> np.ndarray:
    """The wait quantile of the requests that arrived in each minute (NaN for empty minutes)."""
    minutes = int(math.ceil(duration / 60.0))
    index = np.minimum((arrivals // 60).astype(int), minutes - 1)
    order = np.argsort(index, kind="stable")
    sorted_index = index[order]
    bounds = np.searchsorted(sorted_index, np.arange(minutes + 1))
    out = np.full(minutes, np.nan)
    sorted_waits = waits[order]
    for m in range(minutes):
        chunk = sorted_waits[bounds[m] : bounds[m + 1]]
        if len(chunk):
            out[m] = np.quantile(chunk, quantile)
    return out


def reversals(changes: list[tuple[float, int]]) -> int:
    """How often the scaling direction flipped (up then down, or down then up)."""
    signs = [1 if c > 0 else -1 for _, c in changes if c != 0]
    return sum(1 for a, b in zip(signs, signs[1:]) if a != b)


def flaps(changes: list[tuple[float, int]], within: float = 600.0) -> int:
    """Reversals that came less than ``within`` seconds after the change they undo."""
    moves = [(t, 1 if c > 0 else -1) for t, c in changes if c != 0]
    return sum(1 for (t0, a), (t1, b) in zip(moves, moves[1:]) if a != b and t1 - t0 < within)


MakeAutoscaler = Callable[[], Autoscaler]
