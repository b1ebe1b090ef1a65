"""The operator's Kubernetes I/O: read, server-side apply, write status, list GPU nodes.

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
import os
import time
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from chattts_operator.api.chattts import GROUP, PLURAL, VERSION

FIELD_MANAGER = "chattts-operator"
# Requests in flight at most (watches not counted). kopf runs a handler per object at once, so
# a burst of N new objects would put N requests on the API server; there, Service creations
# (ClusterIP allocation is serialised) time out with 504 and every failed handler retries 5 s
# later, all together: at N=1000 that never converged (bench/results/operator-scale-findings.md).
MAX_IN_FLIGHT = 32

# kind -> (API path prefix, plural) for the objects the operator touches.
_PATHS: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "ChatTTSDeployment": (f"/apis/{GROUP}/{VERSION}", PLURAL),
    "Job": ("/apis/batch/v1", "jobs"),
}


def object_path(kind: str, namespace: str, name: str, subresource: str | None = None) -> str:
    prefix, plural = _PATHS[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}/{name}"
    return f"{path}/{subresource}" if subresource else path


async def make_api_client() -> client.ApiClient:
    """In a pod: the ServiceAccount; elsewhere: $KUBECONFIG or ~/.kube/config."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        # Read $KUBECONFIG now: the client's own default is frozen when it is imported.
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    return client.ApiClient(configuration)


class Kube:
    """Thin async wrapper; every method is one HTTP request."""

    def __init__(self, api: client.ApiClient, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.api = api
        self.writes = 0  # requests that may change the cluster (for metrics and tests)
        self._in_flight = asyncio.Semaphore(max_in_flight)

    async def _call(self, method: str, path: str, *, body: Any = None, query: list[tuple[str, str]] | None = None,
                    content_type: str = "application/json") -> Any:
        async with self._in_flight:
            data, _status, _headers = await self.api.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                response_types_map={200: "object", 201: "object"},
                _preload_content=True,
            )
        return data

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", object_path(kind, namespace, name))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        self.writes += 1
        return await self._call(
            "PATCH",
            object_path(manifest["kind"], meta["namespace"], meta["name"]),
            body=manifest,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )

    async def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the status subresource (keys set to None are removed)."""
        self.writes += 1
        return await self._call(
            "PATCH",
            object_path(kind, namespace, name, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    async def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", f"/api/v1/namespaces/{namespace}/events", body=event)

    async def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        data = await self._call("GET", "/api/v1/nodes", query=[("labelSelector", label_selector)])
        return list(data.get("items") or [])

    async def list_namespaced(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        prefix, plural = _PATHS[kind]
        data = await self._call("GET", f"{prefix}/namespaces/{namespace}/{plural}",
                                query=[("labelSelector", label_selector)])
        return list(data.get("items") or [])

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """POST; None when it exists already (created once, never re-applied: e.g. a Job
        whose spec.suspend a GPUSharePolicy owns)."""
        meta = manifest["metadata"]
        prefix, plural = _PATHS[manifest["kind"]]
        self.writes += 1
        try:
            return await self._call("POST", f"{prefix}/namespaces/{meta['namespace']}/{plural}", body=manifest,
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
    ``ttl`` seconds: one cheap request instead of a cluster-wide node watch."""

    kube: Kube
    label: str
    ttl: float = 30.0
    _value: int | None = None
    _fetched_at: float = float("-inf")
    _lock: asyncio.Lock | None = None

    async def largest_gpu_mib(self) -> int | None:
        """None when no node carries the label (or it cannot be read): then nothing is blocked on it."""
        if not self.label:
            return None
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
