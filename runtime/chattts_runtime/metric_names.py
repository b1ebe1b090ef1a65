"""The runtime's metric names: the contract that the operator's autoscaler, the chart's dashboard and
the benchmarks read. Declared here once (no imports: the operator reads them without the runtime's
dependencies); ``metrics.py`` registers them, and ``tests/unit/test_metric_names.py`` fails when a
dashboard or query names a metric no registry declares."""
from __future__ import annotations

SCHEDULER_DEADLINE_WAIT = "vllm:scheduler_deadline_wait_seconds"  # vLLM's name: the fleet's scaling signal
REQUESTS_WAITING = "chattts_requests_waiting"
REQUESTS_RUNNING = "chattts_requests_running"
BATCH_SIZE = "chattts_batch_size"
TIME_TO_FIRST_AUDIO = "chattts_time_to_first_audio_seconds"
FIRST_AUDIO_STAGE = "chattts_first_audio_stage_seconds"
REAL_TIME_FACTOR = "chattts_real_time_factor"
AUDIO_SECONDS = "chattts_audio_seconds"
REQUESTS = "chattts_requests"
ENGINE_STEPS = "chattts_engine_steps"
HTTP_REFUSED = "chattts_http_refused"
EVENT_LOOP_LAG = "chattts_event_loop_lag_seconds"
UPSTREAM_DATA_MISSING = "chattts_upstream_data_missing"
