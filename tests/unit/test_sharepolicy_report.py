"""API objects -> planner members, and plan -> ordered writes, status and Events."""
from __future__ import annotations

import json
from datetime import datetime, timezone

from chattts_operator.api.sharepolicy import (
    POOL_AFFINITY_ANNOTATION,
    GPUSharePolicySpec,
    GPUSharePolicyStatus,
    LabelSelector,
)
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.spec import desired_state, parse_spec, pool_affinity
from chattts_operator.sharepolicy.observe import (
    largest_gpu_mib,
    offline_member,
    online_member,
    pool_nodes,
    split_by_pool,
)
from chattts_operator.sharepolicy.planner import plan
from chattts_operator.sharepolicy.priorityclasses import priority_class_manifests
from chattts_operator.sharepolicy.report import policy_events, policy_status, writes_for
from chattts_operator.sharepolicy.resources import node_requirements

UTC = timezone.utc
NOON = datetime(2026, 6, 1, 12, tzinfo=UTC)
POLICY = GPUSharePolicySpec.model_validate({
    "nodeSelector": {},
    "windows": [
        {"name": "day", "start": "08:00", "end": "20:00", "online": 80, "offline": 20},
        {"name": "night", "start": "20:00", "end": "08:00", "online": 60, "offline": 40},
    ],
})


def node(name, mib, ready="True"):
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": str(mib // 2)}},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu.memory": str(mib), "nvidia.com/gpu": "2"},
                   "conditions": [{"type": "Ready", "status": ready}]},
    }


def ctd(name, replicas=4, memory="10000Mi", cap=None, autoscaling=None, limits=None):
    obj = {"metadata": {"name": name, "namespace": "serving", "annotations": {}},
           "spec": {"replicas": replicas, "gpu": {"memory": memory, "count": 1}}}
    if cap is not None:
        obj["metadata"]["annotations"]["tts.chattts.io/replica-cap"] = str(cap)
    if autoscaling:
        obj["spec"]["autoscaling"] = autoscaling
    if limits:
        obj["status"] = {"gpu": {"limits": limits}}
    return obj


