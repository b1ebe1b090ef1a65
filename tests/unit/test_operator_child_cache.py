"""The read cache's bookkeeping (core/watch.py ChildCache), fed the way its watches feed it:
newer versions win, a relist is the truth for its scope, our own applies are seen at once.
The cache against a real API server: tests/cluster/test_operator_cache.py."""
from __future__ import annotations

import asyncio

from chattts_operator.core.watch import ChildCache


def obj(name, rv, *, kind="ConfigMap", namespace="ns", labels=None, managed_fields=True):
    meta = {"name": name, "namespace": namespace, "resourceVersion": str(rv), "labels": labels or {}}
    if managed_fields:
        meta["managedFields"] = [{"manager": "chattts-operator", "fieldsV1": {"f:data": {}}}]
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def cache_with_changes():
    changes = []
    cache = ChildCache(kube=None, kinds=("ConfigMap", "Pod"), namespaces=(), label_selector="x=y",
                       on_change=lambda kind, event, o: changes.append((kind, event, o["metadata"]["name"])))
    return cache, changes


def stored(cache, kind, name, namespace="ns"):
    return cache._objects[kind].get((namespace, name))


def test_a_trailing_watch_event_never_replaces_our_newer_apply():
    cache, changes = cache_with_changes()
    cache.remember(obj("a", 10))
    asyncio.run(cache._event_handler("ConfigMap")("MODIFIED", obj("a", 9)))
    assert stored(cache, "ConfigMap", "a")["metadata"]["resourceVersion"] == "10"
    assert changes == []  # nothing new: no reconcile of the owner
    asyncio.run(cache._event_handler("ConfigMap")("MODIFIED", obj("a", 11)))
    assert stored(cache, "ConfigMap", "a")["metadata"]["resourceVersion"] == "11"
    assert changes == [("ConfigMap", "MODIFIED", "a")]
    assert "managedFields" not in stored(cache, "ConfigMap", "a")["metadata"]


def test_a_relist_drops_what_vanished_and_keeps_what_we_wrote_since():
    cache, changes = cache_with_changes()
    handle = cache._event_handler("ConfigMap")
    asyncio.run(handle("ADDED", obj("gone", 3)))
    asyncio.run(handle("ADDED", obj("kept", 4)))
    cache.remember(obj("kept", 20))
    listed = obj("kept", 15)
    del listed["apiVersion"], listed["kind"]  # as in a list response (ListWatch fills them in)
    asyncio.run(cache._list_handler("ConfigMap", None)([{**listed, "apiVersion": "v1", "kind": "ConfigMap"}]))
    assert stored(cache, "ConfigMap", "gone") is None and ("ConfigMap", "DELETED", "gone") in changes
    assert stored(cache, "ConfigMap", "kept")["metadata"]["resourceVersion"] == "20"
    assert cache._synced[("ConfigMap", None)].is_set()


def test_deletes_and_label_queries():
    cache, _changes = cache_with_changes()
    handle = cache._event_handler("Pod")
    for i, instance in enumerate(("tts", "tts", "other")):
        asyncio.run(handle("ADDED", obj(f"p{i}", i + 1, kind="Pod", labels={"app.kubernetes.io/instance": instance})))
    asyncio.run(handle("ADDED", obj("p9", 9, kind="Pod", namespace="elsewhere",
                                    labels={"app.kubernetes.io/instance": "tts"})))
    names = [p["metadata"]["name"] for p in cache.items("Pod", "ns", {"app.kubernetes.io/instance": "tts"})]
    assert names == ["p0", "p1"]
    asyncio.run(handle("DELETED", obj("p0", 12, kind="Pod")))
    cache.forget("Pod", "ns", "p1")
    assert cache.items("Pod", "ns", {"app.kubernetes.io/instance": "tts"}) == []
    assert cache.size() == 2


def test_the_instance_index_follows_relabels_relists_and_other_label_queries():
    cache, _changes = cache_with_changes()
    handle = cache._event_handler("Pod")
    instance = "app.kubernetes.io/instance"
    asyncio.run(handle("ADDED", obj("p", 1, kind="Pod", labels={instance: "a", "role": "x"})))
    asyncio.run(handle("MODIFIED", obj("p", 2, kind="Pod", labels={instance: "b", "role": "x"})))
    assert cache.items("Pod", "ns", {instance: "a"}) == []
    assert [p["metadata"]["name"] for p in cache.items("Pod", "ns", {instance: "b"})] == ["p"]
    assert cache.items("Pod", "ns", {instance: "b", "role": "y"}) == []  # every label still has to match
    assert [p["metadata"]["name"] for p in cache.items("Pod", "ns", {"role": "x"})] == ["p"]  # no instance: a scan
    asyncio.run(cache._list_handler("Pod", None)([obj("q", 5, kind="Pod", labels={instance: "b"})]))
    assert [p["metadata"]["name"] for p in cache.items("Pod", "ns", {instance: "b"})] == ["q"]
    assert cache._index["Pod"] == {("ns", "b"): {("ns", "q")}}


def test_a_slimmer_decides_what_of_its_kind_is_kept_whichever_way_it_arrives():
    def slim(o):
        return {"apiVersion": o["apiVersion"], "kind": o["kind"], "metadata": o["metadata"]}

    cache = ChildCache(kube=None, kinds=("ReplicaSet", "Pod"), namespaces=(), label_selector="x=y",
                       slimmers={"ReplicaSet": slim})

    def whole(name, rv, kind="ReplicaSet"):
        return {**obj(name, rv, kind=kind), "spec": {"template": {"spec": {"containers": [{"name": "big"}]}}}}

    asyncio.run(cache._event_handler("ReplicaSet")("ADDED", whole("watched", 1)))
    asyncio.run(cache._list_handler("ReplicaSet", None)([whole("watched", 1), whole("listed", 2)]))
    cache.remember(whole("listed", 3))
    asyncio.run(cache._event_handler("Pod")("ADDED", whole("pod", 4, kind="Pod")))
    for name in ("watched", "listed"):
        kept = stored(cache, "ReplicaSet", name)
        assert "spec" not in kept and "managedFields" not in kept["metadata"]
    assert stored(cache, "ReplicaSet", "listed")["metadata"]["resourceVersion"] == "3"
    assert "spec" in stored(cache, "Pod", "pod")  # other kinds are kept whole (but managedFields)


def test_a_relist_reports_what_changed_while_the_watch_was_down_but_the_first_list_does_not():
    cache, changes = cache_with_changes()
    relist = cache._list_handler("ConfigMap", None)
    asyncio.run(relist([obj("steady", 5), obj("progressing", 6)]))
    assert changes == []  # the first list: every owner is reconciled at start anyway
    # The watch broke (etcd restarted); meanwhile one child progressed and another appeared.
    asyncio.run(relist([obj("steady", 5), obj("progressing", 9), obj("new", 8)]))
    assert sorted(changes) == [("ConfigMap", "ADDED", "new"), ("ConfigMap", "MODIFIED", "progressing")]
    assert stored(cache, "ConfigMap", "progressing")["metadata"]["resourceVersion"] == "9"
