"""List+watch filtered by the API server, and the read cache of the operator's children built on it.

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

from chattts_operator.core import metrics
from chattts_operator.core.kube import Kube, collection_path, is_newer
from chattts_operator.core.labels import LABEL_INSTANCE

log = logging.getLogger("chattts_operator.core.watch")

EventHandler = Callable[[str, dict[str, Any]], Awaitable[None]]
ListHandler = Callable[[list[dict[str, Any]]], Awaitable[None]]
WATCH_TIMEOUT_SECONDS = 290  # the server ends a watch after this; we simply continue from the last version


class Gone(Exception):
    """The resourceVersion we watch from is too old: list again."""


class ListWatch:
    def __init__(self, kube: Kube, path: str, label_selector: str, on_event: EventHandler,
                 on_list: ListHandler | None = None) -> None:
        self.kube = kube
        self.path = path  # a collection, e.g. /apis/apps/v1/namespaces/x/deployments
        self.selector = label_selector
        self.on_event = on_event
        self.on_list = on_list  # given: the whole list at once (a cache replaces its snapshot)
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
        items = data.get("items") or []
        for item in items:
            # A list's items carry neither; comparing with our manifests needs both.
            item.setdefault("apiVersion", data.get("apiVersion"))
            item.setdefault("kind", (data.get("kind") or "").removesuffix("List"))
        if self.on_list is not None:
            await self.on_list(items)
        else:
            for item in items:
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


# --- the read cache ---------------------------------------------------------------------------

Key = tuple[str, str]  # (namespace, name)
ChangeHandler = Callable[[str, str, dict[str, Any]], None]  # (kind, event type, object)
Slimmer = Callable[[dict[str, Any]], dict[str, Any]]  # what of an object of one kind the cache keeps
SYNC_WAIT_SECONDS = 30.0  # a read before the first list completes waits this long, then asks the API server


class ChildCache:
    """Every object of ``kinds`` that carries ``label_selector``, kept current by one
    label-selected list+watch per kind and watched namespace (all namespaces when none).

    Reconciles read children and pods from here, so the API server sees reads only when a
    watch (re)lists; an apply's answer is stored at once (``remember``), so the next read
    sees our own write even before its watch event arrives. Objects older than what is
    stored never replace it (a watch event may trail our apply). Memory grows with what the
    operator manages, never with the cluster: the selector is applied by the API server,
    and ``managedFields`` (often the largest part of an object) is dropped; ``slimmers`` keep
    less of a kind whose readers need only a part (a ReplicaSet's whole pod template, when
    only the ConfigMap it mounts is ever read). Objects are
    indexed by namespace and ``index_label`` (the instance label: whose pods they are), so a
    label query costs what it finds, not the whole cache (at 1,000 objects a scan of every
    pod was a fifth of the operator's CPU while rollouts ran).
    """

    def __init__(self, kube: Kube, kinds: tuple[str, ...], namespaces: tuple[str, ...], label_selector: str,
                 on_change: ChangeHandler | None = None, index_label: str = LABEL_INSTANCE,
                 slimmers: dict[str, Slimmer] | None = None) -> None:
        self.kube = kube
        self.kinds = kinds
        self.namespaces = namespaces
        self.selector = label_selector
        self.on_change = on_change
        self.index_label = index_label
        self.slimmers = slimmers or {}
        self._objects: dict[str, dict[Key, dict[str, Any]]] = {kind: {} for kind in kinds}
        # kind -> (namespace, index label's value) -> keys of the objects carrying it
        self._index: dict[str, dict[tuple[str, str | None], set[Key]]] = {kind: {} for kind in kinds}
        self._synced: dict[tuple[str, str | None], asyncio.Event] = {
            (kind, ns): asyncio.Event() for kind in kinds for ns in (namespaces or (None,))}
        self.watches: list[ListWatch] = []

    def start(self) -> list[asyncio.Task]:
        tasks = []
        for kind, namespace in self._synced:
            watch = ListWatch(self.kube, collection_path(kind, namespace), self.selector,
                              on_event=self._event_handler(kind), on_list=self._list_handler(kind, namespace))
            self.watches.append(watch)
            tasks.append(asyncio.create_task(watch.run_forever(), name=f"chattts-cache {kind} {namespace or '*'}"))
        return tasks

    # --- reads ------------------------------------------------------------------------------

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as last seen; a request only while its watch has never listed (start-up,
        a namespace outside the watched ones)."""
        if await self._wait_synced(kind, namespace):
            return self._objects[kind].get((namespace, name))
        return await self.kube.get(kind, namespace, name)

    def items(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Cached objects of ``kind`` in ``namespace`` carrying all of ``labels`` (e.g. a
        ChatTTSDeployment's pods), by name."""
        objects = self._objects[kind]
        if self.index_label in labels:
            candidates = [objects[key] for key in self._index[kind].get((namespace, labels[self.index_label]), ())]
        else:
            candidates = [obj for (ns, _name), obj in objects.items() if ns == namespace]
        found = [obj for obj in candidates
                 if all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())]
        return sorted(found, key=lambda obj: obj["metadata"]["name"])

    def listed(self, kind: str, namespace: str) -> bool:
        """Whether the watch of ``kind`` covering ``namespace`` has listed (``items`` is complete)."""
        event = self._synced.get((kind, None if not self.namespaces else namespace))
        return bool(self.watches) and event is not None and event.is_set()

    def size(self) -> int:
        return sum(len(objects) for objects in self._objects.values())

    # --- writes from the watch and from our own applies -----------------------------------

    def remember(self, obj: dict[str, Any] | None) -> None:
        """Store an apply's answer (the live object) unless a newer version is already here."""
        if obj and obj.get("kind") in self._objects:
            self._store(obj["kind"], self._kept(obj["kind"], obj))

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """We deleted it: no read may see it again (its DELETED event may come later)."""
        if kind in self._objects:
            self._drop(kind, (namespace, name))

    def _store(self, kind: str, obj: dict[str, Any]) -> bool:
        key = (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])
        if not is_newer(obj, self._objects[kind].get(key)):
            return False
        self._put(kind, key, obj)
        return True

    def _index_key(self, key: Key, obj: dict[str, Any]) -> tuple[str, str | None]:
        return key[0], (obj["metadata"].get("labels") or {}).get(self.index_label)

    def _put(self, kind: str, key: Key, obj: dict[str, Any]) -> None:
        self._drop(kind, key)
        self._objects[kind][key] = obj
        self._index[kind].setdefault(self._index_key(key, obj), set()).add(key)

    def _drop(self, kind: str, key: Key) -> dict[str, Any] | None:
        obj = self._objects[kind].pop(key, None)
        if obj is not None:
            index_key = self._index_key(key, obj)
            keys = self._index[kind].get(index_key)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._index[kind][index_key]
        return obj

    def _event_handler(self, kind: str) -> EventHandler:
        async def handle(event_type: str, obj: dict[str, Any]) -> None:
            obj = self._kept(kind, {**obj, "kind": kind})
            if event_type == "DELETED":
                meta = obj["metadata"]
                changed = self._drop(kind, (meta.get("namespace") or "", meta["name"])) is not None
            else:
                changed = self._store(kind, obj)
            metrics.CACHED_OBJECTS.set(self.size())
            if changed and self.on_change is not None:
                self.on_change(kind, event_type, obj)
        return handle

    def _list_handler(self, kind: str, namespace: str | None) -> ListHandler:
        async def handle(items: list[dict[str, Any]]) -> None:
            listed = {(item["metadata"].get("namespace") or "", item["metadata"]["name"]): self._kept(kind, {**item, "kind": kind})
                      for item in items}
            objects = self._objects[kind]
            # A relist (after a broken watch, e.g. an API server or etcd restart) is the only news
            # of what changed meanwhile: it is reported like the watch events it stands for, or a
            # child's progress during the outage waits for the next resync. The first list is not:
            # every owner is reconciled at start anyway.
            relist = self._synced[(kind, namespace)].is_set()
            # The list is the truth for its scope: what vanished meanwhile is dropped, what our
            # own applies stored since (newer than the list) is kept.
            for key in [k for k in objects if namespace is None or k[0] == namespace]:
                if key not in listed:
                    gone = self._drop(kind, key)
                    if self.on_change is not None:
                        self.on_change(kind, "DELETED", gone)
            for key, obj in listed.items():
                before = objects.get(key)
                if is_newer(obj, before):
                    self._put(kind, key, obj)
                    if relist and self.on_change is not None:
                        self.on_change(kind, "ADDED" if before is None else "MODIFIED", obj)
            self._synced[(kind, namespace)].set()
            metrics.CACHED_OBJECTS.set(self.size())
        return handle

    def _kept(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """What the cache stores of ``obj``: without managedFields, and slimmed if its kind has a slimmer."""
        obj = _trimmed(obj)
        slim = self.slimmers.get(kind)
        return slim(obj) if slim is not None else obj

    async def _wait_synced(self, kind: str, namespace: str) -> bool:
        event = self._synced.get((kind, None if not self.namespaces else namespace))
        if event is None or not self.watches:
            return False  # not a cached kind or namespace, or the cache was never started
        if not event.is_set():
            try:
                await asyncio.wait_for(event.wait(), SYNC_WAIT_SECONDS)
            except asyncio.TimeoutError:
                return False
        return True


def _trimmed(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without managedFields (kilobytes each that no reader needs)."""
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
