"""The content-addressed runtime ConfigMap against the real API server and controllers: a config
change is a new ConfigMap applied at the same time as the Deployment that names it; the old one
stays while a revision of the Deployment (a ReplicaSet, scaled down or not) mounts it, so
``kubectl rollout undo`` finds its config, and goes once that ReplicaSet is pruned."""
from __future__ import annotations

from chattts_operator.deployment.children import mounted_configmap
from tests.cluster.helpers import INSTANCE, apply, get, runtime_configmap
from tests.cluster.test_operator_cache import settled
from tests.cluster.test_operator_lifecycle import ready
from tests.support import ctd, wait_until


def runtime_configmaps(kubectl, namespace: str, name: str) -> dict[str, dict]:
    return {cm["metadata"]["name"]: cm for cm in get(kubectl, namespace, "configmaps", "-l", f"{INSTANCE}={name}")["items"]}


def replicasets(kubectl, namespace: str, name: str) -> list[dict]:
    return get(kubectl, namespace, "replicasets", "-l", f"{INSTANCE}={name}")["items"]


def test_old_configmaps_stay_while_a_revision_mounts_them_and_go_with_it(crds, namespace, operators):
    kubectl = crds.kubectl
    op = operators(resync_interval_seconds="600").start()  # only watch events drive it here
    apply(kubectl, namespace, ctd("tts", replicas=1))
    obj = wait_until(lambda: settled(kubectl, namespace, "tts") and ready(kubectl, namespace, "tts"), "tts settled",
                     timeout=120)
    first = runtime_configmap(kubectl, namespace, "tts")
    assert first["immutable"] is True

    kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge", "-p", '{"spec":{"engine":{"maxNumSeqs":7}}}')
    wait_until(lambda: ready(kubectl, namespace, "tts", generation=2) and settled(kubectl, namespace, "tts"),
               "generation 2 rolled out", timeout=120)
    second = runtime_configmap(kubectl, namespace, "tts")
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert "max_num_seqs: 7" in second["data"]["runtime.yaml"]
    # Both revisions' configs are there, each owned by the ChatTTSDeployment (deleting it collects them).
    configmaps = runtime_configmaps(kubectl, namespace, "tts")
    assert set(configmaps) == {first["metadata"]["name"], second["metadata"]["name"]}
    for cm in configmaps.values():
        assert [(r["kind"], r["uid"]) for r in cm["metadata"]["ownerReferences"]] == [
            ("ChatTTSDeployment", obj["metadata"]["uid"])]

    # A rollback goes to a revision whose config still exists; the operator then puts its own
    # template back (spec is the desire), and nothing is lost on the way.
    kubectl("rollout", "undo", "deployment/tts", "-n", namespace)
    wait_until(lambda: mounted_configmap(get(kubectl, namespace, "deploy", "tts")) == second["metadata"]["name"]
               and settled(kubectl, namespace, "tts"), "the operator's template back and rolled out", timeout=120)
    assert set(runtime_configmaps(kubectl, namespace, "tts")) == set(configmaps)

    # The Deployment prunes a revision (here by hand): its ConfigMap goes, the serving one stays.
    writes = op.metric_sum("chattts_operator_child_writes_total")
    old = [rs for rs in replicasets(kubectl, namespace, "tts") if mounted_configmap(rs) == first["metadata"]["name"]]
    assert len(old) == 1 and old[0]["spec"]["replicas"] == 0
    kubectl("delete", "replicaset", old[0]["metadata"]["name"], "-n", namespace)
    wait_until(lambda: set(runtime_configmaps(kubectl, namespace, "tts")) == {second["metadata"]["name"]},
               "the pruned revision's ConfigMap deleted", timeout=30)
    assert op.metric_sum("chattts_operator_child_writes_total") == writes + 1  # that delete, nothing else
    assert ready(kubectl, namespace, "tts", generation=2)
