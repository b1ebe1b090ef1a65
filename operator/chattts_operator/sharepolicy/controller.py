"""The GPUSharePolicy controller: I/O only; every decision is in the pure modules beside it.

- One loop per policy (``run_policy``, a kopf daemon) re-plans at least every
  ``resync_seconds``, sooner when a member, the policy or a pool node changes (watch events
  wake it), and every ``settle_seconds`` while growth waits for released pods to go. Each
  pass: read the policy, the pool's nodes, its members (server-side label selector
  ``tts.chattts.io/share-policy=<name>``) and their pods; plan; write Job ``spec.suspend``
  and ChatTTSDeployment replica caps in the plan's order (suspends and scale-downs before
  scale-ups and resumes); write status and Events. A pass that changes nothing writes nothing.
- At start-up, the two PriorityClasses (online may preempt offline) are created if absent.

Time comes from the injected clock (tests install a manual one). Every request goes through
``core.kube.Kube``. Membership watches: kopf filters labels on the client side, so the Job
and ChatTTSDeployment watches see every object of those kinds; the passes themselves list
with server-side selectors.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Callable, Mapping

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from chattts_operator.api.sharepolicy import (
    KIND,
    POOL_AFFINITY_ANNOTATION,
    REPLICA_CAP_ANNOTATION,
    REPLICA_CAP_REASON_ANNOTATION,
    SHARE_POLICY_LABEL,
    GPUSharePolicySpec,
    LabelSelector,
)
from chattts_operator.core import clock as clocks
from chattts_operator.core.clock import rfc3339
from chattts_operator.core.conditions import condition
from chattts_operator.core.kube import Kube
from chattts_operator.core.labels import selector_string as serving_pod_selector
from chattts_operator.core.metrics import SHARE_POLICIES
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.children import deployment_name
from chattts_operator.deployment.gpu import GpuCodec
from chattts_operator.sharepolicy.observe import (
    Claims,
    MemberError,
    largest_gpu_mib,
    offline_member,
    online_member,
    pool_nodes,
    shared_nodes,
    split_by_pool,
)
from chattts_operator.sharepolicy.planner import OFFLINE_KIND, ONLINE_KIND, plan
from chattts_operator.sharepolicy.priorityclasses import priority_class_manifests
from chattts_operator.sharepolicy.report import member_event, policy_events, policy_status, writes_for
from chattts_operator.sharepolicy.resources import node_is_usable, node_requirements, selector_string
from chattts_operator.sharepolicy.windows import overlapping_windows

log = logging.getLogger("chattts_operator.sharepolicy")

_RELEASE_CAP = {"metadata": {"annotations": {REPLICA_CAP_ANNOTATION: None, REPLICA_CAP_REASON_ANNOTATION: None,
                                              POOL_AFFINITY_ANNOTATION: None}}}


class SharePolicyController:
    def __init__(self, kube: Kube, settings: OperatorSettings, clock: Callable[[], Any] = clocks.now) -> None:
        self.kube = kube
        self.settings = settings
        self.pacing = settings.sharepolicy
        self.gpu = GpuCodec.from_settings(settings)
        self.clock = clock
        self._wakeups: dict[str, asyncio.Event] = {}  # policy -> its loop's wake-up
        self._node_fingerprints: dict[str, tuple[bool, int, str]] = {}
        self._generations: dict[str, Any] = {}  # policy -> the generation its last event had

    # --- wake-ups from watches -------------------------------------------------------------

    def wake(self, policy: str | None = None) -> None:
        """Wake ``policy``'s loop (None: every policy's)."""
        if policy is None:
            for event in self._wakeups.values():
                event.set()
        elif policy in self._wakeups:
            self._wakeups[policy].set()

    def policy_changed(self, event_type: str | None, name: str, body: Mapping[str, Any]) -> None:
        """A policy's spec changed (or it came or went): its loop re-plans now, not at the next
        resync, and so does every other (which nodes overlap may have changed). Our own status
        writes leave the generation alone and wake nothing."""
        generation = None if event_type == "DELETED" else (body.get("metadata") or {}).get("generation")
        if self._generations.get(name) != generation:
            self._generations[name] = generation
            if generation is None:
                self._generations.pop(name, None)
            self.wake()

    def node_changed(self, event_type: str | None, name: str, node: Mapping[str, Any]) -> None:
        """Heartbeats change a node often; only a change that moves the pool wakes the policies."""
        if event_type == "DELETED":
            changed = self._node_fingerprints.pop(name, None) is not None
        else:
            labels = json.dumps(dict(node.get("metadata", {}).get("labels") or {}), sort_keys=True)
            fingerprint = (node_is_usable(node), self.gpu.node_memory_mib(node), labels)
            changed = self._node_fingerprints.get(name) != fingerprint
            self._node_fingerprints[name] = fingerprint
        if changed:
            self.wake()

    # --- leaving a policy ------------------------------------------------------------------

    async def capped_member_changed(self, body: Mapping[str, Any]) -> None:
        """A capped ChatTTSDeployment that left its policy (label removed, or the policy is
        gone) loses its cap: it serves spec.replicas again (Jobs it suspended stay suspended:
        resuming them without a policy could over-commit the pool; the user decides)."""
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return
        policy = (meta.get("labels") or {}).get(SHARE_POLICY_LABEL)
        if policy in self._wakeups:
            return  # its policy's loop runs here: the policy exists (no API call per event)
        if policy and await self.kube.get(KIND, None, policy) is not None:
            return
        if await self.kube.patch_if_exists(body["kind"], meta["namespace"], meta["name"], _RELEASE_CAP) is None:
            return
        await self.kube.post_event(dict(body), "Normal", "ReplicaCapRemoved",
                                   f"no longer under a GPUSharePolicy ({policy or 'label removed'}): serving spec.replicas")
        log.info("replica cap removed: %s/%s left its share policy", meta["namespace"], meta["name"])

    async def policy_deleted(self, name: str) -> None:
        """A deleted policy releases its online members' caps."""
        SHARE_POLICIES.forget(name)
        members = await self.kube.list_in(ONLINE_KIND, self.settings.watch_namespaces, f"{SHARE_POLICY_LABEL}={name}")
        for ctd in members:
            meta = ctd["metadata"]
            if REPLICA_CAP_ANNOTATION in (meta.get("annotations") or {}):
                await self.kube.patch_if_exists(ONLINE_KIND, meta["namespace"], meta["name"], _RELEASE_CAP)
                log.info("replica cap removed from %s/%s", meta["namespace"], meta["name"])

    # --- start-up --------------------------------------------------------------------------

    async def ensure_priority_classes(self) -> None:
        for manifest in priority_class_manifests():
            name = manifest["metadata"]["name"]
            try:
                created = await self.kube.create(manifest)
            except ApiException as err:
                # Not fatal: serving and rebalancing work without them; only preemption is lost.
                log.error("cannot create PriorityClass %s (%s %s): online pods will not preempt offline ones",
                          name, err.status, err.reason)
                continue
            if created is not None:
                log.info("created PriorityClass %s", name)
                continue
            live = await self.kube.get("PriorityClass", None, name) or {}
            if live.get("value") != manifest["value"]:
                # value is immutable: say so instead of fighting over it.
                log.warning("PriorityClass %s exists with value %s (expected %s): online pods may not preempt "
                            "offline ones", name, live.get("value"), manifest["value"])

    # --- one pass --------------------------------------------------------------------------

    async def reconcile_policy(self, name: str) -> float | None:
        """Plan and apply once; how long to wait before the next pass (seconds), or None
        when the policy is gone."""
        now = self.clock()
        policy = await self.kube.get(KIND, None, name)
        if policy is None:
            return None
        previous = policy.get("status") or {}
        generation = policy.get("metadata", {}).get("generation")
        try:
            spec = GPUSharePolicySpec.model_validate(policy.get("spec") or {})
        except ValidationError as err:
            message = "; ".join(f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
            await self._write_invalid(policy, previous, message, now, generation)
            return self.pacing.resync_seconds

        listed = await self.kube.list("Node", None, selector_string(spec.node_selector) or None)
        nodes = [n for n in listed if self.gpu.node_memory_mib(n) > 0]
        per_gpu = largest_gpu_mib(nodes, self.gpu)
        if not nodes:
            # Budgets of 0 would scale every member down: an empty pool changes nothing, and says so.
            await self._write_invalid(policy, previous, "the node selector matches no node with GPU memory: this "
                                      "policy makes no changes until it does", now, generation, reason="EmptyPool")
            return self.pacing.resync_seconds
        pool = {n["metadata"]["name"] for n in nodes}

        # Two policies over the same GPUs could together over-commit them: the one named first
        # keeps acting, the others make no change until the pools are disjoint.
        problems: list[str] = []
        others: dict[str, LabelSelector] = {}
        for item in await self.kube.list(KIND):
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
            await self._write_invalid(policy, previous, f"{message}: it was named first, so this policy makes no "
                                      "changes until the pools are disjoint", now, generation, reason="OverlappingPool")
            return self.pacing.resync_seconds
        # Not a problem of this policy: it is the one that acts (the other reports OverlappingPool).
        notes = [f"nodes {', '.join(n[:5])} are also in GPUSharePolicy {o}, which yields to this one"
                 for o, n in shared.items()]
        selector = f"{SHARE_POLICY_LABEL}={name}"
        # With watched namespaces RBAC grants those only: list in each.
        namespaces = self.settings.watch_namespaces
        ctds = await self.kube.list_in(ONLINE_KIND, namespaces, selector)
        jobs = await self.kube.list_in(OFFLINE_KIND, namespaces, selector)

        online, offline = [], []
        bodies: dict[tuple[str, str, str], dict[str, Any]] = {}
        claims_in: dict[str, Claims] = {}
        outside: list[str] = []
        affinity = json.dumps(node_requirements(spec.node_selector), sort_keys=True)
        for ctd in ctds:
            meta = ctd["metadata"]
            pods = await self.kube.list("Pod", meta["namespace"], serving_pod_selector(meta["name"]))
            pods, away = split_by_pool(pods, pool)
            outside += _outside(away, ctd)
            deployment = await self.kube.get("Deployment", meta["namespace"], deployment_name(meta["name"]))
            claims = await self._claims(claims_in, meta["namespace"], pods)
            if (meta.get("annotations") or {}).get(POOL_AFFINITY_ANNOTATION) != affinity:
                # Confines the member's pods to the pool's nodes (the deployment adds node affinity).
                await self.kube.patch(ONLINE_KIND, meta["namespace"], meta["name"],
                                      {"metadata": {"annotations": {POOL_AFFINITY_ANNOTATION: affinity}}})
            try:
                online.append(online_member(ctd, pods, per_gpu, deployment, self.gpu, claims, outside=len(away)))
                bodies[(ONLINE_KIND, meta["namespace"], meta["name"])] = ctd
            except MemberError as err:
                problems.append(str(err))
        for job in jobs:
            meta = job["metadata"]
            pods = await self.kube.list("Pod", meta["namespace"], f"batch.kubernetes.io/controller-uid={meta['uid']}")
            pods, away = split_by_pool(pods, pool)
            outside += _outside(away, job)
            claims = await self._claims(claims_in, meta["namespace"], [*pods, job.get("spec", {}).get("template") or {}])
            offline.append(offline_member(job, pods, per_gpu, self.gpu, claims))
            bodies[(OFFLINE_KIND, meta["namespace"], meta["name"])] = job

        the_plan = plan(spec, online, offline, pool_nodes(nodes, self.gpu), now)
        writes = writes_for(the_plan, online, offline)
        done = []
        for write in writes:
            if write.kind == OFFLINE_KIND:
                patch: dict[str, Any] = {"spec": {"suspend": write.suspend}}
            else:
                patch = {"metadata": {"annotations": {
                    REPLICA_CAP_ANNOTATION: str(write.cap), REPLICA_CAP_REASON_ANNOTATION: write.reason[:1024]}}}
            try:
                await self.kube.patch(write.kind, write.namespace, write.name, patch)
            except ApiException as err:
                # Later writes may depend on this one (a resume on a suspend): stop here and re-plan.
                log.warning("share policy %s: %s %s/%s failed: %s", name, write.kind, write.namespace, write.name,
                            err.reason)
                problems.append(f"{write.kind} {write.namespace}/{write.name}: write failed ({err.status} {err.reason})")
                break
            done.append(write)
            if write.action is not None or write.kind == OFFLINE_KIND:
                body = bodies.get((write.kind, write.namespace, write.name))
                if body is not None:
                    await self.kube.post_event(body, *member_event(write))

        status = policy_status(the_plan, online, offline, previous, now, generation, done,
                               overlaps=overlapping_windows(spec, now), problems=problems, notes=notes,
                               outside=outside)
        for event_type, reason, message in policy_events(the_plan, previous, done):
            await self.kube.post_event(policy, event_type, reason, message)
        changed = _status_differs(status, previous)
        if changed:
            await self.kube.patch_status(KIND, None, name, status)
        SHARE_POLICIES.observe(name, status, the_plan.job_state.values(), wrote_status=changed)
        if not the_plan.settled or len(done) < len(writes):
            return self.pacing.settle_seconds
        if the_plan.next_change is not None:
            until = (the_plan.next_change - now).total_seconds()
            return max(self.pacing.min_interval_seconds, min(self.pacing.resync_seconds, until))
        return self.pacing.resync_seconds

    async def _claims(self, cache: dict[str, Claims], namespace: str, pods: list[dict[str, Any]]) -> Claims:
        """The namespace's claims and claim templates, read once a pass and only where a
        member's pod (or pod template) uses Dynamic Resource Allocation."""
        if namespace in cache:
            return cache[namespace]
        if not any((p.get("spec") or {}).get("resourceClaims") for p in pods):
            return Claims()
        try:
            found = Claims.of(await self.kube.list("ResourceClaim", namespace),
                              await self.kube.list("ResourceClaimTemplate", namespace))
        except ApiException as err:
            if err.status not in (403, 404):
                raise
            # No DRA API, or no RBAC for it: claims count what their templates ask, else nothing.
            log.warning("cannot list ResourceClaims in %s (%s): DRA members are counted by spec", namespace,
                        err.status)
            found = Claims()
        cache[namespace] = found
        return found

    async def _write_invalid(self, policy: dict[str, Any], previous: dict[str, Any], message: str, now: Any,
                             generation: int | None, reason: str = "InvalidSpec") -> None:
        """Valid=False and Balanced=False with ``reason``: this policy makes no change."""
        conditions = [c for c in previous.get("conditions") or [] if c.get("type") not in ("Valid", "Balanced")]
        old = next((c for c in previous.get("conditions") or [] if c.get("type") == "Valid"), None)
        if (old and old.get("status") == "False" and old.get("message") == message
                and previous.get("observedGeneration") == generation):
            return
        stamp = rfc3339(now)
        conditions.append(condition("Valid", False, reason, message, generation=generation, now=stamp))
        conditions.append(condition("Balanced", False, reason, "this policy makes no changes", generation=generation,
                                    now=stamp))
        if not (old and old.get("status") == "False" and old.get("message") == message):
            await self.kube.post_event(policy, "Warning", reason, message)
        await self.kube.patch_status(KIND, None, policy["metadata"]["name"],
                                     {"observedGeneration": generation, "conditions": conditions})

    # --- the loop per policy ---------------------------------------------------------------

    async def run_policy(self, name: str) -> None:
        """Pass after pass until the policy is gone (or the task is cancelled)."""
        wake = self._wakeups.setdefault(name, asyncio.Event())
        failures = 0
        try:
            while True:
                wake.clear()
                try:
                    delay = await self.reconcile_policy(name)
                    if delay is None:
                        return  # the policy is gone; kopf stops the daemon too
                    failures = 0
                except ApiException as err:
                    if err.status == 404:
                        return
                    failures += 1
                    log.warning("share policy %s: API error %s %s; retrying", name, err.status, err.reason)
                    delay = min(self.pacing.resync_seconds, self.pacing.settle_seconds * 2 ** min(failures, 5))
                except (MemberError, ValueError) as err:
                    log.error("share policy %s: %s", name, err)
                    delay = self.pacing.resync_seconds
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=delay)
                await asyncio.sleep(self.pacing.min_interval_seconds)
        finally:
            if self._wakeups.get(name) is wake:
                del self._wakeups[name]


def _outside(pods: list[Mapping[str, Any]], member: Mapping[str, Any]) -> list[str]:
    """'namespace/pod on node (kind name)' for a member's pods outside the pool."""
    return [f"{p['metadata'].get('namespace')}/{p['metadata']['name']} on {p['spec']['nodeName']} "
            f"({member.get('kind', '')} {member['metadata']['name']})" for p in pods]


def _status_differs(new: dict[str, Any], old: dict[str, Any]) -> bool:
    return json.dumps(new, sort_keys=True, default=str) != json.dumps(
        {k: old.get(k) for k in new}, sort_keys=True, default=str
    )
