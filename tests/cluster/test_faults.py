"""Faults the operator must survive, on the session cluster (nothing here restarts a
control-plane component: those tests are in test_faults_restart.py, on a cluster of their own).

Each test prints its recovery time (``pytest -s`` shows it). The operator runs as a
subprocess watching only the test's namespace, so a SIGKILL is a real crash.
"""
from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import pytest

from tests.cluster.helpers import (
    CHILD_KINDS,
    MANAGED,
    converged,
    expected_config_hash,
    expected_configmap_name,
    kube_list,
    runtime_yaml,
)
from tests.support import ctd, wait_until

pytestmark = pytest.mark.slow  # minutes each on two cores

def children_by_kind(kubectl, namespace: str) -> dict[str, dict[str, str]]:
    """kind (lower-case plural) -> {name: uid} of everything labelled as managed by the operator."""
    out: dict[str, dict[str, str]] = {kind: {} for kind in CHILD_KINDS}
    plural = {"Deployment": "deployments", "ConfigMap": "configmaps", "Service": "services",
              "PodDisruptionBudget": "poddisruptionbudgets"}
    for item in kube_list(kubectl, namespace, ",".join(CHILD_KINDS), "-l", MANAGED):
        kind = plural[item["kind"]]
        name = item["metadata"]["name"]
        assert name not in out[kind], f"two {kind} named {name}"
        out[kind][name] = item["metadata"]["uid"]
    return out


def describe(kubectl, namespace: str, names: list[str], children: dict[str, dict[str, str]]) -> str:
    """For a failure message: the status and the children of these objects."""
    out = []
    for name in names:
        obj = json.loads(kubectl("get", "ctd", name, "-n", namespace, "-o", "json").stdout)
        have = [kind for kind in CHILD_KINDS if any(child == name or child.startswith(f"{name}-runtime-")
                                                    for child in children[kind])]
        st = obj.get("status") or {}
        out.append(f"{name}: generation {obj['metadata']['generation']}, status "
                   f"{ {k: st.get(k) for k in ('observedGeneration', 'appliedGeneration', 'phase')} }, "
                   f"conditions {[(c['type'], c['status'], c['reason']) for c in st.get('conditions') or []]}, "
                   f"annotations {sorted((obj['metadata'].get('annotations') or {}))}, children {have}")
    return "; ".join(out)


def all_converged(kubectl, namespace: str, count: int) -> list[dict[str, Any]] | None:
    items = kube_list(kubectl, namespace, "ctd")
    return items if len(items) == count and all(converged(o) for o in items) else None


# --- kill -9 in the middle of reconciling 200 objects --------------------------------------------------


