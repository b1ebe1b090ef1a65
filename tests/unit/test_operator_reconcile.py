"""The reconcile decision (pure): desired children, diffing with live objects, status."""
from __future__ import annotations

import copy

import pytest

from chattts_operator.core.conditions import merge_conditions
from chattts_operator.core.events import event_manifest
from chattts_operator.core.labels import INTENT_HASH_ANNOTATION
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.controller import _unprotected_children, owner_key
from chattts_operator.deployment.spec import desired_state, effective_replicas, is_subset, needs_apply, parse_spec
from chattts_operator.deployment.status import Observed, compute_status, status_changed, transitions

SETTINGS = OperatorSettings()
T0, T1 = "2026-11-29T10:00:00Z", "2026-11-29T10:05:00Z"


# The default engine (graph) holds (maxNumSeqs + 1) x maxModelLen x 60 KiB: 512 tokens fit 8Gi.
ENGINE = {"maxModelLen": 256}  # the graph engine (the default) fits 8Gi at this length


def obj(spec_extra=None, *, generation=1, annotations=None, gpu=None):
    spec = {"model": {"pvc": {"claimName": "w"}, "format": "awq"}, "gpu": gpu or {"memory": "8Gi"}}
    spec.update(spec_extra or {})
    spec["engine"] = {**ENGINE, **(spec_extra or {}).get("engine", {})}
    return {
        "apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment",
        "metadata": {"name": "tts", "namespace": "ns", "uid": "u1", "generation": generation,
                     "annotations": annotations or {}},
        "spec": spec,
    }


def desired_of(body, largest=None):
    return desired_state(body, parse_spec(body), SETTINGS, largest_node_gpu_mib=largest)


def live_deployment(desired, *, ready=1, updated=1, replicas=1, observed_generation=1, generation=1, conditions=()):
    dep = copy.deepcopy(desired.deployment)
    dep["metadata"].update({"generation": generation, "resourceVersion": "7", "uid": "d1"})
    dep["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    dep["status"] = {"observedGeneration": observed_generation, "replicas": replicas, "readyReplicas": ready,
                     "updatedReplicas": updated, "availableReplicas": ready, "conditions": list(conditions)}
    return dep


# --- desired state --------------------------------------------------------------------------


def test_fitting_spec_applies_everything_in_order():
    d = desired_of(obj())
    assert d.rollout_allowed
    assert [c["kind"] for c in d.children()] == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget"]


@pytest.mark.parametrize(
    "gpu, engine, largest, reason",
    [
        ({"memory": "1Gi"}, {}, None, "WeightsDoNotFit"),
        ({"memory": "4Gi"}, {"maxModelLen": 131072}, None, "KVCacheDoesNotFit"),
        ({"memory": "200Gi", "profile": "mig"}, {}, None, "NoMigProfileFits"),
        ({"memory": "160Gi"}, {}, 143771, "NoNodeLargeEnough"),
        ({"memory": "8Gi", "count": 5}, {"kind": "vllm"}, None, "TensorParallelMismatch"),
        ({"memory": "8Gi"}, {"maxNumSeqs": 256, "maxModelLen": 1024}, None, "KVCacheDoesNotFit"),
    ],
)
def test_unsatisfiable_specs_are_blocked(gpu, engine, largest, reason):
    d = desired_of(obj({"engine": engine}, gpu=gpu), largest=largest)
    assert not d.rollout_allowed and d.capacity.reason == reason
    # Only the harmless children are applied: the serving Deployment and its config stay as they are.
    assert [c["kind"] for c in d.children()] == ["Service", "PodDisruptionBudget"]
    assert d.deployment is None


def test_unknown_node_sizes_do_not_block():
    assert desired_of(obj({}, gpu={"memory": "160Gi"}), largest=None).rollout_allowed


@pytest.mark.parametrize(
    "replicas, cap, expected",
    [(3, None, 3), (3, "2", 2), (3, "5", 3), (3, "0", 0), (3, "junk", 3), (0, "1", 0)],
)
def test_replica_cap_annotation(replicas, cap, expected):
    annotations = {"tts.chattts.io/replica-cap": cap} if cap is not None else {}
    body = obj({"replicas": replicas}, annotations=annotations)
    assert effective_replicas(body, parse_spec(body))[0] == expected
    assert desired_of(body).deployment["spec"]["replicas"] == expected


# --- diffing ---------------------------------------------------------------------------------


def test_live_object_with_server_defaults_needs_no_apply():
    d = desired_of(obj())
    assert not needs_apply(d.deployment, live_deployment(d))