def job(name, suspend=False, priority=None, mib=20000, parallelism=1, completions=None, succeeded=0, conditions=()):
    obj = {
        "metadata": {"name": name, "namespace": "batch", "uid": f"uid-{name}", "creationTimestamp": "2026-06-01T00:00:00Z",
                     "annotations": {}},
        "spec": {"suspend": suspend, "parallelism": parallelism,
                 "template": {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu.memory": str(mib)}}}]}}},
        "status": {"succeeded": succeeded, "conditions": list(conditions)},
    }
    if completions is not None:
        obj["spec"]["completions"] = completions
    if priority is not None:
        obj["metadata"]["annotations"]["tts.chattts.io/offline-priority"] = str(priority)
    return obj


def pods(*phases):
    return [{"status": {"phase": p}} for p in phases]


def test_pool_nodes_skip_gpu_less_and_mark_unready():
    cpu_node = {"metadata": {"name": "cpu"}, "spec": {}, "status": {"allocatable": {"cpu": "8"}, "conditions": []}}
    got = pool_nodes([node("b", 100_000), node("a", 50_000, ready="False"), cpu_node])
    assert [(n.name, n.gpu_memory_mib, n.usable) for n in got] == [("a", 50_000, False), ("b", 100_000, True)]
    assert largest_gpu_mib([node("b", 100_000), node("a", 50_000)]) == 50_000


def test_online_member_from_a_ctd():
    m = online_member(ctd("tts", replicas=4, memory="10000Mi", cap=3), pods("Running", "Running", "Pending", "Succeeded"), 80_000)
    assert (m.per_replica_mib, m.wanted_replicas, m.current_cap, m.observed_pods) == (10_000, 4, 3, 3)
    # Autoscaling: the cap clamps the autoscaler's max, so that is what it wants.
    m = online_member(ctd("tts", replicas=2, autoscaling={"enabled": True, "maxReplicas": 9}), [], 80_000)
    assert m.wanted_replicas == 9
    # Resolved limits win over the spec (whole-GPU profile: a whole GPU's memory).
    m = online_member(ctd("tts", limits={"nvidia.com/gpu": "1"}), [], 80_000)
    assert m.per_replica_mib == 80_000


def test_offline_member_from_a_job():
    j = offline_member(job("q", suspend=True, priority=5, parallelism=3, completions=4, succeeded=2), pods("Running"), 0)
    assert (j.per_pod_mib, j.parallelism, j.suspended, j.priority, j.observed_pods) == (20_000, 2, True, 5, 1)
    done = offline_member(job("d", conditions=[{"type": "Complete", "status": "True"}]), [], 0)
    assert done.finished


def test_writes_are_ordered_and_quiet_caps_are_recorded():
    online = [online_member(ctd("new", replicas=20), [], 0), online_member(ctd("old", replicas=2, cap=5), pods("Running", "Running"), 0)]
    # a's pod has not started yet, so suspending it frees its share at once and b may resume.
    offline = [offline_member(job("a", priority=1), [], 0), offline_member(job("b", suspend=True, priority=9), [], 0)]
    p = plan(POLICY, online, offline, pool_nodes([node("n", 100_000)]), NOON)
    writes = writes_for(p, online, offline)
    assert [(w.kind, w.name, w.suspend, w.cap, w.action.action if w.action else None) for w in writes] == [
        ("Job", "a", True, None, "Suspend"),
        ("ChatTTSDeployment", "new", None, 6, "ScaleDown"),
        ("ChatTTSDeployment", "old", None, 2, None),
        ("Job", "b", False, None, "Resume"),
    ]
    # With a's pod still running, b's resume waits for it to go.
    offline[0] = offline_member(job("a", priority=1), pods("Running"), 0)
    p = plan(POLICY, online, offline, pool_nodes([node("n", 100_000)]), NOON)
    assert [w.name for w in writes_for(p, online, offline)] == ["a", "new", "old"] and not p.settled


def test_status_and_events():
    online = [online_member(ctd("tts", replicas=10, cap=8), pods(*["Running"] * 8), 0)]
    offline = [offline_member(job("a"), pods("Running"), 0)]
    night = datetime(2026, 6, 1, 21, tzinfo=UTC)
    p = plan(POLICY, online, offline, pool_nodes([node("n", 100_000)]), night)
    writes = writes_for(p, online, offline)
    status = policy_status(p, online, offline, {"window": "day", "shares": {"online": 80, "offline": 20}}, night, 4, writes)
    GPUSharePolicyStatus.model_validate(status)  # the CRD's status schema accepts it
    assert status["window"] == "night" and status["nextChange"] == "2026-06-02T08:00:00Z"
    assert status["shares"] == {"online": 60, "offline": 40}
    assert status["budget"] == {"onlineMiB": 60_000, "offlineMiB": 40_000}
    assert status["used"]["totalMiB"] <= status["pool"]["gpuMemoryMiB"]
    assert [a["action"] for a in status["lastActions"]] == ["ScaleDown"]
    assert status["lastActions"][0]["time"] == "2026-06-01T21:00:00Z"
    balanced = next(c for c in status["conditions"] if c["type"] == "Balanced")
    assert balanced["status"] == "True"
    members = {m["name"]: m for m in status["members"]}
    assert members["tts"]["replicaCap"] == 6 and members["a"]["state"] == "Running"
    events = policy_events(p, {"window": "day", "shares": {"online": 80, "offline": 20}}, writes)
    assert [e[1] for e in events] == ["WindowChanged", "ScaledDown"]
    # Same window, nothing done: no Events, and lastTransitionTime is kept.
    later = policy_status(p, online, offline, status, datetime(2026, 6, 1, 22, tzinfo=UTC), 4, [])
    assert later["conditions"] == status["conditions"]
    assert policy_events(p, status, []) == []


def test_actions_kept_are_bounded():
    online = [online_member(ctd("tts", replicas=10, cap=8), pods(*["Running"] * 8), 0)]
    p = plan(POLICY, online, [], pool_nodes([node("n", 100_000)]), datetime(2026, 6, 1, 21, tzinfo=UTC))
    writes = writes_for(p, online, [])
    previous = {"lastActions": [{"time": "t", "action": "ScaleUp", "kind": "x", "namespace": "n", "name": str(i), "reason": ""} for i in range(20)]}
    status = policy_status(p, online, [], previous, NOON, 1, writes)
    assert len(status["lastActions"]) == 20 and status["lastActions"][-1]["action"] == "ScaleDown"


def test_priority_classes():
    online, offline = priority_class_manifests()
    assert online["value"] > offline["value"]
    assert online["preemptionPolicy"] == "PreemptLowerPriority" and offline["preemptionPolicy"] == "Never"


def test_a_deployment_set_to_more_replicas_than_pods_counts_as_held():
    dep = {"spec": {"replicas": 7}, "status": {"replicas": 5}}
    m = online_member(ctd("tts", replicas=10, cap=4), pods("Running") * 1, 0, dep)
    assert m.observed_pods == 7
    assert online_member(ctd("tts"), pods("Running", "Running"), 0, None).observed_pods == 2


def test_status_lists_a_bounded_number_of_members():
    offline = [offline_member(job(f"j{i:04d}", suspend=True), [], 0) for i in range(250)]
    p = plan(POLICY, [], offline, pool_nodes([node("n", 100_000)]), NOON)
    status = policy_status(p, [], offline, None, NOON, 1, [])
    assert len(status["members"]) == 200 and status["memberCount"] == 250
    GPUSharePolicyStatus.model_validate(status)


def test_shared_nodes_between_policies():
    from chattts_operator.api.sharepolicy import LabelSelector
    from chattts_operator.sharepolicy.observe import shared_nodes

    a, b = node("a", 100_000), node("b", 100_000)
    a["metadata"]["labels"]["pool"] = "tts"
    b["metadata"]["labels"]["pool"] = "batch"
    others = {
        "same-pool": LabelSelector.model_validate({"matchLabels": {"pool": "tts"}}),
        "elsewhere": LabelSelector.model_validate({"matchLabels": {"pool": "gpu-2"}}),
        "everything": LabelSelector(),
    }
    assert shared_nodes([a], others) == {"everything": ["a"], "same-pool": ["a"]}
    assert shared_nodes([a, b], {"elsewhere": others["elsewhere"]}) == {}


# --- issue 32: pods outside the pool, the policy that acts over shared nodes -----------------


def test_pods_outside_the_pool_are_not_counted_and_are_reported():
    def pod(name, node=None, phase="Running"):
        return {"metadata": {"name": name, "namespace": "serving"}, "spec": {"nodeName": node} if node else {},
                "status": {"phase": phase}}

    everything = [pod("a", "pool-0"), pod("b", "elsewhere"), pod("c"), pod("d", "elsewhere", "Succeeded")]
    inside, outside = split_by_pool(everything, {"pool-0"})
    assert [p["metadata"]["name"] for p in inside] == ["a", "c"]  # c is not bound yet: it may land in the pool
    assert [p["metadata"]["name"] for p in outside] == ["b"]  # d finished: holds nothing anywhere
    deployment = {"spec": {"replicas": 3}, "status": {"replicas": 3}}
    counted = online_member(ctd("tts", replicas=3), inside, 0, deployment, outside=len(outside))
    assert counted.observed_pods == 2  # not the Deployment's 3: one of them is outside
    assert online_member(ctd("tts", replicas=3), everything, 0, deployment).observed_pods == 3
    p = plan(POLICY, [counted], [], pool_nodes([node("pool-0", 100_000)]), NOON)
    status = policy_status(p, [counted], [], {}, NOON, 1, [], outside=["serving/b on elsewhere (ChatTTSDeployment tts)"])
    cond = next(c for c in status["conditions"] if c["type"] == "PodsOutsidePool")
    assert cond["status"] == "True" and "serving/b on elsewhere" in cond["message"] and "not counted" in cond["message"]
    clear = policy_status(p, [counted], [], {}, NOON, 1, [])
    assert next(c for c in clear["conditions"] if c["type"] == "PodsOutsidePool")["reason"] == "AllInPool"


def test_the_policy_that_acts_over_shared_nodes_is_valid():
    online = [online_member(ctd("tts", replicas=2), pods("Running", "Running"), 0)]
    p = plan(POLICY, online, [], pool_nodes([node("n", 100_000)]), NOON)
    note = "nodes n are also in GPUSharePolicy b, which yields to this one"
    valid = next(c for c in policy_status(p, online, [], {}, NOON, 1, [], notes=[note])["conditions"]
                 if c["type"] == "Valid")
    assert valid["status"] == "True" and valid["message"] == note
    invalid = next(c for c in policy_status(p, online, [], {}, NOON, 1, [], problems=["bad"], notes=[note])
                   ["conditions"] if c["type"] == "Valid")
    assert invalid["status"] == "False" and invalid["message"] == "bad"


def test_the_pool_selector_becomes_node_affinity_on_the_members_pods():
    selector = LabelSelector.model_validate({"matchLabels": {"pool": "a"}, "matchExpressions": [
        {"key": "zone", "operator": "NotIn", "values": ["z2", "z1"]}, {"key": "spare", "operator": "DoesNotExist"}]})
    requirements = node_requirements(selector)
    assert requirements == [{"key": "pool", "operator": "In", "values": ["a"]},
                            {"key": "zone", "operator": "NotIn", "values": ["z1", "z2"]},
                            {"key": "spare", "operator": "DoesNotExist"}]
    body = {"metadata": {"name": "tts", "namespace": "ns", "uid": "u", "generation": 1,
                         "annotations": {POOL_AFFINITY_ANNOTATION: json.dumps(requirements)}},
            "spec": {"model": {"hostPath": {"path": "/m"}}, "gpu": {"memory": "8Gi"}, "engine": {"maxModelLen": 256}}}
    assert pool_affinity(body) == requirements
    terms = desired_state(body, parse_spec(body), OperatorSettings(), largest_node_gpu_mib=None).deployment[
        "spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    # ANDed into the GPU-size term the profile asks for, not a term of its own (terms are ORed).
    assert len(terms) == 1 and terms[0]["matchExpressions"][1:] == requirements
    assert terms[0]["matchExpressions"][0]["operator"] == "Gt"
    for junk in ("not json", json.dumps({"key": "x"}), json.dumps([{"key": "x", "operator": "Gt", "values": ["1"]}])):
        body["metadata"]["annotations"][POOL_AFFINITY_ANNOTATION] = junk
        assert pool_affinity(body) == []