def test_kill9_mid_reconcile_of_200_converges_without_duplicates_or_gaps(crds, namespace, operators):
    kubectl = crds.kubectl
    count = 200
    # Twenty with a serving pod (statuses must catch up with pods becoming ready), the rest
    # scaled to zero so the shared cluster's simulated nodes are not flooded.
    names = [f"tts-{i:03d}" for i in range(count)]
    objs = [ctd(name, replicas=1 if i < 20 else 0) for i, name in enumerate(names)]
    first = operators().start()
    kubectl("create", "-n", namespace, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}), timeout=180)
    # Kill it as soon as it has made some children: typically a small share of the 200.
    wait_until(lambda: kube_list(kubectl, namespace, "deployments", "-l", MANAGED), "the first Deployment",
               timeout=120, interval=0.1)
    first.kill()
    seen = children_by_kind(kubectl, namespace)
    statuses_before = sum(1 for o in kube_list(kubectl, namespace, "ctd") if converged(o))
    assert statuses_before < count or len(seen["deployments"]) < count, \
        "the operator finished all 200 before the kill: the test did not interrupt it"
    print(f"\nkilled with {len(seen['deployments'])}/{count} Deployments and {statuses_before}/{count} "
          "settled statuses")

    restarted = time.monotonic()
    second = operators().start()

    final_objs = wait_until(lambda: all_converged(kubectl, namespace, count), "all 200 statuses to catch up",
                            timeout=300, interval=1)
    recovery = time.monotonic() - restarted
    print(f"recovery after kill -9 (restart -> 200 converged): {recovery:.1f}s")

    final = children_by_kind(kubectl, namespace)
    by_name = {o["metadata"]["name"]: o for o in final_objs}
    for kind in CHILD_KINDS:
        expected = {expected_configmap_name(by_name[n]) if kind == "configmaps" else n: n for n in names}
        missing_names = sorted(expected[child] for child in set(expected) - set(final[kind]))
        assert set(final[kind]) == set(expected), (
            f"{kind}: {len(missing_names)} missing, extra {set(final[kind]) - set(expected)}; "
            + describe(kubectl, namespace, missing_names[:2], final))
        for name, uid in seen[kind].items():
            assert final[kind][name] == uid, f"{kind} {name} was recreated after the restart"
    # One ReplicaSet per Deployment: no Deployment was rolled twice (a changed template would
    # make a second one), and the pods of the twenty serving ones are exactly one each.
    replicasets = kube_list(kubectl, namespace, "replicasets")
    owners = sorted(rs["metadata"]["ownerReferences"][0]["name"] for rs in replicasets)
    assert owners == sorted(names)
    deployments = {d["metadata"]["name"]: d for d in kube_list(kubectl, namespace, "deployments", "-l", MANAGED)}
    for name in (names[0], names[19], names[20], names[-1]):
        template = deployments[name]["spec"]["template"]["metadata"]["annotations"]
        assert template["chattts.io/config-hash"] == expected_config_hash(by_name[name])
    pods = [p for p in kube_list(kubectl, namespace, "pods") if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 20
    # The second run wrote at most the children that were missing after the kill (fewer when an
    # apply the killed process had sent still landed): nothing the first run made was rewritten.
    missing = sum(count - len(seen[kind]) for kind in CHILD_KINDS)
    assert second.metric_sum("chattts_operator_child_writes_total") <= missing
    assert second.running() and second.starts == 1


# --- a spec edit while the previous rollout still progresses ------------------------------------------


def test_spec_edits_during_a_rollout_end_in_the_newest_spec(crds, namespace, operators):
    kubectl = crds.kubectl
    operators().start()
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(ctd("tts", replicas=3)))
    wait_until(lambda: all_converged(kubectl, namespace, 1), "tts Ready", timeout=120)
    # A rollout that cannot finish by itself: the new pods ask for a node label nobody has, so
    # they stay Pending and the old pods keep serving (rolling update).
    kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge",
            "-p", '{"spec":{"gpu":{"nodeSelector":{"chattts.io/faults-hold":"true"}}}}')

    def pending_pods() -> list[dict[str, Any]]:
        return [p for p in kube_list(kubectl, namespace, "pods")
                if p["status"].get("phase") == "Pending" and not p["metadata"].get("deletionTimestamp")]

    wait_until(pending_pods, "the second rollout to be under way (Pending new pods)", timeout=60)

    def observed() -> dict[str, Any] | None:
        o = json.loads(kubectl("get", "ctd", "tts", "-n", namespace, "-o", "json").stdout)
        return o if o["status"].get("observedGeneration") == o["metadata"]["generation"] else None

    # Status is written coalesced (status_coalesce_seconds), so it follows the new generation a
    # moment later; until then its observedGeneration says it describes the one before.
    obj = wait_until(observed, "status of the new generation", timeout=15)
    assert not converged(obj) and obj["status"]["phase"] != "Ready", obj["status"]
    edited = time.monotonic()
    for value in (32, 48, 80):  # three edits in quick succession; each makes a new generation
        kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge",
                "-p", json.dumps({"spec": {"engine": {"maxNumSeqs": value}}}))
    kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge",
            "-p", '{"spec":{"replicas":2,"gpu":{"nodeSelector":null}}}')

    def settled() -> dict[str, Any] | None:
        o = json.loads(kubectl("get", "ctd", "tts", "-n", namespace, "-o", "json").stdout)
        if not converged(o):
            return None
        dep = json.loads(kubectl("get", "deployment", "tts", "-n", namespace, "-o", "json").stdout)
        st = dep.get("status") or {}
        if st.get("updatedReplicas") != 2 or st.get("replicas") != 2 or st.get("readyReplicas") != 2:
            return None  # old pods still terminating
        return o

    final = wait_until(settled, "the newest spec rolled out", timeout=180)
    print(f"\nspec edits during a rollout: newest spec rolled out {time.monotonic() - edited:.1f}s after the first edit")
    assert final["metadata"]["generation"] >= 6 and final["spec"]["engine"]["maxNumSeqs"] == 80
    assert not pending_pods()
    assert "max_num_seqs: 80" in runtime_yaml(kubectl, namespace, "tts")
    dep = json.loads(kubectl("get", "deployment", "tts", "-n", namespace, "-o", "json").stdout)
    assert dep["spec"]["replicas"] == 2
    assert "chattts.io/faults-hold" not in json.dumps(dep["spec"]["template"]["spec"])
    assert dep["spec"]["template"]["metadata"]["annotations"]["chattts.io/config-hash"] == expected_config_hash(final)
    # Every running pod is of the newest template.
    pods = [p for p in kube_list(kubectl, namespace, "pods") if not p["metadata"].get("deletionTimestamp")]
    newest = dep["spec"]["template"]["metadata"]["annotations"]["chattts.io/config-hash"]
    assert len(pods) == 2 and all(p["metadata"]["annotations"]["chattts.io/config-hash"] == newest for p in pods)


