"""kopf handlers for GPUSharePolicy: I/O only; every decision is in ``chattts_operator.scheduling``.

- One daemon per policy re-plans at least every ``resync_seconds``, sooner when a member,
  the policy or a pool node changes (watch events wake it), and every ``settle_seconds``
  while growth waits for released pods to go. Each pass: read the policy, the pool's nodes,
  its members (server-side label selector ``tts.chattts.io/share-policy=<name>``) and their
  pods; plan; write Job ``spec.suspend`` and ChatTTSDeployment replica caps in the plan's
  order (suspends and scale-downs before scale-ups and resumes); write status and Events.
  A pass that changes nothing writes nothing.
- At start-up, the two PriorityClasses (online may preempt offline) are created if absent.

Time comes from ``chattts_operator.scheduling.clock`` (tests install a manual clock).
Client: ``kubernetes_asyncio`` (the handlers are async and must never block the loop).
Membership watches: kopf filters labels on the client side, so the Job and
ChatTTSDeployment watches see every object of those kinds; the passes themselves list
with server-side selectors.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from chattts_operator.api.chattts import PLURAL as CTD_PLURAL
from chattts_operator.api.sharepolicy import (
    GROUP,
    KIND,
    PLURAL,
    REPLICA_CAP_ANNOTATION,
    REPLICA_CAP_REASON_ANNOTATION,
    SHARE_POLICY_LABEL,
    VERSION,
    GPUSharePolicySpec,
    LabelSelector,
)
from chattts_operator.builders import deployment_name, selector_string as serving_pod_selector
from chattts_operator.kube import make_api_client
from chattts_operator.scheduling import clock
from chattts_operator.settings import OperatorSettings, SettingsError
from chattts_operator.scheduling.observe import (
    MemberError,
    largest_gpu_mib,
    offline_member,
    online_member,
    pool_nodes,
    shared_nodes,
)
from chattts_operator.scheduling.planner import OFFLINE_KIND, plan
from chattts_operator.scheduling.priorityclasses import priority_class_manifests
from chattts_operator.scheduling.report import member_event, policy_events, policy_status, writes_for
from chattts_operator.scheduling.resources import node_gpu_memory_mib, node_is_usable, selector_string
from chattts_operator.scheduling.windows import overlapping_windows

FIELD_MANAGER = "chattts-operator"
MERGE_PATCH = "application/merge-patch+json"

log = logging.getLogger(__name__)


@dataclass
class SharePolicyConfig:
    resync_seconds: float = 30.0  # re-plan at least this often (window changes need no event)
    settle_seconds: float = 2.0  # re-plan this soon while growth waits for pods to go
    min_interval_seconds: float = 0.5  # at most one pass per policy this often (debounces watch bursts)


CONFIG = SharePolicyConfig(
    resync_seconds=float(os.environ.get("CHATTTS_SHAREPOLICY_RESYNC_SECONDS", 30.0)),
    settle_seconds=float(os.environ.get("CHATTTS_SHAREPOLICY_SETTLE_SECONDS", 2.0)),
)


def configure(**values: float) -> None:
    """Change the pacing (tests make it fast)."""
    for key, value in values.items():
        if not hasattr(CONFIG, key):
            raise TypeError(f"unknown share-policy setting {key!r}")
        setattr(CONFIG, key, float(value))


# --- wake-ups from watches ---------------------------------------------------------------

_wakeups: dict[str, asyncio.Event] = {}
_node_fingerprints: dict[str, tuple[bool, int, str]] = {}


def _wake(policy: str | None = None) -> None:
    if policy is None:
        for event in _wakeups.values():
            event.set()
    elif policy in _wakeups:
        _wakeups[policy].set()


@kopf.on.event("batch", "v1", "jobs", labels={SHARE_POLICY_LABEL: kopf.PRESENT})
async def _job_changed(labels: kopf.Labels, **_: Any) -> None:
    _wake(labels.get(SHARE_POLICY_LABEL))


@kopf.on.event(GROUP, VERSION, CTD_PLURAL, labels={SHARE_POLICY_LABEL: kopf.PRESENT})
async def _member_ctd_changed(labels: kopf.Labels, **_: Any) -> None:
    _wake(labels.get(SHARE_POLICY_LABEL))


@kopf.on.event("", "v1", "nodes")
async def _node_changed(type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
    # Heartbeats change a node often; only a change that moves the pool wakes the policies.
    if type == "DELETED":
        changed = _node_fingerprints.pop(name, None) is not None
    else:
        raw = dict(body)
        labels = json.dumps(dict(body.get("metadata", {}).get("labels") or {}), sort_keys=True)
        fingerprint = (node_is_usable(raw), node_gpu_memory_mib(raw), labels)
        changed = _node_fingerprints.get(name) != fingerprint
        _node_fingerprints[name] = fingerprint
    if changed:
        _wake()


# --- leaving a policy ----------------------------------------------------------------------


async def _release_ctd(api: client.ApiClient, namespace: str, name: str) -> None:
    """Remove the replica cap: the member serves spec.replicas again (Jobs it suspended stay
    suspended: resuming them without a policy could over-commit the pool; the user decides)."""
    custom = client.CustomObjectsApi(api)
    try:
        await custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, CTD_PLURAL, name,
            {"metadata": {"annotations": {REPLICA_CAP_ANNOTATION: None, REPLICA_CAP_REASON_ANNOTATION: None}}},
            field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH,
        )
    except ApiException as err:
        if err.status != 404:
            raise


@kopf.on.event(GROUP, VERSION, CTD_PLURAL, annotations={REPLICA_CAP_ANNOTATION: kopf.PRESENT})
async def _capped_ctd_changed(body: kopf.Body, labels: kopf.Labels, namespace: str, name: str,
                              logger: logging.Logger, **_: Any) -> None:
    """A capped ChatTTSDeployment that left its policy (label removed, or the policy is gone)
    loses its cap."""
    if body.get("metadata", {}).get("deletionTimestamp"):
        return
    policy = labels.get(SHARE_POLICY_LABEL)
    if policy in _wakeups:
        return  # its policy's daemon runs here: the policy exists (no API call per event)
    async with await make_api_client() as api:
        if policy:
            try:
                await client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, PLURAL, policy)
                return
            except ApiException as err:
                if err.status != 404:
                    raise
        await _release_ctd(api, namespace, name)
    kopf.event(body, type="Normal", reason="ReplicaCapRemoved",
               message=f"no longer under a GPUSharePolicy ({policy or 'label removed'}): serving spec.replicas")
    logger.info("replica cap removed: %s/%s left its share policy", namespace, name)


@kopf.on.delete(GROUP, VERSION, PLURAL, id="release-members")
async def _policy_deleted(name: str, logger: logging.Logger, **_: Any) -> None:
    """A deleted policy releases its online members' caps."""
    selector = f"{SHARE_POLICY_LABEL}={name}"
    async with await make_api_client() as api:
        custom = client.CustomObjectsApi(api)
        namespaces = _watched_namespaces()
        if namespaces:
            ctds = []
            for ns in namespaces:
                ctds += (await custom.list_namespaced_custom_object(
                    GROUP, VERSION, ns, CTD_PLURAL, label_selector=selector)).get("items") or []
        else:
            ctds = (await custom.list_cluster_custom_object(
                GROUP, VERSION, CTD_PLURAL, label_selector=selector)).get("items") or []
        for ctd in ctds:
            if REPLICA_CAP_ANNOTATION in (ctd["metadata"].get("annotations") or {}):
                await _release_ctd(api, ctd["metadata"]["namespace"], ctd["metadata"]["name"])
                logger.info("replica cap removed from %s/%s", ctd["metadata"]["namespace"], ctd["metadata"]["name"])


