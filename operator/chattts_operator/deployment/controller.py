"""The ChatTTSDeployment controller: the I/O around the pure decision in ``spec.py`` and ``status.py``.

One level-based, idempotent reconcile per ChatTTSDeployment, whatever triggered it (the
object seen for the first time, a new generation or new labels/annotations, a change of one
of its children or pods, the periodic resync). The triggers come from kopf's stateless event
handler, not its create/update/resume handlers: those are diff-based and patch a diff-base
annotation onto every object at every change (a write per object and change that told us
nothing the generation does not):

1. build the desired children and the GPU plan from the object (pure; kept per object and
   rebuilt only when one of its inputs changes: generation, labels, annotations, the tuned
   batch size, the quantized weights, the largest node GPU);
2. read each child from the watch-fed cache (core/watch.py ``ChildCache``: no request) and
   server-side apply only those that differ (missing, our intent hash changed, or a field we
   own was edited by hand); delete our NetworkPolicy once spec.networkPolicy is gone or
   disabled (nothing else collects it while the owner lives);
3. compute status (with the pods' own reasons when replicas are not ready, and the
   UpstreamData condition from the last answer of a Ready pod's /health) and, when it
   differs, queue it: one writer per object patches the newest queued status, at most
   ``status_coalesce_seconds`` later and once a low-priority request slot is free (core/kube.py
   ``Priority``), so child applies go first and the quick steps of a rollout (created,
   scheduled, Ready) are written once.

So a resync of an unchanged object makes no request at all. Which upstream data the pods found
(the runtime's /health ``upstream_data``) is asked apart from the reconcile, of the newest Ready
pod per object, every ``upstream_data_interval_seconds`` and when another pod becomes the one to
ask (aiohttp, a short timeout, core/podhttp.py's client shared with the autoscaler); only an
answer that changes the condition reconciles the object. Reconciles of one object never
overlap (a lock per object) and pile-ups collapse: while one runs, any number of triggers
for the same object become one follow-up run.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kubernetes_asyncio.client.exceptions import ApiException

from chattts_operator.api.chattts import API_VERSION, KIND, ChatTTSDeploymentSpec, ModelSpec
from chattts_operator.api.sharepolicy import (
    ONLINE_PRIORITY_CLASS,
    POOL_AFFINITY_ANNOTATION,
    REPLICA_CAP_ANNOTATION,
    SHARE_POLICY_LABEL,
)
from chattts_operator.core import metrics
from chattts_operator.core.clock import rfc3339
from chattts_operator.core.conditions import condition, merge_conditions, replace_condition
from chattts_operator.core.kube import Kube, NodeGpuCache, is_newer
from chattts_operator.core.podhttp import PodHttp, PodHttpError, pod_ready
from chattts_operator.core.labels import FIELD_MANAGER, LABEL_INSTANCE, MANAGED_SELECTOR, selector_labels, selector_string
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.core.watch import ChildCache
from chattts_operator.deployment.children import (
    HTTP_PORT,
    Owner,
    event_subject,
    mounted_configmap,
    network_policy_name,
    replicaset_revision,
)
from chattts_operator.deployment.gpu import (
    GpuCodec,
    dra_allocation_status,
)
from chattts_operator.deployment.spec import (
    Desired,
    InvalidSpec,
    desired_state,
    needs_apply,
    parse_spec,
    stale_runtime_configmaps,
)
from chattts_operator.deployment.status import (
    SECRET_FOUND,
    SECRET_MISSING,
    SECRET_UNCHECKED,
    HealthAnswer,
    Observed,
    compute_status,
    rollout_complete,
    status_changed,
    transitions,
    unschedulable_message,
    upstream_data_condition,
)


if TYPE_CHECKING:  # the feature's plan type only: the step itself is handed in
    from chattts_operator.quantization.plan import QuantizationPlan

log = logging.getLogger("chattts_operator")

Key = tuple[str, str]  # (namespace, name)
# A dra object whose claims wait for the scheduler is looked at again this soon: nothing we
# watch changes when a pod stays Pending, and status should carry the scheduler's reason.
DRA_PENDING_RECHECK_SECONDS = 10.0
# A reconcile that failed on a transient API error (a 504 in a burst, a 409) runs again this soon.
RETRY_SECONDS = 5.0
# Child and pod events of one object within this window make one reconcile: a rollout is a
# dozen events in a second or two, and reconciling each one kept the operator's only core busy
# while spec changes of other objects waited for it. Spec changes themselves do not wait.
CHILD_EVENT_COALESCE_SECONDS = 0.25
# What the operator owns (all labelled MANAGED_SELECTOR), and the serving pods, cached by watches.
# The Deployments' ReplicaSets (their pod templates carry our labels) tell which runtime
# ConfigMaps a revision still mounts.
CACHED_KINDS = ("ConfigMap", "Deployment", "ReplicaSet", "Service", "PodDisruptionBudget", "NetworkPolicy", "Pod")


@dataclass
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queued: bool = False
    spec_version: tuple[Any, ...] | None = None  # (uid, generation) ``spec`` was parsed from
    spec: ChatTTSDeploymentSpec | None = None
    desired_inputs: tuple[Any, ...] | None = None  # what ``desired`` was built from
    desired: Desired | None = None
    triggered_by: tuple[Any, ...] | None = None  # the object's inputs its last event reconciled
    status_queued: dict[str, Any] | None = None  # the newest status not written yet
    status_writer: asyncio.Task | None = None
    change_seen_at: float | None = None  # when the watch brought a change not applied yet
    change_started_at: float | None = None  # when the first reconcile after it held the lock
    change_built_at: float | None = None  # when that reconcile had its desired state
    # A child vanished: before anything is re-created, make sure the owner itself still exists.
    verify_owner: bool = False
    upstream: HealthAnswer | None = None  # the last /health answer (status's UpstreamData); None: not asked


class QuantizationStep(Protocol):
    """The quantization feature's step of a reconcile (``quantization.controller``): its Job, and the
    weights the pods mount; None when quantization was never asked for. Handed in by ``app.py``, so
    this controller does not import the feature above it."""

    async def __call__(self, body: dict[str, Any], spec: ChatTTSDeploymentSpec,
                       previous_status: dict[str, Any]) -> "QuantizationPlan | None": ...


class DeploymentController:
    def __init__(self, kube: Kube, settings: OperatorSettings, quantization: QuantizationStep,
                 http: PodHttp | None = None) -> None:
        self.kube = kube
        self.settings = settings
        self.quantization = quantization
        # The app's client of the pods' endpoints (shared with the autoscaler), else one of its own.
        self._own_http = http is None
        self.http = http or PodHttp(settings.autoscaler.metrics_url_annotation)
        self._upstream_asks: dict[Key, asyncio.Task] = {}  # one /health question waiting per object at most
        self.nodes = NodeGpuCache(kube, settings.node_memory_label)
        self.gpu_codec = GpuCodec.from_settings(settings)
        self.bodies: dict[Key, dict[str, Any]] = {}  # last seen object per key (from the watch)
        self.blocked: set[Key] = set()
        self._slots: dict[Key, _Slot] = {}
        self.last_resync: float | None = None
        self.started_at = time.time()
        self._tasks: list[asyncio.Task] = []
        self._rechecks: dict[Key, asyncio.Task] = {}  # one delayed reconcile per object at most
        self._child_events: dict[Key, asyncio.Task] = {}  # reconciles after a child or pod event, coalesced
        self._pending: set[asyncio.Task] = set()  # reconciles started by ChatTTSDeployment events
        # GPUSharePolicy name -> whether it exists: read once per name, then kept current by the
        # policies' watch events (share_policy_changed), so a resync reads nothing.
        self._share_policies: dict[str, bool] = {}
        self.cache = self._new_cache(tuple(settings.watch_namespaces))

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, namespaces: tuple[str, ...]) -> None:
        """The resync loop (a task, not a kopf timer: kopf timers need a finalizer on every
        object, and we want none: owner references collect the children), and the cache's
        list+watch of every child kind and of the pods per watched namespace (core/watch.py:
        a server-side label selector, not kopf's client-side one)."""
        self.started_at = time.time()
        self._tasks.append(asyncio.create_task(self.resync_forever(), name="chattts-resync"))
        if self.settings.upstream_data_interval_seconds > 0:
            self._tasks.append(asyncio.create_task(self.upstream_forever(), name="chattts-upstream-data"))
        self.cache = self._new_cache(tuple(namespaces))
        self._tasks += self.cache.start()

    def _new_cache(self, namespaces: tuple[str, ...]) -> ChildCache:
        return ChildCache(self.kube, CACHED_KINDS, namespaces, MANAGED_SELECTOR, on_change=self._child_changed,
                          slimmers={"ReplicaSet": replicaset_revision})

    async def stop(self) -> None:
        for task in [*self._rechecks.values(), *self._child_events.values(), *self._upstream_asks.values()]:
            task.cancel()
        for slot in self._slots.values():
            if slot.status_writer is not None:
                slot.status_writer.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._own_http:
            await self.http.close()

    def probe(self) -> float:
        """Seconds since the last full resync pass; raises (the liveness endpoint answers 500)
        when a loop has died or the resync is more than three intervals late."""
        for task in self._tasks:
            if task.done():
                raise RuntimeError(f"the task {task.get_name()!r} has stopped")
        age = time.time() - (self.last_resync or self.started_at)
        if age > 3 * self.settings.resync_interval_seconds + 60:
            raise RuntimeError(f"no resync pass for {age:.0f}s")
        return round(age, 1)

    def _child_changed(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """A child or pod changed (someone else's write, a pod's progress, the echo of our own
        apply): reconcile its owner CHILD_EVENT_COALESCE_SECONDS later in a task of its own (the
        watch keeps reading); the events of one object meanwhile make that one run, which reads
        only the cache."""
        if kind == "ReplicaSet":
            # Only a pruned revision matters here (its ConfigMap may go); the Deployment's own
            # events tell a rollout's progress.
            key = pod_owner_key(obj) if event_type == "DELETED" else None
        else:
            key = pod_owner_key(obj) if kind == "Pod" else owner_key(obj)
        if key is None or key not in self.bodies:
            return  # not ours, or its owner is not known yet (its first event reconciles it)
        if kind == "Pod" and event_type != "DELETED" and pod_ready(obj) and self.settings.upstream_data_interval_seconds:
            slot = self._slots.get(key)
            asked = slot.upstream.pod if slot is not None and slot.upstream is not None else None
            newest = self._upstream_pod(key)
            if newest is not None and newest["metadata"]["name"] != asked:
                self._ask_upstream_later(key)  # another pod is the one to ask (first Ready, a rollout's)
        if event_type == "DELETED" and kind not in ("Pod", "ReplicaSet"):  # a pruned revision is routine
            # Owner references collect the children of a deleted object; a deletion that kopf's
            # watch never delivered (it relisted after a disconnect, and a relist reports no
            # deletions) would otherwise have us re-create them, again and again.
            self._slots.setdefault(key, _Slot()).verify_owner = True
        self._later(self._child_events, key, CHILD_EVENT_COALESCE_SECONDS,
                    kind.lower() if event_type != "DELETED" else f"{kind.lower()}-deleted")

    def _reconcile_soon(self, key: Key, trigger: str) -> None:
        """Reconcile in a task of its own (the watch that noticed keeps reading)."""
        task = asyncio.create_task(self._reconcile_owner(key, trigger))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _reconcile_owner(self, key: Key, trigger: str) -> None:
        try:
            await self.reconcile_key(key, trigger)
        except ApiException as err:
            log.warning("reconcile of %s/%s after a %s event failed: %s %s (retrying in %.0fs)",
                        *key, trigger, err.status, err.reason, RETRY_SECONDS)
            self._recheck_later(key, RETRY_SECONDS, "retry")
        except Exception:  # noqa: BLE001 - never lose the watch over one object (a timeout, a reset)
            log.exception("reconcile of %s/%s after a %s event failed (retrying in %.0fs)", *key, trigger,
                          RETRY_SECONDS)
            self._recheck_later(key, RETRY_SECONDS, "retry")

    # --- bookkeeping from the watch ---------------------------------------------------------

    def observe(self, body: dict[str, Any], deleted: bool = False) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if deleted:
            self.bodies.pop(key, None)
            self.blocked.discard(key)
            self._slots.pop(key, None)
        elif is_newer(body, self.bodies.get(key)):
            # A watch event may trail our own status write; never go back to an older version.
            self.bodies[key] = body
        metrics.MANAGED_OBJECTS.set(len(self.bodies))
        metrics.BLOCKED_OBJECTS.set(len(self.blocked))

    def observe_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event of a ChatTTSDeployment (kopf's; type None: its initial list). The
        object is reconciled when it is new to this process (created, or resumed after a
        restart) or when what it asks for changed: its generation (the spec), labels or
        annotations. Our own status writes change none of them and trigger nothing."""
        if event_type == "DELETED":
            self.observe(body, deleted=True)
            return
        self.observe(body)
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        inputs = (meta.get("uid"), meta.get("generation"), meta.get("labels"), meta.get("annotations"),
                  bool(meta.get("deletionTimestamp")))
        slot = self._slots.setdefault(key, _Slot())
        if slot.triggered_by == inputs:
            return
        trigger = "resume" if event_type is None else "create" if slot.triggered_by is None else "update"
        slot.triggered_by = inputs
        if trigger != "resume":
            slot.change_seen_at = slot.change_seen_at or time.monotonic()
        self._reconcile_soon(key, trigger)

    def share_policy_changed(self, name: str, *, exists: bool) -> None:
        """A GPUSharePolicy came, changed or went: the objects labelled into it reconcile (their
        SharePolicy condition), when its existence is news."""
        if self._share_policies.get(name) == exists:
            return
        self._share_policies[name] = exists
        for key, body in list(self.bodies.items()):
            if ((body.get("metadata") or {}).get("labels") or {}).get(SHARE_POLICY_LABEL) == name:
                self._reconcile_soon(key, "share-policy")

    async def _share_policy_exists(self, name: str) -> bool:
        if name not in self._share_policies:
            self._share_policies[name] = await self.kube.get_metadata("GPUSharePolicy", None, name) is not None
        return self._share_policies[name]

    # --- entry points -----------------------------------------------------------------------

    async def reconcile_key(self, key: Key, trigger: str) -> str | None:
        """Reconcile the object last seen under ``key``. While a run is waiting for the lock,
        further triggers return at once: the waiting run reads the newest of everything."""
        if key not in self.bodies:
            return None
        slot = self._slots.setdefault(key, _Slot())
        if slot.queued:
            return "coalesced"
        slot.queued = True
        async with slot.lock:
            slot.queued = False
            body = self.bodies.get(key)
            if body is not None and slot.verify_owner:
                slot.verify_owner = False
                body = await self._still_there(key, body)
            if body is None:
                return None
            if slot.change_seen_at is not None and slot.change_started_at is None:
                slot.change_started_at = time.monotonic()
            return await self._reconcile_timed(body, trigger)

    async def _still_there(self, key: Key, body: dict[str, Any]) -> dict[str, Any] | None:
        """The object as the API server has it now (one read), or None after forgetting it when it
        is gone, or when a new object of the same name replaced it (its own first event comes)."""
        live = await self.kube.get(KIND, *key)
        if live is None or live["metadata"].get("uid") != body["metadata"].get("uid"):
            log.info("%s/%s is gone (its deletion was not seen): forgetting it", *key)
            self.observe(body, deleted=True)
            return None
        self.observe(live)
        return self.bodies.get(key)

    async def resync_once(self) -> None:
        semaphore = asyncio.Semaphore(self.settings.resync_concurrency)

        async def one(key: Key) -> None:
            async with semaphore:
                try:
                    await self.reconcile_key(key, "resync")
                except Exception:  # noqa: BLE001 - one bad object must not stop the pass
                    log.exception("resync of %s/%s failed", *key)

        await asyncio.gather(*(one(key) for key in list(self.bodies)))
        self.last_resync = time.time()
        metrics.RESYNC_LAST_SUCCESS.set(self.last_resync)

    async def resync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_interval_seconds)
            self.nodes.invalidate()
            await self.resync_once()

    # --- which upstream data the pods found (UpstreamData) ------------------------------------

    async def upstream_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.upstream_data_interval_seconds)
            semaphore = asyncio.Semaphore(self.settings.resync_concurrency)

            async def one(key: Key) -> None:
                async with semaphore:
                    try:
                        await self.ask_upstream(key)
                    except Exception:  # noqa: BLE001 - one object's question must not stop the loop
                        log.exception("asking %s/%s's pods for their upstream data failed", *key)

            await asyncio.gather(*(one(key) for key in list(self.bodies)))

    def _upstream_pod(self, key: Key) -> dict[str, Any] | None:
        """The pod to ask: the newest Ready serving pod (a rollout's new config first), from the cache."""
        ready = [p for p in self.cache.items("Pod", key[0], selector_labels(key[1])) if pod_ready(p)]
        return max(ready, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]),
                   default=None)

    def _ask_upstream_later(self, key: Key, delay: float = CHILD_EVENT_COALESCE_SECONDS) -> None:
        if key in self._upstream_asks:
            return

        async def later() -> None:
            await asyncio.sleep(delay)
            self._upstream_asks.pop(key, None)
            try:
                await self.ask_upstream(key)
            except Exception:  # noqa: BLE001 - the next pass asks again
                log.exception("asking %s/%s's pods for their upstream data failed", *key)

        self._upstream_asks[key] = asyncio.create_task(later(), name=f"chattts-upstream-data {key[0]}/{key[1]}")

    async def ask_upstream(self, key: Key) -> None:
        """Ask the object's newest Ready pod's /health which upstream data it found; reconcile the
        object only when the answer changes its UpstreamData condition. A pod that cannot be read
        is an answer (Unknown), not an error."""
        pod = self._upstream_pod(key)
        if pod is None:
            answer = HealthAnswer(pod=None)
        else:
            name = pod["metadata"]["name"]
            url = self.http.url(pod, "/health", port=HTTP_PORT)
            try:
                if url is None:
                    raise PodHttpError("no pod IP yet")
                answer = HealthAnswer(pod=name, health=await self.http.get_json(
                    url, self.settings.upstream_data_timeout_seconds))
            except PodHttpError as err:
                answer = HealthAnswer(pod=name, error=str(err))
        body = self.bodies.get(key)
        if body is None:
            return  # gone meanwhile
        slot = self._slots.setdefault(key, _Slot())
        before, slot.upstream = slot.upstream, answer
        new = upstream_data_condition(answer, 0)
        live = next((c for c in (body.get("status") or {}).get("conditions") or []
                     if c.get("type") == "UpstreamData"), {})
        said = upstream_data_condition(before, 0) if before is not None else None

        def differs(old: dict[str, Any] | None) -> bool:
            return old is None or any(old.get(f) != new[f] for f in ("status", "reason", "message"))

        # The same answer again while its status write still waits reconciles nothing more.
        if differs(live) and differs(said):
            if new["status"] != "True":
                log.info("%s/%s: UpstreamData %s %s: %s", *key, new["status"], new["reason"], new["message"])
            self._reconcile_soon(key, "upstream-data")

    # --- the reconcile ------------------------------------------------------------------------

    async def _reconcile_timed(self, body: dict[str, Any], trigger: str) -> str:
        started = time.perf_counter()
        try:
            result = await self._reconcile(body)
        except Exception as err:
            metrics.RECONCILES.labels(trigger, "error").inc()
            metrics.RECONCILE_ERRORS.labels(type(err).__name__).inc()
            raise
        finally:
            metrics.RECONCILE_DURATION.labels(trigger).observe(time.perf_counter() - started)
        metrics.RECONCILES.labels(trigger, result).inc()
        return result

    async def _reconcile(self, body: dict[str, Any]) -> str:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp"):
            return "deleting"  # owner references collect the children
        previous_status = body.get("status") or {}
        try:
            spec = self._parsed_spec(key, body)
        except InvalidSpec as err:
            await self._write_invalid_status(body, previous_status, str(err))
            return "invalid"
        # AWQ quantization (api/quantization.py): the Job, and which weights the pods mount.
        quantization = await self.quantization(body, spec, previous_status)
        desired = self._desired(key, body, spec, quantization, await self.nodes.largest_gpu_mib())
        slot = self._slots.get(key)
        if slot is not None and slot.change_started_at is not None and slot.change_built_at is None:
            slot.change_built_at = time.monotonic()
        observed = Observed(live_deployment=None)
        applied_any = await self._apply_children(key, desired, observed)
        if desired.network_policy is None and await self._prune_network_policy(desired.owner):
            applied_any = True
        if await self._reconcile_claims(desired, previous_status, observed):
            applied_any = True
        if await self._prune_runtime_configmaps(desired, observed):
            applied_any = True
        if desired.spec.auth is not None:
            observed.api_keys_secret = await self._api_keys_secret(desired.owner.namespace,
                                                                   desired.spec.auth.secret_name)
        policy = (meta.get("labels") or {}).get(SHARE_POLICY_LABEL)
        if policy:
            observed.share_policy = (policy, await self._share_policy_exists(policy))
        if not desired.rollout_allowed:
            # Nothing applied over the Deployment: report the one that serves, if any.
            observed.live_deployment = await self.cache.get("Deployment", desired.owner.namespace, desired.owner.name)
            self.blocked.add(key)
        else:
            self.blocked.discard(key)
        metrics.BLOCKED_OBJECTS.set(len(self.blocked))
        observed.pods = self.cache.items("Pod", desired.owner.namespace, selector_labels(desired.owner.name))
        observed.upstream = self._slots[key].upstream if key in self._slots else None

        if observed.dra is not None and observed.dra["allocatedClaims"] < observed.dra["claims"]:
            self._recheck_later(key)
        status = compute_status(desired, observed, previous_status, rfc3339())
        if quantization is not None and quantization.condition is not None:
            status["conditions"] = status["conditions"] + merge_conditions(
                previous_status.get("conditions") or [], [quantization.condition], rfc3339())
            status["quantization"] = quantization.status
        elif previous_status.get("quantization") is not None:
            status["quantization"] = None
        slot = self._slots.get(key)
        writing = slot is not None and slot.status_writer is not None and not slot.status_writer.done()
        if writing or status_changed(status, previous_status):
            # While a status computed from an older view still waits or is being written, this one
            # follows it even when it equals what this reconcile read (the writer skips it if it
            # then equals what is live): else the older one would be the last word.
            self._queue_status(key, status)
        if applied_any:
            return "applied"
        return "blocked" if not desired.rollout_allowed else "noop"

    async def _apply_children(self, key: Key, desired: Desired, observed: Observed) -> bool:
        """Server-side apply every child that differs from its cached self, all at once (the
        ConfigMap is content-addressed: the Deployment may land first, its new pods wait for
        their volume). A refusal (e.g. a field this cluster does not support) goes to status;
        a transient error is raised once the others' answers are stored. True when any was applied."""
        wanted = desired.children()
        protected = await self._apply_protection(key, desired, observed)
        if desired.network_policy is not None:
            wanted = [c for c in wanted if c is not desired.network_policy]
        if observed.protection_error is not None:
            wanted = _unprotected_children(wanted, held=observed.protection_held)
        lives = [await self.cache.get(c["kind"], c["metadata"]["namespace"], c["metadata"]["name"]) for c in wanted]
        stale = [i for i, (child, live) in enumerate(zip(wanted, lives)) if needs_apply(child, live)]
        answers = await asyncio.gather(*(self.kube.apply(wanted[i]) for i in stale), return_exceptions=True)
        transient: BaseException | None = None
        refused: set[str] = set()
        for i, answer in zip(stale, answers):
            kind, name = wanted[i]["kind"], wanted[i]["metadata"]["name"]
            if isinstance(answer, ApiException) and not (answer.status in (409, 429) or answer.status >= 500):
                observed.apply_error = observed.apply_error or f"applying {kind} {name}: {answer.status} {_api_message(answer)}"
                log.warning("%s/%s: applying %s %s: %s %s", *key, kind, name, answer.status, _api_message(answer))
                refused.add(kind)
            elif isinstance(answer, BaseException):
                transient = transient or answer  # the next trigger, or the retry, applies it
            else:
                self.cache.remember(answer)
                metrics.CHILD_WRITES.labels(kind).inc()
                lives[i] = answer
        if transient is not None:
            raise transient
        if observed.protection_held:
            # The pods that serve keep the policy applied before: report their Deployment.
            observed.live_deployment = await self.cache.get("Deployment", desired.owner.namespace, desired.owner.name)
        elif observed.protection_error is not None and not any(c["kind"] == "Deployment" for c in wanted):
            # A spec that cannot start (blocked) applies no Deployment: the one serving an earlier,
            # unfenced generation goes to 0 all the same.
            live = await self.cache.get("Deployment", desired.owner.namespace, desired.owner.name)
            if live is not None and int((live.get("spec") or {}).get("replicas") or 0) > 0:
                await self.kube.scale("Deployment", desired.owner.namespace, desired.owner.name, 0,
                                      field_manager=FIELD_MANAGER)
                metrics.CHILD_WRITES.labels("Deployment").inc()
        for child, live in zip(wanted, lives):
            if child["kind"] == "Deployment" and "Deployment" not in refused:
                observed.live_deployment = live
                # Its generation is applied only with its config and claim template, and protected.
                observed.deployment_applied = (not refused & {"ConfigMap", "ResourceClaimTemplate"}
                                               and observed.protection_error is None)
                slot = self._slots.get(key)
                if slot is not None and slot.change_seen_at is not None:
                    _observe_spec_change(slot, time.monotonic())
        return protected or (bool(stale) and len(refused) < len(stale))

    async def _apply_protection(self, key: Key, desired: Desired, observed: Observed) -> bool:
        """Apply the NetworkPolicy before anything that serves (never fail open). A refusal is
        recorded in ``observed``: the caller then holds the rollout where a policy of ours
        still fences the pods (the last protected state), else serves nothing. A transient
        error is raised before any serving child is applied. True when it was applied."""
        policy = desired.network_policy
        if policy is None:
            return False
        namespace, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
        live = await self.cache.get("NetworkPolicy", namespace, name)
        if not needs_apply(policy, live):
            return False
        try:
            answer = await self.kube.apply(policy)
        except ApiException as err:
            if err.status in (409, 429) or err.status >= 500:
                raise
            observed.protection_error = f"applying NetworkPolicy {name}: {err.status} {_api_message(err)}"
            observed.protection_held = live is not None and any(
                ref.get("uid") == desired.owner.uid for ref in live["metadata"].get("ownerReferences") or [])
            log.warning("%s/%s: %s (%s)", *key, observed.protection_error,
                        "rollout held" if observed.protection_held else "serving nothing")
            return False
        self.cache.remember(answer)
        metrics.CHILD_WRITES.labels("NetworkPolicy").inc()
        return True

    async def _prune_runtime_configmaps(self, desired: Desired, observed: Observed) -> bool:
        """Delete the runtime ConfigMaps no ReplicaSet of the Deployment mounts any more (spec.py
        ``stale_runtime_configmaps``), read from the cache: no request unless one goes, and
        nothing before the ReplicaSets' watch has listed. True when one was deleted."""
        owner = desired.owner
        if not self.cache.listed("ReplicaSet", owner.namespace) or not self.cache.listed("ConfigMap", owner.namespace):
            return False
        labels = selector_labels(owner.name)
        live = observed.live_deployment or await self.cache.get("Deployment", owner.namespace, owner.name)
        in_use = {desired.configmap["metadata"]["name"], mounted_configmap(live or {}) or ""}
        stale = stale_runtime_configmaps(owner, in_use, self.cache.items("ConfigMap", owner.namespace, labels),
                                         self.cache.items("ReplicaSet", owner.namespace, labels))
        configmaps = {cm["metadata"]["name"]: cm for cm in self.cache.items("ConfigMap", owner.namespace, labels)}
        for name in stale:
            # Forgotten first: the echo of our own delete is no child vanishing (nothing to check).
            self.cache.forget("ConfigMap", owner.namespace, name)
            try:
                await self.kube.delete("ConfigMap", owner.namespace, name)
            except BaseException:
                self.cache.remember(configmaps[name])  # still there: the next reconcile tries again
                raise
            metrics.CHILD_WRITES.labels("ConfigMap").inc()
        return bool(stale)

    def _parsed_spec(self, key: Key, body: dict[str, Any]) -> ChatTTSDeploymentSpec:
        """The validated spec, parsed once per generation (the spec changes only with it)."""
        meta = body["metadata"]
        slot = self._slots.setdefault(key, _Slot())
        version = (meta.get("uid"), meta.get("generation"))
        if slot.spec is None or slot.spec_version != version:
            slot.spec, slot.spec_version = parse_spec(body), version
        return slot.spec

    def _desired(self, key: Key, body: dict[str, Any], spec: ChatTTSDeploymentSpec,
                 quantization: QuantizationPlan | None, largest_node_gpu_mib: int | None) -> Desired:
        """The desired state, rebuilt only when one of its inputs changed (building it renders
        and hashes every child: most of a reconcile's CPU before this cache)."""
        meta = body["metadata"]
        override = quantization.model_override if quantization is not None else None
        tuning = ((body.get("status") or {}).get("autoscaling") or {}).get("batchTokenTuning") or {}
        # Everything desired_state reads besides the spec (the generation stands for it).
        inputs = (meta.get("uid"), meta.get("generation"), SHARE_POLICY_LABEL in (meta.get("labels") or {}),
                  (meta.get("annotations") or {}).get(REPLICA_CAP_ANNOTATION),
                  (meta.get("annotations") or {}).get(POOL_AFFINITY_ANNOTATION), tuning.get("maxNumBatchedTokens"),
                  json.dumps(override, sort_keys=True), largest_node_gpu_mib)
        slot = self._slots.setdefault(key, _Slot())
        if slot.desired is not None and slot.desired_inputs == inputs:
            return slot.desired
        if spec.priority_class_name is None and SHARE_POLICY_LABEL in (meta.get("labels") or {}):
            # A GPUSharePolicy member serves in the online class: its pods may preempt offline work.
            spec = spec.model_copy(update={"priority_class_name": ONLINE_PRIORITY_CLASS})
        if override is not None:
            spec = spec.model_copy(update={"model": ModelSpec.model_validate(override)})
        slot.desired = desired_state(body, spec, self.settings, largest_node_gpu_mib=largest_node_gpu_mib)
        slot.desired_inputs = inputs
        return slot.desired

    async def _reconcile_claims(self, desired: Desired, previous_status: dict[str, Any], observed: Observed) -> bool:
        """dra profile: read the serving pods' claims (what the scheduler allocated) and, while a
        pod waits, the scheduler's reason, for status; once a rollout is complete, delete the
        templates of an earlier request (or of a profile left behind: until then its claims
        stay in status). Nothing is read for an object that never used the profile. True when
        a template was deleted."""
        gpu = desired.gpu
        dra_now = gpu is not None and gpu.dra is not None and desired.rollout_allowed
        if not dra_now and ((previous_status.get("gpu") or {}).get("dra")) is None:
            return False
        owner = desired.owner
        selector = selector_string(owner.name)
        current = (desired.resource_claim_template or {}).get("metadata", {}).get("name", "") if dra_now else ""
        pruned, stale_left = False, False
        for template in await self.kube.list_namespaced("ResourceClaimTemplate", owner.namespace, selector):
            name = template["metadata"]["name"]
            if name == current or not any(r.get("uid") == owner.uid for r in template["metadata"].get("ownerReferences") or []):
                continue
            if not desired.rollout_allowed or not rollout_complete(observed.live_deployment):
                stale_left = True  # the pods that serve (or a rollout's old ones) may still need it
                continue
            await self.kube.delete("ResourceClaimTemplate", owner.namespace, name)
            metrics.CHILD_WRITES.labels("ResourceClaimTemplate").inc()
            pruned = True
        claims = await self.kube.list_namespaced("ResourceClaim", owner.namespace, selector)
        if not (dra_now or claims or stale_left):
            return pruned
        # A device handed out whole (no consumable capacity) counts as at least what was asked.
        observed.dra = dra_allocation_status(current, gpu.dra.device_class if dra_now else self.settings.dra_device_class,
                                             claims, self.gpu_codec, gpu.memory_per_gpu_mib if gpu else 0)
        ready = int(((observed.live_deployment or {}).get("status") or {}).get("readyReplicas") or 0)
        if dra_now and (observed.dra["allocatedClaims"] < observed.dra["claims"] or ready < desired.replicas):
            observed.unschedulable = unschedulable_message(
                self.cache.items("Pod", owner.namespace, selector_labels(owner.name)))
        return pruned

    def _recheck_later(self, key: Key, delay: float = DRA_PENDING_RECHECK_SECONDS, trigger: str = "dra-pending") -> None:
        """One follow-up reconcile of ``key`` after ``delay`` (at most one waits per object)."""
        self._later(self._rechecks, key, delay, trigger)

    def _later(self, waiting: dict[Key, asyncio.Task], key: Key, delay: float, trigger: str) -> None:
        """A reconcile of ``key`` after ``delay``, unless one is already waiting in ``waiting``."""
        if key in waiting:
            return

        async def later() -> None:
            await asyncio.sleep(delay)
            waiting.pop(key, None)
            await self._reconcile_owner(key, trigger)

        waiting[key] = asyncio.create_task(later(), name=f"chattts-{trigger} {key[0]}/{key[1]}")

    async def _prune_network_policy(self, owner: Owner) -> bool:
        """Delete the NetworkPolicy this object made before, now that none is wanted (a read
        from the cache, when there is none). True when one was deleted."""
        live = await self.cache.get("NetworkPolicy", owner.namespace, network_policy_name(owner.name))
        refs = (live or {}).get("metadata", {}).get("ownerReferences") or []
        if not any(ref.get("uid") == owner.uid for ref in refs):
            return False  # none, or not ours: leave it alone
        await self.kube.delete("NetworkPolicy", owner.namespace, network_policy_name(owner.name))
        self.cache.forget("NetworkPolicy", owner.namespace, network_policy_name(owner.name))
        metrics.CHILD_WRITES.labels("NetworkPolicy").inc()
        return True

    async def _api_keys_secret(self, namespace: str, name: str) -> str:
        """Whether spec.auth's Secret exists: found, missing or unchecked (the check is off,
        or this operator may not get Secrets). Only its metadata is read, never its data."""
        if not self.settings.api_key_secret_check:
            return SECRET_UNCHECKED  # no request RBAC would refuse on every reconcile
        try:
            found = await self.kube.get_metadata("Secret", namespace, name)
        except ApiException as err:
            if err.status != 403:
                raise
            return SECRET_UNCHECKED
        return SECRET_FOUND if found is not None else SECRET_MISSING

    def _queue_status(self, key: Key, status: dict[str, Any]) -> None:
        """Have ``status`` written (replacing any status of this object still waiting)."""
        slot = self._slots.setdefault(key, _Slot())
        slot.status_queued = status
        if slot.status_writer is None or slot.status_writer.done():
            slot.status_writer = asyncio.create_task(self._write_status(key, slot),
                                                     name=f"chattts-status {key[0]}/{key[1]}")

    async def _write_status(self, key: Key, slot: _Slot) -> None:
        """Patch the newest queued status once a low-priority slot is free, until none is
        queued; then post an Event for each condition that changed from what was there."""
        while slot.status_queued is not None:
            await asyncio.sleep(self.settings.status_coalesce_seconds)
            before: dict[str, Any] = {}

            def newest() -> dict[str, Any] | None:
                nonlocal before
                status, slot.status_queued = slot.status_queued, None
                body = self.bodies.get(key)
                if status is None or body is None:
                    return None  # nothing left, or the object is gone
                before = body.get("status") or {}
                return status if status_changed(status, before) else None

            try:
                written = await self.kube.patch_status_latest(KIND, key[0], key[1], newest)
            except ApiException as err:
                if err.status != 404:  # 404: deleted meanwhile
                    log.warning("status of %s/%s: %s %s (retrying in %.0fs)", *key, err.status, err.reason,
                                RETRY_SECONDS)
                    self._recheck_later(key, RETRY_SECONDS, "retry")
                return
            except Exception:  # noqa: BLE001 - a timeout, a refused connection: reconcile and queue it again
                log.exception("status of %s/%s could not be written (retrying in %.0fs)", *key, RETRY_SECONDS)
                self._recheck_later(key, RETRY_SECONDS, "retry")
                return
            if written is None:
                continue
            status, updated = written
            metrics.STATUS_WRITES.inc()
            body = self.bodies.get(key)
            if body is None:
                return
            if isinstance(updated, dict) and updated.get("metadata"):
                # Our own write is the freshest view until the watch catches up.
                self.observe(updated)
            for event_type, reason, message in transitions(before.get("conditions") or [], status["conditions"]):
                await self._post_event(body, event_type, reason, message)

    async def _write_invalid_status(self, body: dict[str, Any], previous: dict[str, Any], message: str) -> None:
        gen = int(body["metadata"].get("generation") or 1)
        invalid = condition("Degraded", True, "InvalidSpec", message, generation=gen)
        status = {"observedGeneration": gen, "phase": "Invalid",
                  "conditions": replace_condition(previous.get("conditions"), invalid, rfc3339())}
        meta = body["metadata"]
        slot = self._slots.get((meta["namespace"], meta["name"]))
        if slot is not None:
            slot.status_queued = None  # a status of the valid spec before must not follow this one
        if not status_changed(status, previous):
            return
        try:
            updated = await self.kube.patch_status(KIND, meta["namespace"], meta["name"], status)
        except ApiException as err:
            if err.status == 404:
                return  # deleted meanwhile
            raise
        metrics.STATUS_WRITES.inc()
        if (meta["namespace"], meta["name"]) in self.bodies and isinstance(updated, dict) and updated.get("metadata"):
            self.observe(updated)
        await self._post_event(body, "Warning", "InvalidSpec", message)

    async def roll_out_tuned(self, body: dict[str, Any]) -> None:
        """The autoscaler tuned an engine setting (its value in ``body``'s status): take the object
        and reconcile it now rather than at the next resync."""
        self.observe(body)
        meta = body["metadata"]
        await self.reconcile_key((meta["namespace"], meta["name"]), "batch-token-tuning")

    async def _post_event(self, body: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        """A core/v1 Event on the ChatTTSDeployment; failures are logged, never fatal."""
        await self.kube.post_event(event_subject(body), event_type, reason, message)


def _unprotected_children(wanted: list[dict[str, Any]], *, held: bool) -> list[dict[str, Any]]:
    """The children to apply while the NetworkPolicy is refused: held (a policy of ours still
    fences the pods), no new config or pod template; else the Deployment at 0 replicas, so no
    pod serves without the fence (the next apply that is protected restores the replicas)."""
    if held:
        return [c for c in wanted if c["kind"] not in ("ConfigMap", "ResourceClaimTemplate", "Deployment")]
    out = []
    for child in wanted:
        if child["kind"] == "Deployment":
            child = {**child, "spec": {**child["spec"], "replicas": 0}}
        out.append(child)
    return out


def _observe_spec_change(slot: _Slot, applied_at: float) -> None:
    """Record a spec change's span (and its stages) once its Deployment is applied or current."""
    seen = slot.change_seen_at
    metrics.SPEC_CHANGE_SECONDS.observe(applied_at - seen)
    started = slot.change_started_at or seen
    built = slot.change_built_at or started
    for stage, seconds in (("queued", started - seen), ("built", built - started), ("applied", applied_at - built)):
        metrics.SPEC_CHANGE_STAGE_SECONDS.labels(stage).observe(max(0.0, seconds))
    slot.change_seen_at = slot.change_started_at = slot.change_built_at = None


def _api_message(err: ApiException) -> str:
    """The API server's own message from an error response, else the HTTP reason."""
    try:
        body = json.loads(err.body) if err.body else {}
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or err.reason)


def owner_key(child: dict[str, Any]) -> Key | None:
    """The ChatTTSDeployment controlling a child, from its owner reference."""
    meta = child.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(API_VERSION.split("/")[0]) \
                and ref.get("controller"):
            return meta.get("namespace"), ref.get("name")
    return None


def pod_owner_key(pod: dict[str, Any]) -> Key | None:
    """The ChatTTSDeployment whose serving pod this is (its ReplicaSet owns it; the instance
    label names the ChatTTSDeployment)."""
    meta = pod.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_INSTANCE)
    return (meta.get("namespace"), name) if name else None
