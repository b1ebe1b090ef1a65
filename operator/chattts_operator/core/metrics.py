"""The operator's own Prometheus metrics, served on ``/metrics`` (settings.metrics_port)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "chattts_operator_reconciles_total",
    "Reconciles of ChatTTSDeployments, by trigger and result (applied, noop, blocked, invalid, error).",
    ["trigger", "result"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "chattts_operator_reconcile_errors_total",
    "Reconciles that failed with an error (retried), by error class.",
    ["error"],
    registry=REGISTRY,
)
RECONCILE_DURATION = Histogram(
    "chattts_operator_reconcile_duration_seconds",
    "Time one reconcile took, reads and writes included.",
    ["trigger"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
CHILD_WRITES = Counter(
    "chattts_operator_child_writes_total",
    "Server-side applies of child objects, by kind.",
    ["kind"],
    registry=REGISTRY,
)
STATUS_WRITES = Counter(
    "chattts_operator_status_writes_total", "Status patches of ChatTTSDeployments.", registry=REGISTRY
)
MANAGED_OBJECTS = Gauge(
    "chattts_operator_managed_objects", "ChatTTSDeployments the operator currently manages.", registry=REGISTRY
)
BLOCKED_OBJECTS = Gauge(
    "chattts_operator_blocked_objects",
    "ChatTTSDeployments whose latest spec cannot start (GPUCapacity=False).",
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    "chattts_operator_api_requests_total",
    "Requests to the API server (watches not counted), by HTTP method and resource (e.g. GET configmaps).",
    ["method", "resource"],
    registry=REGISTRY,
)
CACHED_OBJECTS = Gauge(
    "chattts_operator_cached_objects",
    "Children and pods held by the watch-fed read cache (only what the operator manages).",
    registry=REGISTRY,
)
RESYNC_LAST_SUCCESS = Gauge(
    "chattts_operator_resync_last_success_timestamp_seconds",
    "When the periodic resync last completed a full pass.",
    registry=REGISTRY,
)


def serve(port: int, addr: str = "0.0.0.0"):
    """Start the /metrics endpoint in a thread; returns (server, thread) so it can be shut down."""
    return start_http_server(port, addr=addr, registry=REGISTRY)
