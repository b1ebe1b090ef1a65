"""kopf timer: autoscale ChatTTSDeployments whose ``spec.autoscaling.enabled`` is true.

Every ``CHATTTS_AUTOSCALER_INTERVAL_SECONDS`` (default 15, the HPA's sync period) per
object: read the metric (each Ready pod's /metrics, or a Prometheus query), decide with
the pure ``decide``, write ``spec.replicas`` through the scale subresource (field
manager ``chattts-autoscaler``, so ``kubectl get --show-managed-fields`` tells who set
it), and record the decision in ``status.autoscaling``. Nothing here blocks the loop:
the Kubernetes client is kubernetes_asyncio, the scrapes are aiohttp.

Per-object memory (kopf's ``memo``): the pods' recent scrapes and the recent fleet
samples. The decision history also lives in status, so a restart keeps its windows.

For tests and development only: with ``CHATTTS_AUTOSCALER_METRICS_URL_ANNOTATION=1`` a
pod annotation ``tts.chattts.io/metrics-url`` overrides the pod's metrics address (the
cluster tests map kwok pods to runtime processes on loopback this way). Off by default:
anyone who may annotate pods could otherwise point the operator at any URL.
"""
from __future__ import annotations

import os
import time
from typing import Any

import kopf

from chattts_operator.api.autoscaling import AutoscalingSpec, AutoscalingStatus, format_duration
from chattts_operator.api.chattts import GROUP, PLURAL, VERSION
from chattts_operator.api.sharepolicy import REPLICA_CAP_ANNOTATION
from chattts_operator.autoscaling import FleetSample, decide
from chattts_operator.autoscaling.metrics import (
    MetricError,
    fleet_sample,
    prune_history,
    query_prometheus,
    scrape_pods,
)
from chattts_operator.autoscaling.status import history_from_status, next_status, worth_writing
from chattts_operator.builders import selector_labels
from chattts_operator.kube import Kube, make_api_client, object_path

FIELD_MANAGER = "chattts-autoscaler"
METRICS_URL_ANNOTATION = "tts.chattts.io/metrics-url"
INTERVAL_SECONDS = float(os.environ.get("CHATTTS_AUTOSCALER_INTERVAL_SECONDS", "15"))
ALLOW_URL_ANNOTATION = os.environ.get("CHATTTS_AUTOSCALER_METRICS_URL_ANNOTATION", "") in ("1", "true", "yes")
if not INTERVAL_SECONDS > 0:
    raise ValueError(f"CHATTTS_AUTOSCALER_INTERVAL_SECONDS must be positive, got {INTERVAL_SECONDS}")

_kube: Kube | None = None
_http = None


async def _clients():
    global _kube, _http
    if _kube is None:
        _kube = Kube(await make_api_client())
    if _http is None or _http.closed:
        import aiohttp  # noqa: PLC0415

        _http = aiohttp.ClientSession()
    return _kube, _http


@kopf.on.cleanup()
async def _close_clients(**_: Any) -> None:
    global _kube, _http
    if _http is not None:
        await _http.close()
        _http = None
    if _kube is not None:
        await _kube.close()
        _kube = None


def _enabled(spec: dict, **_: Any) -> bool:
    return bool((spec.get("autoscaling") or {}).get("enabled"))


def _ready(pod: dict) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_metrics_urls(pods: list[dict], spec: AutoscalingSpec, allow_annotation: bool) -> dict[str, str]:
    """Ready pod name -> metrics URL (pod IP and the configured port/path)."""
    source = spec.metrics.pods
    urls = {}
    for pod in pods:
        if not _ready(pod):
            continue
        meta = pod["metadata"]
        override = (meta.get("annotations") or {}).get(METRICS_URL_ANNOTATION)
        if allow_annotation and override:
            urls[meta["name"]] = override
            continue
        ip = pod.get("status", {}).get("podIP")
        if ip:
            host = f"[{ip}]" if ":" in ip else ip
            urls[meta["name"]] = f"{source.scheme}://{host}:{source.port}{source.path}"
    return urls


def replica_cap(body: dict) -> int | None:
    text = (body.get("metadata", {}).get("annotations") or {}).get(REPLICA_CAP_ANNOTATION)
    try:
        return int(text) if text is not None and int(text) >= 0 else None
    except ValueError:
        return None


