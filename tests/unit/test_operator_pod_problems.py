"""Pod-level reasons in status (pure): the pods' own words reach the ChatTTSDeployment's
conditions and phase when replicas are not ready, bounded, the most serious first."""
from __future__ import annotations

import pytest

from chattts_operator.deployment.pods import MAX_POD_MESSAGE, pod_problem, pod_problems, summary
from chattts_operator.deployment.status import Observed, compute_status, transitions
from tests.unit.test_operator_reconcile import T0, T1, conditions_by_type, desired_of, live_deployment, obj

SCHEDULER_PVC = ('0/8 nodes are available: persistentvolumeclaim "weights-missing" not found. '
                 'preemption: 0/8 nodes are available: 8 Preemption is not helpful for scheduling.')


def pod(name="tts-7d9f-abcde", *, phase="Pending", conditions=(), containers=(), reason=None, message=None,
        deleting=False):
    meta = {"name": name, "namespace": "ns", "labels": {"app.kubernetes.io/instance": "tts"}}
    if deleting:
        meta["deletionTimestamp"] = T0
    status = {"phase": phase, "conditions": list(conditions), "containerStatuses": list(containers)}
    if reason:
        status.update(reason=reason, message=message)
    return {"metadata": meta, "status": status}


def unschedulable(name="tts-7d9f-abcde", message=SCHEDULER_PVC):
    return pod(name, conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                  "message": message}])


def waiting(reason, message="", name="tts-7d9f-abcde", **extra):
    return pod(name, containers=[{"name": "runtime", "ready": False, "restartCount": extra.get("restarts", 0),
                                  "state": {"waiting": {"reason": reason, "message": message}},
                                  "lastState": extra.get("last_state", {})}])


@pytest.mark.parametrize("the_pod, reason, phase, words", [
    (unschedulable(), "PodsUnschedulable", "Unschedulable", 'persistentvolumeclaim "weights-missing" not found'),
    (waiting("ImagePullBackOff", 'Back-off pulling image "chattts-runtime:nope"'), "ImagePullFailed",
     "ImagePullBackOff", 'Back-off pulling image "chattts-runtime:nope"'),
    (waiting("ErrImagePull", "manifest unknown"), "ImagePullFailed", "ImagePullBackOff", "manifest unknown"),
    (waiting("CrashLoopBackOff", "back-off 40s restarting failed container", restarts=4,
             last_state={"terminated": {"exitCode": 2, "reason": "Error"}}),
     "PodsCrashLooping", "CrashLoopBackOff", "restarts 4, last exit 2 Error"),
    (waiting("CreateContainerConfigError", 'secret "keys" not found'), "ContainerConfigError",
     "ContainerConfigError", 'secret "keys" not found'),
    (pod(phase="Failed", reason="Evicted", message="The node was low on resource: memory."), "PodsEvicted",
     "Evicted", "low on resource: memory"),
])
def test_each_kind_of_trouble_is_named_with_the_pods_own_message(the_pod, reason, phase, words):
    problem = pod_problem(the_pod)
    assert problem is not None and (problem.reason, problem.phase) == (reason, phase)
    assert words in problem.message and problem.pod == "tts-7d9f-abcde"


@pytest.mark.parametrize("the_pod", [
    pod(phase="Running", containers=[{"name": "runtime", "ready": True, "state": {"running": {}}}]),
    waiting("ContainerCreating"),  # starting normally
    pod(conditions=[{"type": "PodScheduled", "status": "True"}]),
    unschedulable(),  # ...but it is going away
])
def test_healthy_starting_or_terminating_pods_are_no_trouble(the_pod):
    if the_pod["status"]["conditions"] and the_pod["status"]["conditions"][0].get("reason") == "Unschedulable":
        the_pod["metadata"]["deletionTimestamp"] = T0
    assert pod_problem(the_pod) is None


def test_messages_are_bounded_and_only_a_few_pods_are_named():
    pods = [unschedulable(f"tts-x-{i}", "0/8 nodes are available: " + "x" * 5000) for i in range(6)]
    problems = pod_problems(pods)
    assert all(len(p.message) <= MAX_POD_MESSAGE for p in problems)
    text = summary(problems)
    assert text.count("pod tts-x-") == 3 and text.endswith("and 3 more pod(s)") and len(text) < 1200


def test_the_most_serious_trouble_comes_first():
    problems = pod_problems([unschedulable("b"), waiting("CrashLoopBackOff", name="c"), waiting("ErrImagePull", name="a")])
    assert [p.pod for p in problems] == ["c", "a", "b"]


def test_a_pending_pod_s_scheduler_message_reaches_ready_progressing_and_the_phase():
    d = desired_of(obj())
    dep = live_deployment(d, ready=0, updated=1)
    quiet = compute_status(d, Observed(dep, deployment_applied=True), None, T0)
    assert quiet["phase"] == "Progressing"  # pods merely starting: nothing to say yet
    status = compute_status(d, Observed(dep, deployment_applied=True, pods=[unschedulable()]), quiet, T1)
    c = conditions_by_type(status)
    assert status["phase"] == "Unschedulable"
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "PodsUnschedulable"
    assert 'pod tts-7d9f-abcde: Pending: 0/8 nodes are available: persistentvolumeclaim "weights-missing" not found' \
        in c["Ready"]["message"]
    assert c["Ready"]["message"].startswith("0/1 replicas ready; ")
    assert c["Progressing"]["status"] == "True" and c["Progressing"]["reason"] == "PodsUnschedulable"
    assert c["Progressing"]["message"].startswith("0 of 1 updated replicas available; pod tts-7d9f-abcde")
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == "PodsUnschedulable"
    # A Warning Event says it too (once, on the transition; Ready was False already).
    events = transitions(quiet["conditions"], status["conditions"])
    assert [(e[0], e[1]) for e in events] == [("Warning", "DegradedTrue")]
    assert "persistentvolumeclaim" in events[0][2]


def test_a_complete_rollout_ignores_a_stray_pending_pod():
    d = desired_of(obj())
    status = compute_status(d, Observed(live_deployment(d), deployment_applied=True, pods=[unschedulable()]), None, T0)
    assert status["phase"] == "Ready" and conditions_by_type(status)["Degraded"]["status"] == "False"


def test_a_stuck_rollout_with_old_pods_still_serving_is_degraded_but_ready():
    d = desired_of(obj())
    dep = live_deployment(d, ready=1, updated=1, replicas=2)  # the new pod cannot pull its image
    status = compute_status(d, Observed(dep, deployment_applied=True,
                                        pods=[waiting("ImagePullBackOff", "not found", name="tts-new")]), None, T0)
    c = conditions_by_type(status)
    assert c["Ready"]["status"] == "True" and status["phase"] == "ImagePullBackOff"
    assert c["Progressing"]["reason"] == "ImagePullFailed" and "pod tts-new" in c["Progressing"]["message"]
