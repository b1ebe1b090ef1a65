"""The operator's own Prometheus metrics, served on ``/metrics`` (settings.metrics_port)."""
from __future__ import annotations

import asyncio
import time
from typing import Iterable

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
SPEC_CHANGE_SECONDS = Histogram(
    "chattts_operator_spec_change_seconds",
    "From the watch event of a new or changed ChatTTSDeployment to its Deployment applied (or found current).",
    buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1, 2, 5, 10),
    registry=REGISTRY,
)
# The same span cut in three, so a slow change says where it waited: "queued" (the event to its
# reconcile holding the object's lock), "built" (the spec parsed and the desired state rebuilt),
# "applied" (the child applies: a request slot, then the API server).
SPEC_CHANGE_STAGE_SECONDS = Histogram(
    "chattts_operator_spec_change_stage_seconds",
    "The spec change's span by stage: queued (event to reconcile start), built (desired state), applied (applies).",
    ["stage"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
    registry=REGISTRY,
)
EVENT_LOOP_LAG_SECONDS = Histogram(
    "chattts_operator_event_loop_lag_seconds",
    "How late a timer of the operator's event loop fires (the wait of anything ready to run behind the work ahead of it).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
    registry=REGISTRY,
)
GC_PAUSE_SECONDS = Histogram(
    "chattts_operator_gc_pause_seconds",
    "How long one collection of Python's cyclic garbage collector stopped the operator, by generation "
    "(2: a full collection; core/heap.py keeps those short).",
    ["generation"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
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


# --- the autoscaler, per ChatTTSDeployment -------------------------------------------------
# Labels chattts_namespace / chattts_deployment: a plain "namespace" would collide with the
# label Prometheus gives the operator's own target (it would become exported_namespace).
_CTD = ["chattts_namespace", "chattts_deployment"]
AUTOSCALER_DESIRED = Gauge("chattts_autoscaler_desired_replicas", "Replicas the autoscaler last asked for.",
                           _CTD, registry=REGISTRY)
AUTOSCALER_CURRENT = Gauge("chattts_autoscaler_current_replicas", "spec.replicas when the autoscaler last looked.",
                           _CTD, registry=REGISTRY)
AUTOSCALER_SIZED = Gauge("chattts_autoscaler_sized_replicas",
                         "Replicas the load needs by the capacity signal, before guards and clamps.",
                         _CTD, registry=REGISTRY)
AUTOSCALER_SIGNAL = Gauge("chattts_autoscaler_wait_seconds",
                          "The fleet's scheduler_deadline_wait quantile the last decision read (absent when held).",
                          _CTD, registry=REGISTRY)
AUTOSCALER_TARGET = Gauge("chattts_autoscaler_target_wait_seconds", "The wait quantile's target.",
                          _CTD, registry=REGISTRY)
AUTOSCALER_FLOOR = Gauge("chattts_autoscaler_forecast_floor_replicas",
                         "The forecast's floor (0: no forecast yet or none above minReplicas).", _CTD, registry=REGISTRY)
AUTOSCALER_DECISIONS = Counter("chattts_autoscaler_decisions_total",
                               "Autoscaler decisions by reason (ScaleUp, ScaleDown, HoldStable, Hold*...) and limit.",
                               _CTD + ["reason", "limited_by"], registry=REGISTRY)

# --- share policies, per GPUSharePolicy ----------------------------------------------------
SHARE_WINDOW = Gauge("chattts_sharepolicy_window_info", "1 for the window in force (\"default\" between windows).",
                     ["policy", "window"], registry=REGISTRY)
SHARE_RATIO = Gauge("chattts_sharepolicy_share_ratio", "The pool's share per class (online, offline) in force, 0-1.",
                    ["policy", "class"], registry=REGISTRY)
SHARE_POOL = Gauge("chattts_sharepolicy_pool_mebibytes", "GPU memory of the policy's pool.", ["policy"],
                   registry=REGISTRY)
SHARE_USED = Gauge("chattts_sharepolicy_used_mebibytes", "GPU memory of the pool its members ask for, per class.",
                   ["policy", "class"], registry=REGISTRY)
SHARE_JOBS = Gauge("chattts_sharepolicy_offline_jobs", "Offline Jobs of the policy by state (Running, Suspended, Waiting, Finished).",
                   ["policy", "state"], registry=REGISTRY)
# A pass that writes nothing is the steady state: passes rising while status writes stay flat.
SHARE_PASSES = Counter("chattts_sharepolicy_passes_total", "Planning passes of the policy's loop (a pass on an invalid spec plans nothing).",
                       ["policy"], registry=REGISTRY)
SHARE_STATUS_WRITES = Counter("chattts_sharepolicy_status_writes_total",
                              "Status patches of the policy (a pass writes one only when status changed).",
                              ["policy"], registry=REGISTRY)


class AutoscalerMetrics:
    """Exports each decision; ``forget`` drops an object's series when it stops being autoscaled."""

    def observe(self, namespace: str, name: str, *, desired: int, current: int, sized: int | None,
                wait: float | None, target: float, floor: int | None, reason: str, limited_by: str) -> None:
        AUTOSCALER_DESIRED.labels(namespace, name).set(desired)
        AUTOSCALER_CURRENT.labels(namespace, name).set(current)
        AUTOSCALER_TARGET.labels(namespace, name).set(target)
        AUTOSCALER_FLOOR.labels(namespace, name).set(floor or 0)
        if sized is not None:
            AUTOSCALER_SIZED.labels(namespace, name).set(sized)
        if wait is not None:
            AUTOSCALER_SIGNAL.labels(namespace, name).set(wait)
        else:
            _remove(AUTOSCALER_SIGNAL, namespace, name)  # a held metric is unknown, not its last value
        AUTOSCALER_DECISIONS.labels(namespace, name, reason, limited_by or "none").inc()

    def forget(self, namespace: str, name: str) -> None:
        for gauge in (AUTOSCALER_DESIRED, AUTOSCALER_CURRENT, AUTOSCALER_SIZED, AUTOSCALER_SIGNAL,
                      AUTOSCALER_TARGET, AUTOSCALER_FLOOR):
            _remove(gauge, namespace, name)
        _remove_matching(AUTOSCALER_DECISIONS, (namespace, name))


class SharePolicyMetrics:
    """Exports a GPUSharePolicy's status (the dict the controller writes)."""

    def observe(self, policy: str, status: dict, job_states: Iterable[str], wrote_status: bool = False) -> None:
        """One pass: ``job_states``, the plan's state of every offline Job (status lists only the
        first members); ``wrote_status``, whether the pass patched the policy's status."""
        self._forget_gauges(policy)  # windows and job states come and go: no stale series
        SHARE_PASSES.labels(policy).inc()
        if wrote_status:
            SHARE_STATUS_WRITES.labels(policy).inc()
        SHARE_WINDOW.labels(policy, status.get("window") or "default").set(1)
        for klass, share in (status.get("shares") or {}).items():
            SHARE_RATIO.labels(policy, klass).set(share / 100.0)  # status says percent
        SHARE_POOL.labels(policy).set((status.get("pool") or {}).get("gpuMemoryMiB") or 0)
        used = status.get("used") or {}
        SHARE_USED.labels(policy, "online").set(used.get("onlineMiB") or 0)
        SHARE_USED.labels(policy, "offline").set(used.get("offlineMiB") or 0)
        states: dict[str, int] = {}
        for state in job_states:
            states[state or "Unknown"] = states.get(state or "Unknown", 0) + 1
        for state, count in states.items():
            SHARE_JOBS.labels(policy, state).set(count)

    def forget(self, policy: str) -> None:
        """The policy is gone: every series of it."""
        self._forget_gauges(policy)
        for counter in (SHARE_PASSES, SHARE_STATUS_WRITES):
            _remove(counter, policy)

    def _forget_gauges(self, policy: str) -> None:
        for metric in (SHARE_WINDOW, SHARE_RATIO, SHARE_POOL, SHARE_USED, SHARE_JOBS):
            _remove_matching(metric, (policy,))


def _remove(metric, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass  # never set


def _remove_matching(metric, prefix: tuple[str, ...]) -> None:
    """Remove every child whose first label values are ``prefix``."""
    for labels in list(metric._metrics):  # prometheus-client keeps children by label-value tuple
        if labels[: len(prefix)] == prefix:
            metric.remove(*labels)


AUTOSCALER = AutoscalerMetrics()
SHARE_POLICIES = SharePolicyMetrics()


LOOP_LAG_PERIOD_SECONDS = 0.1


async def watch_loop_lag(period: float = LOOP_LAG_PERIOD_SECONDS) -> None:
    """Forever: sleep ``period`` and record how much later than asked the loop woke us (a
    callback that is ready waits this long behind the callbacks ahead of it)."""
    while True:
        asked = time.monotonic() + period
        await asyncio.sleep(period)
        EVENT_LOOP_LAG_SECONDS.observe(max(0.0, time.monotonic() - asked))


def serve(port: int, addr: str = "0.0.0.0"):
    """Start the /metrics endpoint in a thread; returns (server, thread) so it can be shut down."""
    return start_http_server(port, addr=addr, registry=REGISTRY)
