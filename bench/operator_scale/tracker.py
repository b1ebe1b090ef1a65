"""Follows one namespace through watches: when each child appeared, when each status was
written, when each object became ready, and each Deployment's config hash."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from bench.operator_scale.kubeapi import Api, Watch, WatchEvent
from bench.operator_scale.workload import CHILD_KINDS, MANAGED_SELECTOR, config_hash_of
from chattts_operator.core.labels import LABEL_INSTANCE as INSTANCE_LABEL


class NamespaceTracker:
    def __init__(self, api: Api, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.children: dict[str, dict[str, float]] = {kind: {} for kind in CHILD_KINDS}  # first seen
        self.status_written: dict[str, float] = {}  # CTD name -> first status for its generation
        self.ctd_ready: dict[str, float] = {}
        self.deployment_ready: dict[str, float] = {}
        self.deployment_hash: dict[str, str | None] = {}
        self.generation: dict[str, int] = {}
        self.hash_waiters: dict[str, tuple[str | None, asyncio.Future]] = {}
        self.generation_waiters: dict[str, tuple[int | None, asyncio.Future]] = {}
        self._changed = asyncio.Event()
        self._watches: list[Watch] = []

    async def start(self) -> "NamespaceTracker":
        self._watches = [Watch(self.api, "ChatTTSDeployment", self.namespace, self._on_ctd).start()]
        for kind in CHILD_KINDS:
            handler = self._on_deployment if kind == "Deployment" else self._child_handler(kind)
            self._watches.append(Watch(self.api, kind, self.namespace, handler, selector=MANAGED_SELECTOR).start())
        await asyncio.gather(*(w.synced.wait() for w in self._watches))
        return self

    async def stop(self) -> None:
        for watch in self._watches:
            await watch.stop()

    # --- events ----------------------------------------------------------------------------

    def _child_handler(self, kind: str) -> Callable[[WatchEvent], None]:
        def handle(event: WatchEvent) -> None:
            meta = event.obj["metadata"]
            if kind == "ConfigMap":
                # Runtime ConfigMaps are content-addressed (<name>-runtime-<hash>): counted per owner
                # from the first one seen; a deleted one is an old revision's.
                owner = (meta.get("labels") or {}).get(INSTANCE_LABEL)
                if owner is not None and event.type != "DELETED":
                    self.children[kind].setdefault(owner, event.at)
            elif event.type == "DELETED":
                self.children[kind].pop(meta["name"], None)
            else:
                self.children[kind].setdefault(meta["name"], event.at)
            self._changed.set()
        return handle

    def _on_deployment(self, event: WatchEvent) -> None:
        self._child_handler("Deployment")(event)
        obj = event.obj
        name = obj["metadata"]["name"]
        if event.type == "DELETED":
            self.deployment_ready.pop(name, None)
            return
        status, spec = obj.get("status") or {}, obj.get("spec") or {}
        if (status.get("observedGeneration") == obj["metadata"].get("generation")
                and status.get("readyReplicas", 0) >= spec.get("replicas", 1)
                and status.get("updatedReplicas", 0) >= spec.get("replicas", 1)):
            self.deployment_ready.setdefault(name, event.at)
        new_hash = config_hash_of(obj)
        self.deployment_hash[name] = new_hash
        waiter = self.hash_waiters.get(name)
        if waiter is not None and new_hash != waiter[0] and not waiter[1].done():
            waiter[1].set_result(event.at)

    def _on_ctd(self, event: WatchEvent) -> None:
        obj = event.obj
        name = obj["metadata"]["name"]
        if event.type == "DELETED":
            for table in (self.status_written, self.ctd_ready):
                table.pop(name, None)
            return
        generation = obj["metadata"].get("generation", 1)
        waiter = self.generation_waiters.get(name)
        if waiter is not None and generation != waiter[0] and not waiter[1].done():
            waiter[1].set_result(event.at)
        if generation != self.generation.get(name):
            self.generation[name] = generation
            self.status_written.pop(name, None)
            self.ctd_ready.pop(name, None)
        status = obj.get("status") or {}
        if status.get("observedGeneration") == generation:
            self.status_written.setdefault(name, event.at)
            if status.get("phase") == "Ready" and status.get("readyReplicas") == obj["spec"].get("replicas"):
                self.ctd_ready.setdefault(name, event.at)
        self._changed.set()

    # --- waiting ---------------------------------------------------------------------------

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """True once ``predicate()`` holds, False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 1.0))
            except asyncio.TimeoutError:
                pass
        return True

    def all_children(self, names: list[str]) -> bool:
        return all(self.child_count(kind, names) == len(names) for kind in CHILD_KINDS)

    def child_count(self, kind: str, names: list[str]) -> int:
        have = self.children[kind]
        return sum(1 for n in names if n in have)

    def last_child_time(self, names: list[str]) -> float:
        return max(self.children[k][n] for k in CHILD_KINDS for n in names)

    def expect_hash_change(self, name: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.hash_waiters[name] = (self.deployment_hash.get(name), future)
        return future

    def expect_generation_change(self, name: str) -> asyncio.Future:
        """Resolves with the time this watch saw the object's next generation: when a change
        became visible to watchers (the operator's among them), however long the PATCH's answer took."""
        future = asyncio.get_running_loop().create_future()
        self.generation_waiters[name] = (self.generation.get(name), future)
        return future

    def snapshot(self) -> dict[str, Any]:
        return {kind: len(v) for kind, v in self.children.items()} | {
            "status_written": len(self.status_written), "ctd_ready": len(self.ctd_ready),
            "deployment_ready": len(self.deployment_ready)}
