"""The operator's one Kubernetes client: read, list, server-side apply, merge patches,
status, scale, Events, GPU nodes. Every feature talks to the API server through ``Kube``.

Why kubernetes_asyncio (and not the sync ``kubernetes`` client in threads, or lightkube):
kopf runs every handler on one asyncio loop, so a blocking client would stall all objects
while one request waits; threads would work but cost a thread per in-flight request and
make cancellation on shutdown messy. kubernetes_asyncio is the official client's async
twin, already a dependency, and kopf 1.45 understands its objects. We call its generic
``ApiClient.call_api`` with raw dicts rather than its typed models: our builders produce
dicts, server-side apply wants exactly the fields we own, and round-tripping through the
typed models would add every unset field as ``null``.

Server-side apply (``application/apply-patch+yaml``, field manager ``chattts-operator``,
``force=true``): the API server merges our intent field by field, takes back fields a
person edited by hand, removes fields we stop declaring, and leaves alone fields other
managers own (an HPA's replicas on *other* objects, defaulted fields).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from chattts_operator.api.chattts import GROUP, PLURAL, VERSION
from chattts_operator.api.sharepolicy import PLURAL as SHARE_POLICY_PLURAL
from chattts_operator.core import metrics
from chattts_operator.core.events import event_manifest
from chattts_operator.core.labels import FIELD_MANAGER

log = logging.getLogger("chattts_operator.kube")
MERGE_PATCH = "application/merge-patch+json"
# Requests in flight at most (watches not counted). kopf runs a handler per object at once, so
# a burst of N new objects would put N requests on the API server; there, Service creations
# (ClusterIP allocation is serialised) time out with 504 and every failed handler retries 5 s
# later, all together: at N=1000 that never converged (bench/results/operator-scale-findings.md).
MAX_IN_FLIGHT = 32
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class Priority(enum.IntEnum):
    """Who gets a free request slot first. A spec change's child applies must not queue
    behind the status refreshes of earlier rollouts (the reaction time at 1,000 objects was
    mostly that wait), and status is coalesced while it waits (see ``patch_status_latest``)."""

    HIGH = 0  # reads, applies, creates, deletes, scale: what makes the cluster follow a spec
    LOW = 1  # status patches and Events: observations, fine a moment later


class RequestSlots:
    """A semaphore of ``size`` whose waiters are served by priority, then in arrival order."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiting: dict[Priority, collections.deque[asyncio.Future]] = {p: collections.deque() for p in Priority}

    @contextlib.asynccontextmanager
    async def held(self, priority: Priority) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: Priority) -> None:
        if self.free > 0:
            self.free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting[priority].append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # the slot was handed to us as we were cancelled: pass it on
            raise

    def _release(self) -> None:
        for priority in Priority:
            queue = self._waiting[priority]
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)  # the slot goes straight to the waiter
                    return
        self.free += 1

# kind -> (API path prefix, plural, namespaced) for the objects the operator touches.
_PATHS: dict[str, tuple[str, str, bool]] = {
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Service": ("/api/v1", "services", True),
    "Pod": ("/api/v1", "pods", True),
    "Secret": ("/api/v1", "secrets", True),  # metadata only (get_metadata), never the data
    "Event": ("/api/v1", "events", True),
    "Node": ("/api/v1", "nodes", False),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ChatTTSDeployment": (f"/apis/{GROUP}/{VERSION}", PLURAL, True),
    "GPUSharePolicy": (f"/apis/{GROUP}/{VERSION}", SHARE_POLICY_PLURAL, False),
}


def collection_path(kind: str, namespace: str | None = None) -> str:
    """The collection of ``kind`` in ``namespace``; None (or a cluster-scoped kind): cluster-wide."""
    prefix, plural, namespaced = _PATHS[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespaced and namespace else f"{prefix}/{plural}"


def object_path(kind: str, namespace: str | None, name: str, subresource: str | None = None) -> str:
    path = f"{collection_path(kind, namespace)}/{name}"
    return f"{path}/{subresource}" if subresource else path


def resource_of(path: str) -> str:
    """The resource a request path names: /api/v1/namespaces/x/configmaps/y -> configmaps;
    a subresource is appended (chattsdeployments/status)."""
    parts = [p for p in path.split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:]  # drop api/v1 or apis/<group>/<version>
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    resource = parts[0] if parts else ""
    return f"{resource}/{parts[2]}" if len(parts) > 2 else resource




async def make_api_client() -> client.ApiClient:
    """In a pod: the ServiceAccount; elsewhere: $KUBECONFIG or ~/.kube/config."""
    configuration = client.Configuration()
    if _in_cluster():
        config.load_incluster_config(client_configuration=configuration)
    else:
        # Read $KUBECONFIG now: the client's own default is frozen when it is imported.
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    api = client.ApiClient(configuration)
    distrust_env(api)
    return api


def distrust_env(api: client.ApiClient) -> None:
    """Give the client a session that does not consult the environment on every request.

    kubernetes_asyncio's session has ``trust_env=True``, so aiohttp looks up ~/.netrc and the
    proxy variables for each request, in two thread-pool round trips the request waits for
    (at 1,000 objects that was ~15% of the operator's samples, and each request's send waited
    for two extra turns of a busy loop). kopf's own client does the same as this one
    (``settings.networking.trust_env`` is False by default); a kubeconfig's ``proxy-url``
    (``configuration.proxy``) is passed with every request and still works."""
    rest = api.rest_client
    session = rest.pool_manager
    connector = session.connector
    session.detach()  # the connector (TLS context, pool limit) moves to the new session
    # read_bufsize as kubernetes_asyncio sets it: a watch event of a large object exceeds aiohttp's default.
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**21)


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")


