"""Prometheus metrics of the serving runtime (one registry per server).

| metric | type | meaning |
|---|---|---|
| ``vllm:scheduler_deadline_wait_seconds`` | histogram | the time a response waited in queues before the engine runs its first audio: its first piece's wait from submission to prefill, plus its waits in the stages before (refine-text's queue, upstream's first-piece voice pass's admission), once per response, observed when the first piece is scheduled. The stages' own work (refine's tokens, the voice pass's generation) is not a wait: it is in time to first audio and ``chattts_first_audio_stage_seconds``. Observed live, at scheduling time, so it rises as soon as a queue builds (unlike vLLM's ``request_queue_time``, recorded at completion). The autoscaler's signal. |
| ``chattts_requests_waiting`` | gauge | requests accepted but not yet scheduled by the engine, and speech requests in refine-text |
| ``chattts_requests_running`` | gauge | requests the engine is generating |
| ``chattts_batch_size`` | histogram | sequences per engine step (1 = no batching) |
| ``chattts_time_to_first_audio_seconds`` | histogram | request received -> first audio bytes ready (streaming) or whole response ready (non-streaming): refine-text and a long input's first-piece voice pass included |
| ``chattts_first_audio_stage_seconds{stage}`` | histogram | the parts of the way to the first audio: ``refine`` (refine-text of every piece, its queue included), ``voice`` (upstream's first-piece voice pass: generation, decode and encode; its parts ``voice_wait`` for a slot, ``voice_generate``, ``voice_encode``), ``refine_wait`` (refine-text's queue, inside ``refine``), ``first_window`` (the first piece's submission -> its first audio), ``queue`` (the first piece's wait for a slot, inside ``first_window``); ``voice_sample`` (stream mode: the sample made after the first piece, not on the first audio's path) |
| ``chattts_real_time_factor`` | histogram | per request: wall time from arrival to last audio / audio duration (< 1 is faster than real time) |
| ``chattts_audio_seconds_total`` | counter | seconds of audio produced |
| ``chattts_requests_total{status}`` | counter | finished requests by outcome (``ok``, ``client_error``, ``rejected``, ``aborted``, ``error``) |
| ``chattts_engine_steps_total`` | counter | generation steps run by the engine |
| ``chattts_http_refused_total{reason}`` | counter | connections and requests the connection layer refused before the app (``connections.py``): ``header_too_large`` (431), ``header_timeout`` (408), ``idle_timeout`` (a connection that sent no request, closed), ``send_timeout`` (a stalled reader's stream aborted), ``connection_limit`` (503), ``http_version`` (505), ``host``, ``authorization`` and ``bad_request`` (400: framing) |
| ``chattts_event_loop_lag_seconds`` | histogram | how late the speech server's event loop runs a timer (sampled every 20 ms): what a blocked loop costs every client |
"""
from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from chattts_runtime import metric_names as names
from chattts_runtime.engines.base import SynthesisRequest

_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LAG_SAMPLE_SECONDS = 0.02
_RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0, 8.0)


class RuntimeMetrics:
    """Also the engine's ``SchedulerObserver`` (``on_scheduled``, ``on_step``)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.deadline_wait = Histogram(
            names.SCHEDULER_DEADLINE_WAIT,
            "Time from request arrival until the engine first runs it.", buckets=_WAIT_BUCKETS, registry=r)
        self.waiting = Gauge(names.REQUESTS_WAITING, "Requests waiting to be scheduled.", registry=r)
        self.running = Gauge(names.REQUESTS_RUNNING, "Requests being generated.", registry=r)
        self.batch_size = Histogram(names.BATCH_SIZE, "Sequences per engine step.",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.ttfa = Histogram(names.TIME_TO_FIRST_AUDIO,
                              "Arrival to first audio bytes ready.", buckets=_WAIT_BUCKETS, registry=r)
        self.first_audio_stage = Histogram(
            names.FIRST_AUDIO_STAGE, "Seconds of each stage on a response's way to its first audio.",
            ["stage"], buckets=_WAIT_BUCKETS, registry=r)
        self.rtf = Histogram(names.REAL_TIME_FACTOR, "Synthesis wall time / audio duration, per request.",
                             buckets=_RTF_BUCKETS, registry=r)
        self.audio_seconds = Counter(names.AUDIO_SECONDS, "Seconds of audio produced.", registry=r)
        self.requests = Counter(names.REQUESTS, "Finished requests by outcome.", ["status"], registry=r)
        self.steps = Counter(names.ENGINE_STEPS, "Generation steps run by the engine.", registry=r)
        self.http_refused = Counter(names.HTTP_REFUSED, "Connections and requests refused before the app, "
                                    "by reason.", ["reason"], registry=r)
        self.loop_lag = Histogram(names.EVENT_LOOP_LAG, "How late the event loop runs a timer.",
                                  buckets=_LAG_BUCKETS, registry=r)
        self.upstream_data_missing = Gauge(
            names.UPSTREAM_DATA_MISSING, "1 when start-up did not find this upstream data the config asks for "
            "(homophones, speaker_stats, normalizer_zh, normalizer_en), else 0.", ["item"], registry=r)

    async def watch_loop_lag(self, interval: float = LAG_SAMPLE_SECONDS) -> None:
        """Runs until cancelled: each sleep's overshoot is time the loop could not serve anyone."""
        while True:
            start = time.monotonic()
            await asyncio.sleep(interval)
            self.loop_lag.observe(max(0.0, time.monotonic() - start - interval))

    def on_scheduled(self, request: SynthesisRequest, wait_seconds: float) -> None:
        if request.counts_wait:  # with the response's waits in the stages before (refine-text, a voice pass)
            self.deadline_wait.observe(max(0.0, wait_seconds) + request.waited_before)
        request.scheduled_after = max(0.0, wait_seconds)

    def on_step(self, batch_size: int) -> None:
        self.batch_size.observe(batch_size)
        self.steps.inc()

    def bind_engine(self, engine, waiting_before=lambda: 0) -> None:
        """Gauges read the engine's queue at scrape time; ``waiting_before()``: requests waiting in the
        stages before the engine's queue (refine-text where it runs outside the engine's)."""
        self.waiting.set_function(lambda: engine.num_waiting + waiting_before())
        self.running.set_function(lambda: engine.num_running)


def outcome_of_status(status: int) -> str:
    """``chattts_requests_total`` status of a request answered with an error status."""
    if status in (429, 503):
        return "rejected"  # at capacity, loading, draining: the server declined the work
    if 400 <= status < 500:
        return "client_error"
    return "error"