async def _read_pods_sample(kube: Kube, http, name: str, namespace: str, spec: AutoscalingSpec,
                            slots: float, memo: Any, now: float) -> FleetSample:
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(name).items())
    data = await kube._call("GET", f"/api/v1/namespaces/{namespace}/pods", query=[("labelSelector", selector)])
    urls = pod_metrics_urls(list(data.get("items") or []), spec, ALLOW_URL_ANNOTATION)
    scrapes, errors = await scrape_pods(http, urls, spec.metrics.pods.timeout_seconds, now)
    history: dict = memo.setdefault("autoscaler_scrapes", {})
    for pod, scrape in scrapes.items():
        history.setdefault(pod, []).append(scrape)
    prune_history(history, scrapes.keys(), now, keep=spec.window_seconds + 2 * INTERVAL_SECONDS)
    if errors:
        memo["autoscaler_scrape_errors"] = errors
    if not urls:
        return FleetSample(time=now, wait_quantile=None, ready_replicas=0)
    return fleet_sample(history, now, spec.window_seconds, spec.quantile, len(errors), slots)


async def _read_prometheus_sample(http, name: str, namespace: str, spec: AutoscalingSpec, now: float) -> FleetSample:
    source = spec.metrics.prometheus
    assert source is not None
    selector = f'pod=~"{name}-.*"'
    query = source.render_query(namespace=namespace, name=name, window=spec.window,
                                quantile=spec.quantile, selector=selector)
    result = await query_prometheus(http, source.url, query, source.timeout_seconds)
    if result is None:
        return FleetSample(time=now, wait_quantile=None)
    value, at = result
    return FleetSample(time=at, wait_quantile=value)


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL_SECONDS, when=_enabled, id="autoscaler")
async def autoscale(body: dict, spec: dict, name: str, namespace: str, memo: Any, logger, **_: Any) -> None:
    try:
        auto = AutoscalingSpec.model_validate(spec.get("autoscaling") or {})
    except ValueError as err:
        logger.warning(f"autoscaling spec invalid, not scaling: {err}")
        return
    kube, http = await _clients()
    now = time.time()
    current = int(spec.get("replicas", 1))
    slots = float((spec.get("engine") or {}).get("maxNumSeqs", 64))

    try:
        if auto.metrics.type == "prometheus":
            sample = await _read_prometheus_sample(http, name, namespace, auto, now)
        else:
            sample = await _read_pods_sample(kube, http, name, namespace, auto, slots, memo, now)
    except MetricError as err:
        logger.info(f"metric unavailable: {err}")
        sample = None

    horizon = max(auto.window_seconds, auto.staleness_seconds)
    samples = [s for s in memo.get("autoscaler_samples", []) if now - s.time <= horizon]
    if sample is not None and (sample.wait_quantile is not None or sample.observed_requests is not None):
        samples.append(sample)
    memo["autoscaler_samples"] = samples

    previous = AutoscalingStatus.model_validate((body.get("status") or {}).get("autoscaling") or {}) \
        if (body.get("status") or {}).get("autoscaling") else None
    history = memo.get("autoscaler_history") or history_from_status(previous)
    decision = decide(auto, current, samples, history, now, replica_cap(body))
    memo["autoscaler_history"] = decision.history

    scale_error = None
    if decision.desired_replicas != current:
        try:
            kube.writes += 1
            await kube._call(
                "PATCH", object_path("ChatTTSDeployment", namespace, name, "scale"),
                body={"spec": {"replicas": decision.desired_replicas}},
                query=[("fieldManager", FIELD_MANAGER)],
                content_type="application/merge-patch+json",
            )
        except Exception as err:  # an API error must not kill the timer; it is reported in status
            scale_error = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
            logger.warning(f"scale to {decision.desired_replicas} failed: {scale_error}")
        else:
            metric = format_duration(decision.metric_value) if decision.metric_value is not None else "n/a"
            kopf.info(body, reason="Scaled" if decision.desired_replicas > current else "ScaledDown",
                      message=f"{current} -> {decision.desired_replicas} replicas (wait {metric}): {decision.message}")

    new_status = next_status(previous, decision, current, now, scale_error=scale_error)
    if worth_writing(previous, new_status):
        await kube.patch_status("ChatTTSDeployment", namespace, name,
                                {"autoscaling": new_status.model_dump(by_alias=True, exclude_none=True)})
    return None  # kopf would store a return value in status