# --- the API -------------------------------------------------------------------------------

async def _json(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a kubernetes_asyncio method and return the raw JSON (camelCase), as the API sent it."""
    response = await call(*args, _preload_content=False, **kwargs)
    try:
        # Without content preloading the client does not raise on errors: a 403/404/500 body
        # must never be read as the object (a refused node list would look like an empty pool).
        if not 200 <= response.status < 300:
            error = ApiException(status=response.status, reason=response.reason)
            error.body = await response.read()
            raise error
        return json.loads(await response.read())
    finally:
        response.release()


@kopf.on.startup()
async def ensure_priority_classes(logger: logging.Logger, **_: Any) -> None:
    async with await make_api_client() as api:
        scheduling = client.SchedulingV1Api(api)
        for manifest in priority_class_manifests():
            name = manifest["metadata"]["name"]
            try:
                await scheduling.create_priority_class(manifest, field_manager=FIELD_MANAGER)
                logger.info("created PriorityClass %s", name)
            except ApiException as err:
                if err.status != 409:
                    # Not fatal: serving and rebalancing work without them; only preemption is lost.
                    logger.error("cannot create PriorityClass %s (%s %s): online pods will not preempt offline ones",
                                 name, err.status, err.reason)
                    continue
                live = await _json(scheduling.read_priority_class, name)
                if live.get("value") != manifest["value"]:
                    # value is immutable: say so instead of fighting over it.
                    logger.warning(
                        "PriorityClass %s exists with value %s (expected %s): online pods may not preempt offline ones",
                        name, live.get("value"), manifest["value"],
                    )


# --- one pass ----------------------------------------------------------------------------


async def reconcile_policy(api: client.ApiClient, name: str, logger: logging.Logger) -> float:
    """Plan and apply once; returns how long to wait before the next pass (seconds)."""
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    batch = client.BatchV1Api(api)
    apps = client.AppsV1Api(api)
    now = clock.now()

    policy = await custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    previous = policy.get("status") or {}
    generation = policy.get("metadata", {}).get("generation")
    try:
        spec = GPUSharePolicySpec.model_validate(policy.get("spec") or {})
    except ValidationError as err:
        message = "; ".join(f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        await _write_invalid(custom, policy, previous, message, now, generation)
        return CONFIG.resync_seconds

    node_list = await _json(core.list_node, label_selector=selector_string(spec.node_selector) or None)
    nodes = [n for n in node_list.get("items") or [] if node_gpu_memory_mib(n) > 0]
    per_gpu = largest_gpu_mib(nodes)

    # Two policies over the same GPUs could together over-commit them: the one named first
    # keeps acting, the others make no change until the pools are disjoint.
    problems: list[str] = []
    others: dict[str, LabelSelector] = {}
    for item in (await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)).get("items") or []:
        other = item["metadata"]["name"]
        if other != name:
            try:
                others[other] = LabelSelector.model_validate((item.get("spec") or {}).get("nodeSelector") or {})
            except ValidationError:
                continue  # that policy reports its own bad spec
    shared = shared_nodes(nodes, others)
    first = [other for other in shared if other < name]
    if first:
        message = "; ".join(f"nodes {', '.join(shared[o][:5])} are also in GPUSharePolicy {o}" for o in first)
        await _write_invalid(custom, policy, previous, f"{message}: it was named first, so this policy makes no "
                             "changes until the pools are disjoint", now, generation, reason="OverlappingPool")
        return CONFIG.resync_seconds
    problems += [f"nodes {', '.join(n[:5])} are also in GPUSharePolicy {o}, which yields to this one"
                 for o, n in shared.items()]
    selector = f"{SHARE_POLICY_LABEL}={name}"
    namespaces = _watched_namespaces()
    if namespaces:
        # RBAC then grants the namespaces only: list in each.
        ctds, jobs = [], []
        for ns in namespaces:
            ctds += (await custom.list_namespaced_custom_object(
                GROUP, VERSION, ns, CTD_PLURAL, label_selector=selector)).get("items") or []
            jobs += (await _json(batch.list_namespaced_job, ns, label_selector=selector)).get("items") or []
    else:
        ctds = (await custom.list_cluster_custom_object(GROUP, VERSION, CTD_PLURAL, label_selector=selector)).get("items") or []
        jobs = (await _json(batch.list_job_for_all_namespaces, label_selector=selector)).get("items") or []

    online, offline = [], []
    bodies: dict[tuple[str, str, str], dict[str, Any]] = {}
    for ctd in ctds:
        # Items of a list carry no kind; Events need it.
        ctd.setdefault("apiVersion", f"{GROUP}/{VERSION}")
        ctd.setdefault("kind", "ChatTTSDeployment")
        meta = ctd["metadata"]
        pods = await _json(core.list_namespaced_pod, meta["namespace"],
                           label_selector=serving_pod_selector(meta["name"]))
        deployment = await _read_or_none(apps.read_namespaced_deployment, deployment_name(meta["name"]), meta["namespace"])
        try:
            online.append(online_member(ctd, pods.get("items") or [], per_gpu, deployment))
            bodies[("ChatTTSDeployment", meta["namespace"], meta["name"])] = ctd
        except MemberError as err:
            problems.append(str(err))
    for job in jobs:
        job.setdefault("apiVersion", "batch/v1")
        job.setdefault("kind", "Job")
        meta = job["metadata"]
        pods = await _json(core.list_namespaced_pod, meta["namespace"],
                           label_selector=f"batch.kubernetes.io/controller-uid={meta['uid']}")
        offline.append(offline_member(job, pods.get("items") or [], per_gpu))
        bodies[(OFFLINE_KIND, meta["namespace"], meta["name"])] = job

    the_plan = plan(spec, online, offline, pool_nodes(nodes), now)
    done = []
    for write in writes_for(the_plan, online, offline):
        try:
            if write.kind == OFFLINE_KIND:
                await batch.patch_namespaced_job(
                    write.name, write.namespace, {"spec": {"suspend": write.suspend}},
                    field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH,
                )
            else:
                await custom.patch_namespaced_custom_object(
                    GROUP, VERSION, write.namespace, CTD_PLURAL, write.name,
                    {"metadata": {"annotations": {
                        REPLICA_CAP_ANNOTATION: str(write.cap), REPLICA_CAP_REASON_ANNOTATION: write.reason[:1024],
                    }}},
                    field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH,
                )
        except ApiException as err:
            # Later writes may depend on this one (a resume on a suspend): stop here and re-plan.
            logger.warning("share policy %s: %s %s/%s failed: %s", name, write.kind, write.namespace, write.name, err.reason)
            problems.append(f"{write.kind} {write.namespace}/{write.name}: write failed ({err.status} {err.reason})")
            break
        done.append(write)
        if write.action is not None or write.kind == OFFLINE_KIND:
            body = bodies.get((write.kind, write.namespace, write.name))
            if body is not None:
                event_type, reason, message = member_event(write)
                kopf.event(body, type=event_type, reason=reason, message=message)

    status = policy_status(
        the_plan, online, offline, previous, now, generation, done,
        overlaps=overlapping_windows(spec, now), problems=problems,
    )
    for event_type, reason, message in policy_events(the_plan, previous, done):
        kopf.event(policy, type=event_type, reason=reason, message=message)
    if _status_differs(status, previous):
        await custom.patch_cluster_custom_object_status(
            GROUP, VERSION, PLURAL, name, {"status": status}, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH,
        )
    if not the_plan.settled or len(done) < len(writes_for(the_plan, online, offline)):
        return CONFIG.settle_seconds
    if the_plan.next_change is not None:
        until = (the_plan.next_change - now).total_seconds()
        return max(CONFIG.min_interval_seconds, min(CONFIG.resync_seconds, until))
    return CONFIG.resync_seconds


def _watched_namespaces() -> tuple[str, ...]:
    """The operator's namespaces (CHATTTS_OPERATOR_WATCH_NAMESPACES); empty: the whole cluster."""
    try:
        return OperatorSettings.from_env().watch_namespaces
    except SettingsError:
        return ()  # the operator refused to start on it already


async def _read_or_none(call: Any, *args: Any) -> dict[str, Any] | None:
    try:
        return await _json(call, *args)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def _status_differs(new: dict[str, Any], old: dict[str, Any]) -> bool:
    return json.dumps(new, sort_keys=True, default=str) != json.dumps(
        {k: old.get(k) for k in new}, sort_keys=True, default=str
    )


async def _write_invalid(custom: client.CustomObjectsApi, policy: dict[str, Any], previous: dict[str, Any],
                         message: str, now: Any, generation: int | None, reason: str = "InvalidSpec") -> None:
    conditions = [c for c in previous.get("conditions") or [] if c.get("type") != "Valid"]
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == "Valid"), None)
    if old and old.get("status") == "False" and old.get("message") == message:
        return
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions.append({"type": "Valid", "status": "False", "reason": reason, "message": message,
                       "lastTransitionTime": stamp, "observedGeneration": generation})
    kopf.event(policy, type="Warning", reason=reason, message=message)
    await custom.patch_cluster_custom_object_status(
        GROUP, VERSION, PLURAL, policy["metadata"]["name"],
        {"status": {"observedGeneration": generation, "conditions": conditions}},
        field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH,
    )


