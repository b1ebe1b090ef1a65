"""A list+watch of the Deployments the operator manages, filtered by the API server.

Why not kopf's ``@kopf.on.event('deployments', labels=...)``: kopf watches every Deployment
in its scope and filters labels on the client, keeping per-object state even for objects
no handler wants, so its memory and CPU grow with the cluster's unrelated Deployments. Here
the label selector goes to the API server: we only ever receive our own children.

The loop is the usual reflector: list (remember the list's resourceVersion), watch from
there with bookmarks, and on ``410 Gone`` (history compacted) list again. Errors back off
and retry forever; the operator's liveness probe reports a loop that stopped.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

from kubernetes_asyncio.client.exceptions import ApiException

from chattts_operator.core.kube import Kube

log = logging.getLogger("chattts_operator.core.watch")

EventHandler = Callable[[str, dict[str, Any]], Awaitable[None]]
WATCH_TIMEOUT_SECONDS = 290  # the server ends a watch after this; we simply continue from the last version


class Gone(Exception):
    """The resourceVersion we watch from is too old: list again."""


class ListWatch:
    def __init__(self, kube: Kube, path: str, label_selector: str, on_event: EventHandler) -> None:
        self.kube = kube
        self.path = path  # a collection, e.g. /apis/apps/v1/namespaces/x/deployments
        self.selector = label_selector
        self.on_event = on_event
        self.healthy = False

    async def run_forever(self) -> None:
        backoff = 1.0
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    resource_version = await self._list()
                resource_version = await self._watch(resource_version)
                backoff = 1.0
            except Gone:
                resource_version = None
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - a watch must survive any hiccup
                self.healthy = False
                log.warning("watch of %s failed (%s: %s); retrying in %.0fs", self.path, type(err).__name__, err,
                            backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                resource_version = None

    async def _list(self) -> str:
        data = await self.kube.list_path(self.path, self.selector)
        for item in data.get("items") or []:
            await self.on_event("LISTED", item)
        self.healthy = True
        return data["metadata"]["resourceVersion"]

    async def _watch(self, resource_version: str) -> str:
        query = [
            ("watch", "true"),
            ("labelSelector", self.selector),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(WATCH_TIMEOUT_SECONDS)),
        ]
        try:
            response = await self.kube.open_watch(self.path, query, WATCH_TIMEOUT_SECONDS + 30)
        except ApiException as err:
            if err.status == 410:
                raise Gone() from err
            raise
        try:
            if response.status == 410:
                raise Gone()
            if not 200 <= response.status <= 299:
                body = (await response.read())[:300]
                raise RuntimeError(f"watch of {self.path} answered {response.status}: {body!r}")
            self.healthy = True
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                resource_version = obj.get("metadata", {}).get("resourceVersion") or resource_version
                if kind != "BOOKMARK":
                    await self.on_event(kind, obj)
        finally:
            response.release()
        return resource_version