class Kube:
    """Thin async wrapper; every method is one HTTP request."""

    def __init__(self, api: client.ApiClient, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.api = api
        self.writes = 0  # requests that may change the cluster (for metrics and tests)
        self.slots = RequestSlots(max_in_flight)

    async def _call(self, method: str, path: str, *, body: Any = None, query: list[tuple[str, str]] | None = None,
                    content_type: str = "application/json", accept: str = "application/json",
                    priority: Priority = Priority.HIGH) -> Any:
        async with self.slots.held(priority):
            return await self._request(method, path, body=body, query=query, content_type=content_type,
                                       accept=accept)

    async def _request(self, method: str, path: str, *, body: Any, query: list[tuple[str, str]] | None,
                       content_type: str = "application/json", accept: str = "application/json") -> Any:
        """One request; the caller holds a slot."""
        metrics.API_REQUESTS.labels(method, resource_of(path)).inc()
        data, _status, _headers = await self.api.call_api(
            path,
            method,
            query_params=query or [],
            header_params={"Accept": accept, "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            response_types_map={200: "object", 201: "object"},
            _preload_content=True,
        )
        return data

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", object_path(kind, namespace, name))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def get_metadata(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """An object's metadata only (PartialObjectMetadata): e.g. whether a Secret exists,
        without its data ever reaching the operator. None when it does not exist."""
        try:
            return await self._call("GET", object_path(kind, namespace, name), accept=PARTIAL_METADATA)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        self.writes += 1
        return await self._call(
            "PATCH",
            object_path(manifest["kind"], meta.get("namespace"), meta["name"]),
            body=manifest,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )

    async def patch_status(self, kind: str, namespace: str | None, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the status subresource (keys set to None are removed), at low priority."""
        return await self.patch(kind, namespace, name, {"status": status}, subresource="status",
                                priority=Priority.LOW)

    async def patch_status_latest(self, kind: str, namespace: str, name: str,
                                  latest: Callable[[], dict[str, Any] | None]) -> tuple[dict[str, Any], Any] | None:
        """A status patch whose content is taken only once a (low-priority) slot is free:
        ``latest()`` returns the status to write then, or None for nothing. So a status that
        changed several times while waiting is written once. Returns (status written, answer)."""
        async with self.slots.held(Priority.LOW):
            status = latest()
            if status is None:
                return None
            self.writes += 1
            answer = await self._request("PATCH", object_path(kind, namespace, name, "status"), body={"status": status},
                                         query=[("fieldManager", FIELD_MANAGER)], content_type=MERGE_PATCH)
            return status, answer

    async def patch(self, kind: str, namespace: str | None, name: str, patch: dict[str, Any], *,
                    subresource: str | None = None, field_manager: str = FIELD_MANAGER,
                    priority: Priority = Priority.HIGH) -> dict[str, Any]:
        """JSON merge patch (keys set to None are removed), e.g. a Job's spec.suspend."""
        self.writes += 1
        return await self._call("PATCH", object_path(kind, namespace, name, subresource), body=patch,
                                query=[("fieldManager", field_manager)], content_type=MERGE_PATCH, priority=priority)

    async def patch_if_exists(self, kind: str, namespace: str | None, name: str,
                              patch: dict[str, Any]) -> dict[str, Any] | None:
        """``patch``; None when the object is gone."""
        try:
            return await self.patch(kind, namespace, name, patch)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def scale(self, kind: str, namespace: str, name: str, replicas: int, *, field_manager: str) -> None:
        """spec.replicas through the scale subresource, under its own field manager."""
        await self.patch(kind, namespace, name, {"spec": {"replicas": replicas}}, subresource="scale",
                         field_manager=field_manager)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", collection_path("Event", namespace), body=event, priority=Priority.LOW)

    async def post_event(self, involved: dict[str, Any], event_type: str, reason: str, message: str, *,
                         component: str = FIELD_MANAGER) -> None:
        """An Event on ``involved`` (core/events.py); a failure is logged, never raised: an
        Event is a courtesy and must not fail the reconcile that posts it."""
        event = event_manifest(involved, event_type, reason, message, component=component)
        try:
            await self.create_event(event["metadata"]["namespace"], event)
        except Exception as err:  # noqa: BLE001 - see the docstring
            meta = involved.get("metadata") or {}
            log.warning("could not post event %s on %s %s/%s: %s", reason, involved.get("kind"),
                        meta.get("namespace"), meta.get("name"), getattr(err, "reason", err))

    async def list_path(self, path: str, label_selector: str) -> dict[str, Any]:
        """A list response of any collection path (the list of a list+watch)."""
        return await self._call("GET", path, query=[("labelSelector", label_selector)])

    async def open_watch(self, path: str, query: list[tuple[str, str]], timeout: float) -> Any:
        """A streaming watch response (aiohttp's; the caller reads lines and releases it)."""
        return await self.api.call_api(
            path, "GET", query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout,
        )

    async def list_raw(self, kind: str, namespace: str | None = None, label_selector: str | None = None) -> dict[str, Any]:
        """The list response itself (items and the list's resourceVersion)."""
        query = [("labelSelector", label_selector)] if label_selector else []
        return await self._call("GET", collection_path(kind, namespace), query=query)

    async def list(self, kind: str, namespace: str | None = None, label_selector: str | None = None) -> list[dict[str, Any]]:
        """Items of ``kind`` (namespace None: cluster-wide), with apiVersion and kind filled in:
        a list's items carry neither, and Events about them need both."""
        data = await self.list_raw(kind, namespace, label_selector)
        api_version = data.get("apiVersion") or ""
        items = list(data.get("items") or [])
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    async def list_in(self, kind: str, namespaces: tuple[str, ...], label_selector: str | None = None) -> list[dict[str, Any]]:
        """Items in each of ``namespaces`` (RBAC may grant only those), or cluster-wide when empty."""
        if not namespaces:
            return await self.list(kind, None, label_selector)
        items: list[dict[str, Any]] = []
        for namespace in namespaces:
            items += await self.list(kind, namespace, label_selector)
        return items

    async def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        return await self.list("Node", None, label_selector)

    async def list_namespaced(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return await self.list(kind, namespace, label_selector)

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """POST; None when it exists already (created once, never re-applied: e.g. a Job
        whose spec.suspend a GPUSharePolicy owns)."""
        meta = manifest["metadata"]
        self.writes += 1
        try:
            return await self._call("POST", collection_path(manifest["kind"], meta.get("namespace")), body=manifest,
                                    query=[("fieldManager", FIELD_MANAGER)])
        except ApiException as err:
            if err.status == 409:
                return None
            raise

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete in the background (dependents too); a missing object is fine."""
        self.writes += 1
        try:
            await self._call("DELETE", object_path(kind, namespace, name),
                             body={"propagationPolicy": "Background"})
        except ApiException as err:
            if err.status != 404:
                raise

    async def close(self) -> None:
        await self.api.close()


@dataclass
class NodeGpuCache:
    """The largest GPU (MiB, from the GFD label) among schedulable nodes, listed at most every
    ``ttl`` seconds: one cheap request instead of a cluster-wide node watch. Once the value
    is only older than ``ttl``, readers get it at once while one task lists again (a reconcile
    must not wait for a node list); after ``invalidate`` they wait for the new list."""

    kube: Kube
    label: str
    ttl: float = 30.0
    _value: int | None = None
    _fetched_at: float = float("-inf")
    _lock: asyncio.Lock | None = None
    _refresh: asyncio.Task | None = None

    async def largest_gpu_mib(self) -> int | None:
        """None when no node carries the label (or it cannot be read): then nothing is blocked on it."""
        if not self.label:
            return None
        age = time.monotonic() - self._fetched_at
        if age < self.ttl:
            return self._value
        if age != float("inf"):  # listed before and not invalidated: serve it, list in the background
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.create_task(self._list(), name="chattts-node-gpu-list")
            return self._value
        return await self._list()

    async def _list(self) -> int | None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if time.monotonic() - self._fetched_at < self.ttl:
                return self._value
            try:
                nodes = await self.kube.list_nodes(self.label)
            except ApiException:
                self._fetched_at = time.monotonic()
                self._value = None
                return None
            sizes = []
            for node in nodes:
                if node.get("spec", {}).get("unschedulable"):
                    continue
                try:
                    sizes.append(int(node["metadata"]["labels"][self.label]))
                except (KeyError, ValueError):
                    continue
            self._value = max(sizes) if sizes else None
            self._fetched_at = time.monotonic()
            return self._value

    def invalidate(self) -> None:
        self._fetched_at = float("-inf")


def is_newer(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether object ``a`` is a later version than ``b`` of the same object. resourceVersions
    are opaque, but equal-or-not is always safe and etcd's are increasing integers: when both
    parse as integers they are compared, otherwise a different version counts as newer."""
    if b is None:
        return True
    if a is None:
        return False
    ra, rb = a.get("metadata", {}).get("resourceVersion"), b.get("metadata", {}).get("resourceVersion")
    if ra == rb:
        return False
    if isinstance(ra, str) and isinstance(rb, str) and ra.isdigit() and rb.isdigit():
        return int(ra) > int(rb)
    return True