# --- the loop per policy -------------------------------------------------------------------


@kopf.daemon(GROUP, VERSION, PLURAL, id="share-policy", cancellation_timeout=10.0)
async def share_policy_daemon(name: str, logger: logging.Logger, **_: Any) -> None:
    wake = _wakeups.setdefault(name, asyncio.Event())
    failures = 0
    try:
        async with await make_api_client() as api:
            while True:
                wake.clear()
                try:
                    delay = await reconcile_policy(api, name, logger)
                    failures = 0
                except ApiException as err:
                    if err.status == 404:
                        return  # the policy is gone; kopf stops the daemon too
                    failures += 1
                    logger.warning("share policy %s: API error %s %s; retrying", name, err.status, err.reason)
                    delay = min(CONFIG.resync_seconds, CONFIG.settle_seconds * 2 ** min(failures, 5))
                except (MemberError, ValueError) as err:
                    logger.error("share policy %s: %s", name, err)
                    delay = CONFIG.resync_seconds
                try:
                    await asyncio.wait_for(wake.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
                await asyncio.sleep(CONFIG.min_interval_seconds)
    finally:
        if _wakeups.get(name) is wake:
            del _wakeups[name]


__all__ = ["CONFIG", "KIND", "configure", "reconcile_policy", "share_policy_daemon"]