@pytest.mark.parametrize(
    "edit",
    [
        lambda dep: dep["spec"].__setitem__("replicas", 5),
        lambda dep: dep["spec"]["template"]["spec"]["containers"][0].__setitem__("image", "evil:1"),
        lambda dep: dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].__setitem__(
            "nvidia.com/gpu.memory", "80000"),
        lambda dep: dep["spec"]["template"]["spec"]["volumes"][1]["persistentVolumeClaim"].__setitem__(
            "readOnly", False),
        lambda dep: dep["spec"]["template"]["spec"]["containers"][0]["volumeMounts"].pop(),
        lambda dep: dep["metadata"]["annotations"].__setitem__(INTENT_HASH_ANNOTATION, "old"),
        lambda dep: dep["metadata"]["labels"].pop("app.kubernetes.io/part-of"),
    ],
    ids=["replicas", "image", "gpu-limit", "pvc-writable", "mount-removed", "old-intent", "label-removed"],
)
def test_hand_edits_are_detected(edit):
    d = desired_of(obj())
    live = live_deployment(d)
    edit(live)
    assert needs_apply(d.deployment, live)


def test_missing_child_needs_apply():
    assert needs_apply(desired_of(obj()).service, None)


@pytest.mark.parametrize(
    "desired, live, path, equal",
    [
        ("0.5", "500m", ("resources", "cpu"), True),
        ("1024Mi", "1Gi", ("resources", "memory"), True),
        ("1", "2", ("resources", "cpu"), False),
        ("0.5", "500m", ("spec", "image"), False),
        ({"a": 1}, {"a": 1, "b": 2}, (), True),
        ([{"a": 1}], [{"a": 1}, {"a": 2}], (), False),
        (1, 1.0, (), True),
    ],
)
def test_is_subset(desired, live, path, equal):
    assert is_subset(desired, live, path) is equal


# --- status ----------------------------------------------------------------------------------


def conditions_by_type(status):
    return {c["type"]: c for c in status["conditions"]}


def test_status_of_a_ready_deployment():
    d = desired_of(obj())
    status = compute_status(d, Observed(live_deployment(d), deployment_applied=True), None, T0)
    c = conditions_by_type(status)
    assert (c["Ready"]["status"], c["Progressing"]["status"], c["Degraded"]["status"], c["GPUCapacity"]["status"]) \
        == ("True", "False", "False", "True")
    assert status["phase"] == "Ready"
    assert status["observedGeneration"] == 1 and status["appliedGeneration"] == 1
    assert status["readyReplicas"] == 1 and status["replicas"] == 1
    assert status["gpuShare"] == "1x8Gi gpu-memory"
    assert status["gpu"]["limits"] == {"nvidia.com/gpu.memory": "8192"}
    assert status["memoryPlan"]["fits"] is True and status["memoryPlan"]["maxConcurrentSequences"] > 0
    assert status["selector"] == ("app.kubernetes.io/component=tts-server,app.kubernetes.io/instance=tts,"
                                  "app.kubernetes.io/name=chattts")
    assert all(cond["lastTransitionTime"] == T0 and cond["observedGeneration"] == 1 for cond in status["conditions"])


@pytest.mark.parametrize(
    "dep_kwargs, phase, progressing_reason",
    [
        ({"ready": 0, "updated": 1}, "Progressing", "RollingOut"),
        ({"ready": 1, "updated": 1, "replicas": 2}, "Progressing", "RollingOut"),
        ({"observed_generation": 1, "generation": 2}, "Progressing", "RollingOut"),
        ({"ready": 1, "updated": 1}, "Ready", "Complete"),
    ],
)
def test_rollout_progress(dep_kwargs, phase, progressing_reason):
    d = desired_of(obj())
    status = compute_status(d, Observed(live_deployment(d, **dep_kwargs), deployment_applied=True), None, T0)
    assert status["phase"] == phase
    assert conditions_by_type(status)["Progressing"]["reason"] == progressing_reason


def test_blocked_update_keeps_the_last_good_generation():
    good = desired_of(obj())
    serving = live_deployment(good)
    first = compute_status(good, Observed(serving, deployment_applied=True), None, T0)
    bad = desired_of(obj({"engine": {"maxModelLen": 131072}}, generation=2, gpu={"memory": "4Gi"}))
    status = compute_status(bad, Observed(serving), first, T1)
    c = conditions_by_type(status)
    assert c["GPUCapacity"]["status"] == "False" and c["GPUCapacity"]["reason"] == "KVCacheDoesNotFit"
    assert "MiB" in c["GPUCapacity"]["message"]
    assert c["Degraded"]["status"] == "True"
    assert c["Progressing"]["reason"] == "RolloutBlocked" and "generation 1 keeps serving" in c["Progressing"]["message"]
    assert c["Ready"]["status"] == "True"  # the old pods still serve
    assert status["appliedGeneration"] == 1 and status["configHash"] == first["configHash"]
    assert status["observedGeneration"] == 2 and status["phase"] == "Degraded"
    # Transition times move only where the status changed.
    assert c["Ready"]["lastTransitionTime"] == T0 and c["GPUCapacity"]["lastTransitionTime"] == T1
    # The share shown is the one the serving pods have; the plan explains the refused spec.
    assert status["gpuShare"] == "1x8Gi gpu-memory" and status["gpu"] == first["gpu"]
    assert status["memoryPlan"]["budgetMiB"] < first["memoryPlan"]["budgetMiB"]


