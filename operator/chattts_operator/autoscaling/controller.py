"""The autoscaling controller: scale ChatTTSDeployments whose ``spec.autoscaling.enabled`` is true.

Every ``settings.autoscaler.interval_seconds`` (CHATTTS_AUTOSCALER_INTERVAL_SECONDS, default
15, the HPA's sync period), for each
autoscaled object: read the metric (each Ready pod's /metrics, or a Prometheus query),
decide with the pure ``decide``, write ``spec.replicas`` through the scale subresource
(field manager ``chattts-autoscaler``: ``kubectl get --show-managed-fields`` tells who set
it), record the decision in ``status.autoscaling``, and post an Event when replicas change.

Why a loop task fed by a watch-event handler and not ``@kopf.timer``: kopf puts a
finalizer on every object that has a timer, and this operator keeps none (a finalizer
would block deleting a ChatTTSDeployment whenever the operator is not running). The
event handler keeps the latest body of each autoscaled object, so a pass reads nothing
but pods and metrics. Nothing blocks the event loop: kubernetes_asyncio and aiohttp.

Per-object memory: the pods' recent scrapes and fleet samples. The decision history
also lives in status, so a restarted operator keeps its stabilization windows.

The pods' addresses and the HTTP session are core/podhttp.py's (shared with the deployment
controller's /health question): for tests and development only, with
``settings.autoscaler.metrics_url_annotation`` (CHATTTS_AUTOSCALER_METRICS_URL_ANNOTATION=1) a
pod annotation ``tts.chattts.io/metrics-url`` names the pod's address (the cluster tests map
kwok pods to runtime processes on loopback this way). Off by default: anyone who may annotate
pods could otherwise point the operator at any URL.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

from chattts_operator.api.autoscaling import AutoscalingSpec, AutoscalingStatus, format_duration
from chattts_operator.api.chattts import API_VERSION, KIND
from chattts_operator.api.sharepolicy import REPLICA_CAP_ANNOTATION
from chattts_operator.autoscaling.decision import Decision, FleetSample, History, decide
from chattts_operator.autoscaling.forecast import DemandHistory
from chattts_operator.autoscaling.signals import (
    MetricError,
    PodScrape,
    fleet_sample,
    prune_history,
    query_prometheus,
    scrape_pods,
)
from chattts_operator.autoscaling.status import history_from_status, next_status, status_patch, worth_writing
from chattts_operator.autoscaling.tuning import TuningDecision, tune_batch_tokens
from chattts_operator.core.kube import Kube, is_newer
from chattts_operator.core.metrics import AUTOSCALER
from chattts_operator.core.podhttp import PodHttp, pod_ready, pod_url
from chattts_operator.core.labels import AUTOSCALER_FIELD_MANAGER, METRICS_URL_ANNOTATION, selector_string
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.children import deployment_name
from chattts_operator.deployment.gpu import GpuAssignmentError, assign_gpu
from chattts_operator.deployment.memory import DEFAULT_MAX_NUM_BATCHED_TOKENS, plan_memory
from chattts_operator.deployment.spec import InvalidSpec, parse_spec

DEFAULT_MAX_NUM_SEQS = 64  # the engine's default (api.chattts.EngineSpec.max_num_seqs)
log = logging.getLogger("chattts_operator.autoscaler")


def autoscaling_enabled(body: dict) -> bool:
    return bool(((body.get("spec") or {}).get("autoscaling") or {}).get("enabled"))


def pod_metrics_urls(pods: list[dict], spec: AutoscalingSpec, allow_annotation: bool) -> dict[str, str]:
    """Ready pod name -> metrics URL (pod IP and the configured port/path)."""
    source = spec.metrics.pods
    urls = {}
    for pod in pods:
        if pod_ready(pod):
            url = pod_url(pod, source.path, scheme=source.scheme, port=source.port, allow_annotation=allow_annotation)
            if url:
                urls[pod["metadata"]["name"]] = url
    return urls


def replica_cap(body: dict) -> int | None:
    """The GPU share policy's current cap on this object's replicas (its annotation), if any."""
    text = (body.get("metadata", {}).get("annotations") or {}).get(REPLICA_CAP_ANNOTATION)
    try:
        return int(text) if text is not None and int(text) >= 0 else None
    except ValueError:
        return None


@dataclass
class _ObjectState:
    scrapes: dict[str, list[PodScrape]] = field(default_factory=dict)
    samples: list[FleetSample] = field(default_factory=list)
    history: History | None = None
    # Replicas the load needed per minute: the forecast floor's record (memory only).
    demand: DemandHistory = field(default_factory=DemandHistory)
    # What this process last wrote: a watch event may trail our own writes (the scale write's
    # event carries the status from before our status write), so it must not undo them.
    last_status: AutoscalingStatus | None = None
    last_errors: dict[str, str] = field(default_factory=dict)


# Called with the object as the autoscaler wrote it (its tuned value in status): roll it out now.
SpecTuned = Callable[[dict], Awaitable[None]]


class Autoscaler:
    """Holds the autoscaled objects seen by the watch and evaluates them every interval."""

    def __init__(self, kube: Kube, settings: OperatorSettings, on_tuned: SpecTuned | None = None,
                 http: PodHttp | None = None) -> None:
        self.kube = kube
        self.settings = settings
        # Rolls out a tuned engine setting at once rather than at the deployment controller's next
        # resync (app.py hands it in); None when no deployment controller runs.
        self.on_tuned = on_tuned
        self.interval = settings.autoscaler.interval_seconds
        self.allow_url_annotation = settings.autoscaler.metrics_url_annotation
        self.bodies: dict[tuple[str, str], dict] = {}
        self.states: dict[str, _ObjectState] = {}
        self.last_pass: float | None = None
        self._limit = asyncio.Semaphore(settings.autoscaler.concurrency)
        # The app's client of the pods (shared with the deployment controller), else one of its own.
        self._own_http = http is None
        self.http = http or PodHttp(self.allow_url_annotation)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.run_forever(), name="chattts-autoscaler")
        if self.allow_url_annotation:
            log.warning("the %s pod annotation is honoured: for tests only", METRICS_URL_ANNOTATION)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.close()

    def probe(self) -> float | None:
        """Seconds since the last pass; raises when the loop died or is far behind."""
        if self._task is not None and self._task.done():
            raise RuntimeError("the autoscaler loop has stopped")
        if self.last_pass is None:
            return None
        age = time.time() - self.last_pass
        if age > 3 * self.interval + 60:
            raise RuntimeError(f"no autoscaler pass for {age:.0f}s")
        return round(age, 1)

    def observe(self, body: dict, deleted: bool) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if deleted or not autoscaling_enabled(body) or meta.get("deletionTimestamp"):
            if self.bodies.pop(key, None) is not None:
                AUTOSCALER.forget(*key)
            self.states.pop(meta.get("uid", ""), None)
        elif is_newer(body, self.bodies.get(key)):
            self.bodies[key] = body

    async def close(self) -> None:
        """The metrics HTTP session, when it is this autoscaler's own (the app closes a shared one)."""
        if self._own_http:
            await self.http.close()

    async def run_forever(self) -> None:
        while True:
            started = time.monotonic()
            await self.run_once()
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def run_once(self) -> None:
        bodies = list(self.bodies.values())
        await asyncio.gather(*(self._evaluate_guarded(b) for b in bodies))
        self.last_pass = time.time()

    async def _evaluate_guarded(self, body: dict) -> None:
        async with self._limit:
            try:
                await self.evaluate(body)
            except asyncio.CancelledError:
                raise
            except Exception:  # one object's failure must not stop the others or the loop
                meta = body.get("metadata", {})
                log.exception("autoscaling %s/%s failed", meta.get("namespace"), meta.get("name"))

    async def _pods_sample(self, state: _ObjectState, name: str, namespace: str, spec: AutoscalingSpec,
                           slots: float, now: float) -> FleetSample | None:
        pods = await self.kube.list("Pod", namespace, selector_string(name))
        urls = pod_metrics_urls(pods, spec, self.allow_url_annotation)
        scrapes, errors = await scrape_pods(await self.http.session(), urls, spec.metrics.pods.timeout_seconds, now)
        for pod, scrape in scrapes.items():
            state.scrapes.setdefault(pod, []).append(scrape)
        prune_history(state.scrapes, scrapes.keys(), now, keep=spec.window_seconds + 2 * self.interval)
        if errors != state.last_errors and errors:
            log.info("%s/%s: pods whose metrics could not be read: %s", namespace, name, errors)
        state.last_errors = errors
        if not urls:
            return None
        return fleet_sample(state.scrapes, now, spec.window_seconds, spec.quantile, len(errors), slots)

    async def _prometheus_sample(self, name: str, namespace: str, spec: AutoscalingSpec, now: float) -> FleetSample | None:
        source = spec.metrics.prometheus
        assert source is not None
        # Pods of the Deployment <deployment>-<replicaset hash>-<pod suffix>, as Prometheus's
        # Kubernetes discovery labels them.
        selector = f'pod=~"{deployment_name(name)}-[a-z0-9]+-[a-z0-9]+"'
        query = source.render_query(namespace=namespace, name=name, window=spec.window,
                                    quantile=spec.quantile, selector=selector)
        result = await query_prometheus(await self.http.session(), source.url, query, source.timeout_seconds)
        if result is None:
            return None
        value, at = result
        return FleetSample(time=at, wait_quantile=value)

    async def evaluate(self, body: dict, now: float | None = None) -> Decision | None:
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
        spec_body = body.get("spec") or {}
        try:
            auto = AutoscalingSpec.model_validate(spec_body.get("autoscaling") or {})
        except ValueError as err:
            log.warning("%s/%s: autoscaling spec invalid, not scaling: %s", namespace, name, err)
            return None
        now = time.time() if now is None else now
        state = self.states.setdefault(uid, _ObjectState())
        current = int(spec_body.get("replicas", 1))
        slots = float((spec_body.get("engine") or {}).get("maxNumSeqs", DEFAULT_MAX_NUM_SEQS))

        sample = None
        try:
            if auto.metrics.type == "prometheus":
                sample = await self._prometheus_sample(name, namespace, auto, now)
            else:
                sample = await self._pods_sample(state, name, namespace, auto, slots, now)
        except MetricError as err:
            log.info("%s/%s: metric unavailable: %s", namespace, name, err)
        horizon = max(auto.window_seconds, auto.staleness_seconds)
        state.samples = [s for s in state.samples if now - s.time <= horizon]
        # A sample with neither a wait nor queue gauges is no evidence: it is not kept, so the
        # decision holds on older samples (or their trend) or says the metric is missing. One with
        # the gauges alone (no pod had two scrapes yet) is decided from the queue.
        if sample is not None and (sample.wait_quantile is not None or sample.observed_requests is not None
                                   or sample.demand is not None):
            state.samples.append(sample)

        raw_status = (body.get("status") or {}).get("autoscaling")
        previous = state.last_status
        if previous is None and raw_status:
            previous = AutoscalingStatus.model_validate(raw_status)
        history = state.history if state.history is not None else history_from_status(previous)
        forecast = auto.forecast
        floor = state.demand.floor(now, forecast) if forecast.enabled else None
        decision = decide(auto, current, state.samples, history, now, replica_cap(body), floor=floor,
                          quick_rebound=state.demand.quick_rebound(now, auto.reversal_guard_seconds))
        state.history = decision.history
        state.demand.record(now, decision.sized, keep=forecast.period_seconds + forecast.lead_seconds)
        AUTOSCALER.observe(namespace, name, desired=decision.desired_replicas, current=current,
                           sized=decision.sized, wait=decision.metric_value, target=auto.target_seconds,
                           floor=decision.forecast_floor, reason=decision.reason, limited_by=decision.limited_by)

        scale_error = None
        if decision.desired_replicas != current:
            scale_error = await self._scale(namespace, name, decision.desired_replicas)
            if scale_error is None:
                await self._post_event(body, current, decision)
            else:
                state.history = replace(decision.history, scale_events=history.scale_events,
                                        last_scale_up=history.last_scale_up)

        new_status = next_status(previous, decision, current, now, scale_error=scale_error,
                                 generation=(body.get("metadata") or {}).get("generation"))
        tuning = self._tune(body, auto, previous, decision, now)
        if tuning is not None:
            new_status.batch_token_tuning = tuning.state
        if new_status.decisions and (previous is None or new_status.decisions[-1] not in previous.decisions):
            record = new_status.decisions[-1]
            log.info("%s/%s: %s %d -> %d: %s", namespace, name, record.reason, record.current_replicas,
                     record.desired_replicas, record.message)
        updated = None
        if worth_writing(previous, new_status):
            updated = await self.kube.patch_status(KIND, namespace, name, {"autoscaling": status_patch(new_status)})
        state.last_status = new_status  # only once written: a failed write is retried next pass
        if isinstance(updated, dict) and updated.get("metadata"):
            self.observe(updated, deleted=False)  # the newest object: spec.replicas and status as written
        elif decision.desired_replicas != current and scale_error is None:
            # Until the watch brings the scaled object, do not decide from the old count.
            self.bodies.get((namespace, name), body).setdefault("spec", {})["replicas"] = decision.desired_replicas
        if tuning is not None and tuning.changed:
            log.info("%s/%s: batch-token tuning %s: %s", namespace, name, tuning.reason, tuning.message)
            await self._post_event(body, current, decision, reason=f"BatchTokens{tuning.reason}",
                                   message=tuning.message)
            if self.on_tuned is not None and isinstance(updated, dict) and updated.get("metadata"):
                await self.on_tuned(copy.deepcopy(updated))  # the object with the new tuned value
        return decision

    def _tune(self, body: dict, auto: AutoscalingSpec, previous: AutoscalingStatus | None,
              decision: Decision, now: float) -> TuningDecision | None:
        """Batch-token tuning for this evaluation; None when it is off and never ran."""
        state = previous.batch_token_tuning if previous is not None else None
        if not auto.batch_token_tuning.enabled and (state is None or state.max_num_batched_tokens is None):
            return None
        try:
            spec = parse_spec(body)
            gpu = assign_gpu(spec.gpu, self.settings)
        except (InvalidSpec, GpuAssignmentError, ValueError) as err:
            log.info("batch-token tuning skipped: %s", err)
            return None
        if spec.engine.kind != "vllm":
            # Only vLLM reads maxNumBatchedTokens: raising it for another engine would roll pods for nothing.
            log.info("batch-token tuning skipped: the %s engine has no maxNumBatchedTokens", spec.engine.kind)
            return None

        def fits(tokens: int) -> bool:
            plan = plan_memory(shape=spec.model.shape, weight_format=spec.model.format,
                               engine=spec.engine.model_copy(update={"max_num_batched_tokens": tokens}),
                               gpu_memory_mib=gpu.memory_per_gpu_mib, tensor_parallel=spec.gpu.count)
            # Room means: still fits, and the KV cache still holds maxNumSeqs sequences.
            return plan.fits and plan.max_concurrent_sequences >= spec.engine.max_num_seqs

        cap = replica_cap(body)
        upper = auto.max_replicas if cap is None else min(auto.max_replicas, cap)
        return tune_batch_tokens(
            auto.batch_token_tuning, state,
            base_value=spec.engine.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
            wait=decision.metric_value if decision.metric_ok else None,
            target=auto.target_seconds,
            at_max_replicas=decision.desired_replicas >= upper,
            fits=fits, now=now,
        )

    async def _scale(self, namespace: str, name: str, replicas: int) -> str | None:
        try:
            await self.kube.scale(KIND, namespace, name, replicas, field_manager=AUTOSCALER_FIELD_MANAGER)
        except Exception as err:  # noqa: BLE001 - reported in status (AbleToScale=False), retried next pass
            message = f"{type(err).__name__}: {getattr(err, 'status', '')} {getattr(err, 'reason', err)}".strip()
            log.warning("%s/%s: scale to %d failed: %s", namespace, name, replicas, message)
            return message
        return None

    async def _post_event(self, body: dict, current: int, decision: Decision, *,
                          reason: str | None = None, message: str | None = None) -> None:
        metric = format_duration(decision.metric_value) if decision.metric_value is not None else "n/a"
        if reason is None:
            reason = "ScaledUp" if decision.desired_replicas > current else "ScaledDown"
            message = f"{current} -> {decision.desired_replicas} replicas (wait {metric}): {decision.message}"
        involved = {"apiVersion": API_VERSION, "kind": KIND, "metadata": body["metadata"]}
        await self.kube.post_event(involved, "Normal", reason, message or "", component=AUTOSCALER_FIELD_MANAGER)
