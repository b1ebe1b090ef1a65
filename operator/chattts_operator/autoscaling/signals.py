"""Metric readers: each Ready pod's /metrics (type ``pods``) or a Prometheus server (type
``prometheus``), turned into a ``FleetSample`` for the decision.

Parsing and aggregation are pure (``parse_pod_metrics``, ``histogram_quantile``,
``fleet_sample``); only ``scrape`` and ``query_prometheus`` do I/O (aiohttp, which the
async Kubernetes client already depends on).

Metric names are the runtime's (``chattts_runtime.metrics``):
``vllm:scheduler_deadline_wait_seconds`` (histogram) and the queue gauges
``chattts_requests_running`` / ``chattts_requests_waiting``; vLLM's own
``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` are used when the
runtime's are absent. Series with several label sets (e.g. one per model) are summed.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

from chattts_runtime import metric_names as names

from chattts_operator.autoscaling.decision import FleetSample

WAIT_HISTOGRAM = names.SCHEDULER_DEADLINE_WAIT
# In order of preference: the runtime's own gauges, then vLLM's.
RUNNING_GAUGES = (names.REQUESTS_RUNNING, "vllm:num_requests_running")
WAITING_GAUGES = (names.REQUESTS_WAITING, "vllm:num_requests_waiting")
# Sequences per engine step, summed: the frames generated (the capacity signal's counter).
FRAMES_SUM = f"{names.BATCH_SIZE}_sum"


class MetricError(RuntimeError):
    """A metric source could not be read or made no sense; the message says why."""


@dataclass(frozen=True)
class PodScrape:
    """One pod's metrics at ``time``: cumulative wait buckets (upper bound -> count)."""

    time: float
    buckets: tuple[tuple[float, float], ...]
    count: float
    running: float | None
    waiting: float | None
    frames: float | None = None  # cumulative frames generated (chattts_batch_size_sum)


def parse_pod_metrics(text: str, time: float) -> PodScrape:
    """Parse a Prometheus text exposition; MetricError when the wait histogram is absent."""
    buckets: dict[float, float] = {}
    count = None
    frames = None
    gauges: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as err:  # noqa: BLE001 - the parser raises ValueError and others on bad input
        raise MetricError(f"unparsable metrics: {err}") from None
    for family in families:
        for s in family.samples:
            if s.name == WAIT_HISTOGRAM + "_bucket":
                bound = float(s.labels.get("le", "nan"))
                if not math.isnan(bound):
                    buckets[bound] = buckets.get(bound, 0.0) + s.value
            elif s.name == WAIT_HISTOGRAM + "_count":
                count = (count or 0.0) + s.value
            elif s.name == FRAMES_SUM:
                frames = (frames or 0.0) + s.value
            elif s.name in RUNNING_GAUGES or s.name in WAITING_GAUGES:
                gauges[s.name] = gauges.get(s.name, 0.0) + s.value
    if not buckets:
        raise MetricError(f"no {WAIT_HISTOGRAM} histogram in the metrics")
    if count is None:
        count = buckets.get(math.inf, max(buckets.values()))
    running = next((gauges[n] for n in RUNNING_GAUGES if n in gauges), None)
    waiting = next((gauges[n] for n in WAITING_GAUGES if n in gauges), None)
    return PodScrape(time, tuple(sorted(buckets.items())), count, running, waiting, frames)