def test_blocked_new_object_is_unsatisfiable():
    d = desired_of(obj({}, gpu={"memory": "1Gi"}))
    status = compute_status(d, Observed(None), None, T0)
    assert status["phase"] == "Unsatisfiable"
    assert status["memoryPlan"]["fits"] is False and status["memoryPlan"]["reason"] == "WeightsDoNotFit"


def test_high_utilization_warning_in_status():
    d = desired_of(obj({"engine": {"gpuMemoryUtilization": 0.95}}))
    status = compute_status(d, Observed(live_deployment(d), deployment_applied=True), None, T0)
    assert "warning: gpuMemoryUtilization 0.95 is above 0.9" in conditions_by_type(status)["GPUCapacity"]["message"]


def test_deployment_failure_degrades():
    d = desired_of(obj())
    dep = live_deployment(d, ready=0, conditions=[{"type": "Progressing", "status": "False",
                                                    "reason": "ProgressDeadlineExceeded", "message": "timed out"}])
    status = compute_status(d, Observed(dep, deployment_applied=True), None, T0)
    assert conditions_by_type(status)["Degraded"]["reason"] == "ProgressDeadlineExceeded"


def test_scaled_to_zero():
    d = desired_of(obj({"replicas": 0}))
    dep = live_deployment(d, ready=0, updated=0, replicas=0)
    status = compute_status(d, Observed(dep, deployment_applied=True), None, T0)
    assert status["phase"] == "ScaledToZero"


def test_unchanged_status_is_not_rewritten():
    d = desired_of(obj())
    observed = Observed(live_deployment(d), deployment_applied=True)
    first = compute_status(d, observed, None, T0)
    live = {**copy.deepcopy(first), "autoscaling": {"desiredReplicas": 3}}  # someone else's key
    again = compute_status(d, observed, live, T1)
    assert not status_changed(again, live)
    assert again["conditions"] == first["conditions"]
    changed = compute_status(d, Observed(live_deployment(d, ready=0), deployment_applied=True), live, T1)
    assert status_changed(changed, live)


def test_status_changed_treats_none_as_absent():
    assert not status_changed({"gpu": None, "phase": "Ready"}, {"phase": "Ready"})
    assert status_changed({"gpu": None}, {"gpu": {"profile": "hami"}})
    assert not status_changed({"gpu": {"migProfile": None, "profile": "x"}}, {"gpu": {"profile": "x"}})


def test_merge_conditions_keeps_times():
    old = [{"type": "Ready", "status": "True", "lastTransitionTime": T0}]
    new = merge_conditions(old, [{"type": "Ready", "status": "True", "reason": "x"},
                                 {"type": "Degraded", "status": "False"}], T1)
    assert new[0]["lastTransitionTime"] == T0 and new[1]["lastTransitionTime"] == T1


@pytest.mark.parametrize(
    "before, after, events",
    [
        ([], [("Ready", "False", "Creating"), ("Degraded", "False", "AsExpected")], []),
        ([("Ready", "False", "Creating")], [("Ready", "True", "AllReplicasReady")], [("Normal", "ReadyTrue")]),
        ([("GPUCapacity", "True", "Fits")], [("GPUCapacity", "False", "KVCacheDoesNotFit")],
         [("Warning", "GPUCapacityFalse")]),
        ([("Degraded", "False", "AsExpected")], [("Degraded", "True", "ApplyFailed")], [("Warning", "DegradedTrue")]),
        ([("Degraded", "True", "X")], [("Degraded", "True", "Y")], []),
        ([], [("GPUCapacity", "False", "WeightsDoNotFit")], [("Warning", "GPUCapacityFalse")]),
    ],
)
def test_events_on_transitions(before, after, events):
    def conds(items):
        return [{"type": t, "status": s, "reason": r, "message": ""} for t, s, r in items]
    assert [(e[0], e[1]) for e in transitions(conds(before), conds(after))] == events


