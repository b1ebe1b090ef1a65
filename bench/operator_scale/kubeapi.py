"""A plain asyncio client for the benchmark's own requests (aiohttp, raw JSON).

Deliberately not the operator's client: the baseline is "a plain script doing the bare
writes", and the observer must not share code paths with what it measures. Everything the
benchmark watches it watches (one long request per resource), so its own load on the API
server is a handful of requests, not polling.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp

# kind -> (API prefix, plural): every kind the benchmark reads or writes.
PATHS: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "Pod": ("/api/v1", "pods"),
    "Namespace": ("/api/v1", "namespaces"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "ChatTTSDeployment": ("/apis/tts.chattts.io/v1alpha1", "chattsdeployments"),
}
FIELD_MANAGER = "chattts-bench"


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status


def collection_path(kind: str, namespace: str | None = None) -> str:
    prefix, plural = PATHS[kind]
    if kind == "Namespace" or namespace is None:
        return f"{prefix}/{plural}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def object_path(kind: str, namespace: str | None, name: str, subresource: str | None = None) -> str:
    path = f"{collection_path(kind, namespace)}/{name}"
    return f"{path}/{subresource}" if subresource else path


def ssl_context_for(pki: Path) -> ssl.SSLContext:
    """Admin client certificate of a LocalCluster (hack/cluster/localcluster.py writes these)."""
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return context


class Api:
    def __init__(self, server: str, ssl_context: ssl.SSLContext, connections: int = 64) -> None:
        self.server = server
        self.ssl = ssl_context
        self.connections = connections
        self.session: aiohttp.ClientSession | None = None
        self.retries = 0

    async def __aenter__(self) -> "Api":
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ssl, limit=self.connections),
            read_bufsize=2 ** 20, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.session is not None
        await self.session.close()

    async def request(self, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None,
                      content_type: str = "application/json", ok_missing: bool = False,
                      timeout: float = 60, attempts: int = 6) -> Any:
        """One request; 429, 5xx and dropped connections are retried (as any client must on a
        busy API server), the number of retries is counted in ``self.retries``."""
        for attempt in range(attempts):
            try:
                return await self._request_once(method, path, body, query, content_type, ok_missing, timeout)
            except ApiError as err:
                if (err.status != 429 and err.status < 500) or attempt == attempts - 1:
                    raise
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                if attempt == attempts - 1:
                    raise
            self.retries += 1
            await asyncio.sleep(min(8.0, 0.5 * 2 ** attempt))
        raise AssertionError("unreachable")

    async def _request_once(self, method: str, path: str, body: Any, query: dict[str, str] | None,
                            content_type: str, ok_missing: bool, timeout: float) -> Any:
        assert self.session is not None, "use `async with Api(...)`"
        data = json.dumps(body) if body is not None else None
        async with self.session.request(method, self.server + path, data=data, params=query or {},
                                        headers={"Content-Type": content_type, "Accept": "application/json"},
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            raw = await resp.read()
            if resp.status == 404 and ok_missing:
                return None
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode(errors="replace")
            if resp.status >= 300:
                raise ApiError(resp.status, method, path, parsed)
            return parsed

    async def text(self, path: str) -> str:
        assert self.session is not None
        async with self.session.get(self.server + path) as resp:
            if resp.status != 200:
                raise ApiError(resp.status, "GET", path, await resp.text())
            return await resp.text()

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return await self.request("GET", object_path(kind, namespace, name), ok_missing=True)

    async def list(self, kind: str, namespace: str | None = None, selector: str | None = None,
                   limit: int = 500) -> list[dict[str, Any]]:
        items, token = [], None
        while True:
            query = {"limit": str(limit)}
            if selector:
                query["labelSelector"] = selector
            if token:
                query["continue"] = token
            page = await self.request("GET", collection_path(kind, namespace), query=query)
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        return await self.request("POST", collection_path(manifest["kind"], meta.get("namespace")), manifest,
                                  query={"fieldManager": FIELD_MANAGER})

    async def apply(self, manifest: dict[str, Any], field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        meta = manifest["metadata"]
        return await self.request("PATCH", object_path(manifest["kind"], meta.get("namespace"), meta["name"]),
                                  manifest, query={"fieldManager": field_manager, "force": "true"},
                                  content_type="application/apply-patch+yaml")

    async def merge_patch(self, kind: str, namespace: str | None, name: str, patch: dict[str, Any],
                          subresource: str | None = None) -> dict[str, Any]:
        return await self.request("PATCH", object_path(kind, namespace, name, subresource), patch,
                                  content_type="application/merge-patch+json")

    async def delete(self, kind: str, namespace: str | None, name: str) -> None:
        await self.request("DELETE", object_path(kind, namespace, name), {"propagationPolicy": "Background"},
                           ok_missing=True)


async def bounded_gather(jobs: list[Callable[[], Awaitable[Any]]], concurrency: int) -> list[Any]:
    """Run the coroutine factories with at most ``concurrency`` in flight; first error raises."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with semaphore:
            return await job()

    return await asyncio.gather(*(one(job) for job in jobs))


@dataclass
class WatchEvent:
    type: str
    obj: dict[str, Any]
    at: float  # time.monotonic() when the line arrived


class Watch:
    """LIST + WATCH of one collection, restarted on expiry (410) or a dropped stream.

    ``on_event`` is called with every ADDED/MODIFIED/DELETED (the initial list as ADDED).
    """

    def __init__(self, api: Api, kind: str, namespace: str | None, on_event: Callable[[WatchEvent], None],
                 selector: str | None = None) -> None:
        self.api, self.kind, self.namespace, self.on_event, self.selector = api, kind, namespace, on_event, selector
        self.task: asyncio.Task | None = None
        self.synced = asyncio.Event()

    def start(self) -> "Watch":
        self.task = asyncio.create_task(self._run(), name=f"watch-{self.kind}")
        return self

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _run(self) -> None:
        path = collection_path(self.kind, self.namespace)
        while True:
            query = {"limit": "500"}
            if self.selector:
                query["labelSelector"] = self.selector
            page = await self.api.request("GET", path, query=query)
            rv = page["metadata"]["resourceVersion"]
            for item in await self._rest_of(page, path, query):
                self.on_event(WatchEvent("ADDED", item, time.monotonic()))
            self.synced.set()
            try:
                await self._stream(path, rv)
            except (aiohttp.ClientError, asyncio.TimeoutError, _Expired):
                await asyncio.sleep(0.2)  # relist

    async def _rest_of(self, page: dict[str, Any], path: str, query: dict[str, str]) -> list[dict[str, Any]]:
        items = list(page.get("items") or [])
        while (page.get("metadata") or {}).get("continue"):
            page = await self.api.request("GET", path, query={**query, "continue": page["metadata"]["continue"]})
            items += page.get("items") or []
        return items

    async def _stream(self, path: str, rv: str) -> None:
        assert self.api.session is not None
        while True:
            query = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "300"}
            if self.selector:
                query["labelSelector"] = self.selector
            async with self.api.session.get(self.api.server + path, params=query,
                                            timeout=aiohttp.ClientTimeout(total=None, sock_read=330)) as resp:
                if resp.status == 410:
                    raise _Expired()
                if resp.status != 200:
                    raise aiohttp.ClientError(f"watch {path}: {resp.status}")
                async for line in resp.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event["type"] == "ERROR":
                        if obj.get("code") == 410:
                            raise _Expired()
                        raise aiohttp.ClientError(f"watch {path}: {obj}")
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if event["type"] != "BOOKMARK":
                        self.on_event(WatchEvent(event["type"], obj, time.monotonic()))


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""