# --- a concurrent status writer ------------------------------------------------------------------


def test_a_concurrent_status_writer_gets_409s_and_the_operator_loses_no_update(crds, namespace, operators):
    """The operator writes status with a JSON merge patch and children with server-side apply
    (force), neither with a resourceVersion precondition, so the API server has no 409 to give
    it: it cannot be made to retry in a loop, and a concurrent writer cannot make it drop its
    own update. The competing writer here uses read-modify-write (GET, then PUT /status with
    the resourceVersion read) and gets real 409s when the operator wrote in between; its
    clobbered statuses are put right by the operator's next reconcile (resync every second)."""
    kubectl = crds.kubectl
    op = operators(resync_interval_seconds="1").start()
    names = ["tts-a", "tts-b"]
    kubectl("apply", "-n", namespace, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [ctd(n, replicas=1) for n in names]}))
    wait_until(lambda: all_converged(kubectl, namespace, 2), "both Ready", timeout=120)

    stop = threading.Event()
    conflicts, clobbers, errors = [0], [0], []

    def competing_writer() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            name = rng.choice(names)
            try:
                obj = json.loads(kubectl("get", "ctd", name, "-n", namespace, "-o", "json").stdout)
                time.sleep(rng.uniform(0.2, 1.2))  # a slow read-modify-write: the operator may write meanwhile
                obj["status"] = {**(obj.get("status") or {}), "phase": "Clobbered", "observedGeneration": 0}
                result = kubectl("replace", "--subresource=status", "-f", "-", "-n", namespace,
                                 input=json.dumps(obj), check=False)
                if result.returncode == 0:
                    clobbers[0] += 1
                elif "Conflict" in result.stderr or "modified" in result.stderr:
                    conflicts[0] += 1
                else:
                    errors.append(result.stderr.strip())
            except Exception as err:  # noqa: BLE001 - reported below
                errors.append(repr(err))

    writer = threading.Thread(target=competing_writer, daemon=True)
    writer.start()
    try:
        # Meanwhile the user changes the specs: each change must survive the race.
        for value in (20, 24, 28, 32):
            for name in names:
                kubectl("patch", "ctd", name, "-n", namespace, "--type=merge",
                        "-p", json.dumps({"spec": {"engine": {"maxNumSeqs": value}}}))
            time.sleep(2)
        # Once the edits stop, its writes land too (and the operator's resync puts them right).
        wait_until(lambda: conflicts[0] >= 2 and clobbers[0] >= 2,
                   "the competing writer to hit 409 conflicts and to land writes", timeout=90)
    finally:
        stop.set()
        writer.join(timeout=30)
    stopped = time.monotonic()
    assert not errors, errors[:3]
    final = wait_until(lambda: all_converged(kubectl, namespace, 2), "statuses put right after the writer stopped",
                       timeout=60)
    print(f"\ncompeting status writer: {conflicts[0]} conflicts (409), {clobbers[0]} clobbers; "
          f"statuses right again {time.monotonic() - stopped:.1f}s after it stopped")
    for obj in final:
        assert obj["spec"]["engine"]["maxNumSeqs"] == 32
        dep = json.loads(kubectl("get", "deployment", obj["metadata"]["name"], "-n", namespace, "-o", "json").stdout)
        assert dep["spec"]["template"]["metadata"]["annotations"]["chattts.io/config-hash"] == \
            expected_config_hash(obj)
    # No crash loop: the same process throughout, and no reconcile failed.
    assert op.running() and op.starts == 1
    assert op.metric_sum("chattts_operator_reconcile_errors_total") == 0