def test_owner_key():
    d = desired_of(obj())
    assert owner_key(d.deployment) == ("ns", "tts")
    assert owner_key({"metadata": {"namespace": "ns", "ownerReferences": [{"kind": "ReplicaSet", "name": "x"}]}}) is None


@pytest.mark.parametrize(
    "a, b, newer",
    [("5", "4", True), ("4", "5", False), ("5", "5", False), ("12", "9", True), ("x", "y", True), ("5", None, True),
     (None, "5", False)],
)
def test_newer_resource_version(a, b, newer):
    from chattts_operator.core.kube import is_newer as _newer

    def o(rv):
        return None if rv is None else {"metadata": {"resourceVersion": rv}}
    assert _newer(o(a), o(b)) is newer


# --- never fail open (issue 32) ----------------------------------------------------------------


def _cond(status, ctype):
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_a_refused_network_policy_is_never_ready():
    body = obj({"networkPolicy": {"allowFrom": [{"podSelector": {"matchLabels": {"app": "web"}}}]}})
    d = desired_of(body)
    refused = "applying NetworkPolicy tts: 403 admission webhook denied the request"
    # Nothing fenced the pods before: the Deployment is at 0 (applied so), never Ready.
    dep = live_deployment(d, ready=0, updated=0, replicas=0)
    dep["spec"]["replicas"] = 0
    status = compute_status(d, Observed(live_deployment=dep, deployment_applied=False, protection_error=refused),
                            {}, T0)
    ready = _cond(status, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ProtectionNotApplied"
    assert refused in ready["message"] and "scaled to 0" in ready["message"]
    assert _cond(status, "Protected")["status"] == "False"
    assert _cond(status, "Degraded")["reason"] == "ProtectionNotApplied"
    assert status["appliedGeneration"] is None and status["phase"] == "Degraded"
    # A fence applied before holds the old generation, whose pods are all Ready: still not Ready.
    held = compute_status(d, Observed(live_deployment=live_deployment(d), protection_error=refused,
                                      protection_held=True), {"appliedGeneration": 1}, T0)
    assert _cond(held, "Ready")["status"] == "False"
    assert "keep the NetworkPolicy applied before" in _cond(held, "Ready")["message"]
    assert held["appliedGeneration"] == 1
    # Applied: Protected, and Ready once the pods are.
    fine = compute_status(d, Observed(live_deployment=live_deployment(d), deployment_applied=True), {}, T0)
    assert _cond(fine, "Protected")["status"] == "True" and _cond(fine, "Ready")["status"] == "True"
    # No policy asked for: no Protected condition.
    plain = desired_of(obj())
    assert all(c["type"] != "Protected" for c in compute_status(
        plain, Observed(live_deployment=live_deployment(plain), deployment_applied=True), {}, T0)["conditions"])


def test_unprotected_children_hold_or_serve_nothing():
    d = desired_of(obj({"networkPolicy": {}}))
    wanted = [c for c in d.children() if c["kind"] != "NetworkPolicy"]
    assert [c["kind"] for c in _unprotected_children(wanted, held=True)] == ["Service", "PodDisruptionBudget"]
    zero = _unprotected_children(wanted, held=False)
    dep = next(c for c in zero if c["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 0 and d.deployment["spec"]["replicas"] == 1  # a copy, the desired one intact
    assert needs_apply(d.deployment, dep)  # once the fence is up, the replicas come back


def test_events_of_cluster_scoped_objects_go_to_default():
    policy = {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "GPUSharePolicy", "metadata": {"name": "p", "uid": "u"}}
    event = event_manifest(policy, "Normal", "WindowChanged", "day")
    assert event["metadata"]["namespace"] == "default" and event["involvedObject"]["namespace"] is None
    namespaced = event_manifest({"kind": "Job", "metadata": {"name": "j", "namespace": "batch"}}, "Normal", "R", "m")
    assert namespaced["metadata"]["namespace"] == "batch"


def test_a_share_policy_label_naming_no_policy_is_a_condition():
    d = desired_of(obj())
    live = live_deployment(d)
    missing = compute_status(d, Observed(live_deployment=live, deployment_applied=True,
                                         share_policy=("nightly", False)), {}, T0)
    cond = _cond(missing, "SharePolicy")
    assert cond["status"] == "False" and cond["reason"] == "PolicyNotFound" and "nightly" in cond["message"]
    assert ("Warning", "SharePolicyFalse") in [(t, r) for t, r, _ in transitions([], missing["conditions"])]
    found = compute_status(d, Observed(live_deployment=live, deployment_applied=True,
                                       share_policy=("nightly", True)), missing, T1)
    assert _cond(found, "SharePolicy")["status"] == "True"