def histogram_quantile(quantile: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over cumulative (upper bound, count) buckets:
    linear interpolation inside the bucket holding the rank; NaN with no observations;
    the highest finite bound when the rank falls in the +Inf bucket."""
    if not buckets:
        return math.nan
    ordered = sorted(buckets)
    total = ordered[-1][1]
    if total <= 0:
        return math.nan
    rank = quantile * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return ordered[-1][0] if not math.isinf(ordered[-1][0]) else lower_bound


def _bucket_delta(old: PodScrape, new: PodScrape) -> list[tuple[float, float]] | None:
    """New minus old observations per bucket; after a restart (counts went down) the new
    scrape counts from zero, as Prometheus's rate() assumes. None if the bounds changed."""
    old_map, new_map = dict(old.buckets), dict(new.buckets)
    if set(old_map) != set(new_map):
        return None
    if any(new_map[b] < old_map[b] for b in new_map):
        return list(new.buckets)
    return [(b, new_map[b] - old_map[b]) for b in sorted(new_map)]


def fleet_sample(
    history: Mapping[str, Sequence[PodScrape]],
    now: float,
    window: float,
    quantile: float,
    unreachable: int,
    slots_per_replica: float | None,
) -> FleetSample:
    """Aggregate per-pod scrape histories (oldest first, the newest taken ``now``) into a sample.

    A pod's window is from its oldest scrape no older than ``window`` to its newest. Pods
    with a single scrape add their gauges but no wait observations yet."""
    merged: dict[float, float] = {}
    have_window = False
    frames_rate: float | None = 0.0
    running = waiting = 0.0
    gauges_known = True
    for scrapes in history.values():
        if not scrapes:
            continue
        newest = scrapes[-1]
        if newest.running is None or newest.waiting is None:
            gauges_known = False
        else:
            running += newest.running
            waiting += newest.waiting
        base = next((s for s in scrapes if now - s.time <= window and s is not newest), None)
        if base is None:
            continue
        if frames_rate is not None and base.frames is not None and newest.frames is not None and newest.time > base.time:
            # A restart (the counter went down) counts from zero, as rate() does.
            served = newest.frames - base.frames if newest.frames >= base.frames else newest.frames
            frames_rate += served / (newest.time - base.time)
        else:
            frames_rate = None
        delta = _bucket_delta(base, newest)
        if delta is None:
            continue
        have_window = True
        for bound, count in delta:
            merged[bound] = merged.get(bound, 0.0) + count
    ready = sum(1 for scrapes in history.values() if scrapes)
    if not have_window:
        wait, observed = None, None
    else:
        buckets = sorted(merged.items())
        observed = buckets[-1][1] if buckets else 0.0
        wait = histogram_quantile(quantile, buckets) if observed > 0 else math.nan
    return FleetSample(
        time=now,
        wait_quantile=wait,
        observed_requests=observed,
        ready_replicas=ready,
        unreachable_replicas=unreachable,
        requests_running=running if gauges_known and ready else None,
        requests_waiting=waiting if gauges_known and ready else None,
        slots_per_replica=slots_per_replica,
        frames_per_second=frames_rate if have_window else None,
    )


async def scrape(session, url: str, timeout: float) -> str:
    """GET one metrics endpoint; MetricError on any failure."""
    import aiohttp  # noqa: PLC0415 - only the I/O path needs it

    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status != 200:
                raise MetricError(f"{url}: HTTP {response.status}")
            return await response.text()
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        raise MetricError(f"{url}: {type(err).__name__} {err}".strip()) from None


async def scrape_pods(session, urls: Mapping[str, str], timeout: float, now: float) -> tuple[dict[str, PodScrape], dict[str, str]]:
    """Scrape all pods concurrently: (pod -> scrape, pod -> error)."""
    names = list(urls)
    texts = await asyncio.gather(*(scrape(session, urls[n], timeout) for n in names), return_exceptions=True)
    scrapes: dict[str, PodScrape] = {}
    errors: dict[str, str] = {}
    for name, text in zip(names, texts):
        if isinstance(text, BaseException):
            errors[name] = str(text)
            continue
        try:
            scrapes[name] = parse_pod_metrics(text, now)
        except MetricError as err:
            errors[name] = str(err)
    return scrapes, errors


def parse_prometheus_response(payload: Mapping) -> tuple[float, float] | None:
    """(value, sample time) from an instant-query response; None when the result is empty;
    MetricError when it is an error or holds several series (the query must aggregate)."""
    if payload.get("status") != "success":
        raise MetricError(f"prometheus: {payload.get('errorType', 'error')}: {payload.get('error', payload)}")
    data = payload.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        pair = result
    elif kind == "vector":
        if not result:
            return None
        if len(result) > 1:
            raise MetricError(f"prometheus: the query returned {len(result)} series; it must return one")
        pair = result[0].get("value")
    else:
        raise MetricError(f"prometheus: unsupported result type {kind!r}")
    try:
        return float(pair[1]), float(pair[0])
    except (TypeError, ValueError, IndexError):
        raise MetricError(f"prometheus: malformed sample {pair!r}") from None


async def query_prometheus(session, base_url: str, query: str, timeout: float) -> tuple[float, float] | None:
    """Run an instant query through the HTTP API (``/api/v1/query``)."""
    import aiohttp  # noqa: PLC0415

    url = base_url.rstrip("/") + "/api/v1/query"
    try:
        async with session.get(url, params={"query": query}, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            payload = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as err:
        raise MetricError(f"prometheus {url}: {type(err).__name__} {err}".strip()) from None
    return parse_prometheus_response(payload)


def prune_history(history: dict[str, list[PodScrape]], live_pods: Iterable[str], now: float, keep: float) -> None:
    """Drop pods that are gone and scrapes older than ``keep`` seconds (in place)."""
    live = set(live_pods)
    for name in list(history):
        if name not in live:
            del history[name]
            continue
        history[name] = [s for s in history[name] if now - s.time <= keep]
