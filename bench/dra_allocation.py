"""Time to serve, dra profile against gpu-memory (the baseline), on the local control plane.

Each round applies N one-replica ChatTTSDeployments of one profile to the simulated GPU nodes
and measures, per object, the seconds from the apply until its status says Ready (for dra:
also every claim allocated, status.gpu.dra); then deletes them and waits until their pods are
gone. Rounds alternate the profiles, so both see the same machine load. The operator runs as
a subprocess (as its container runs it). Reported: medians per profile and the ratio.

    .venv/bin/python -m bench.dra_allocation [--objects 16] [--rounds 3] [--out bench/results/dra-allocation]

Uses the cluster named by $KUBECONFIG when it is one localcluster.py made, else starts its own
(``bench-dra``). The allocation itself is kube-scheduler's; the devices are simulated
(hack/cluster/draslices.py), so this measures the control plane's path, not a GPU's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack" / "cluster"))
import localcluster  # noqa: E402

from bench.operator_scale.operatorproc import OperatorProcess  # noqa: E402

PROFILES = ("gpu-memory", "dra")


def ctd(name: str, profile: str) -> dict[str, Any]:
    return {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "model": {"hostPath": {"path": "/srv/models/chattts"}, "format": "fp16"},
                     "gpu": {"memory": "8Gi", "profile": profile},
                     "engine": {"maxModelLen": 256}}}  # the graph engine's caches fit 8Gi at this length


def serving(obj: dict[str, Any], profile: str) -> bool:
    st = obj.get("status") or {}
    if st.get("observedGeneration") != obj["metadata"]["generation"] or st.get("phase") != "Ready":
        return False
    if profile != "dra":
        return True
    dra = (st.get("gpu") or {}).get("dra") or {}
    return dra.get("claims", 0) >= 1 and dra.get("allocatedClaims") == dra.get("claims")


def one_round(cluster, namespace: str, profile: str, objects: int) -> list[float]:
    names = [f"{profile}-{i}" for i in range(objects)]
    items = [ctd(name, profile) for name in names]
    started = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                            "items": items}))
    ready: dict[str, float] = {}
    deadline = started + 300
    while len(ready) < objects:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{profile}: only {len(ready)}/{objects} served after 300 s")
        now = time.monotonic()
        for obj in cluster.kubectl_json("get", "ctd", "-n", namespace)["items"]:
            name = obj["metadata"]["name"]
            if name in names and name not in ready and serving(obj, profile):
                ready[name] = now - started
        time.sleep(0.2)
    cluster.kubectl("delete", "ctd", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
    deadline = time.monotonic() + 120
    while cluster.kubectl_json("get", "pods,resourceclaims", "-n", namespace)["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError("pods or claims left after 120 s")
        time.sleep(0.5)
    return sorted(ready.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "dra-allocation"))
    args = parser.parse_args(argv)

    kubeconfig = os.environ.get("KUBECONFIG")
    cluster = (localcluster.LocalCluster.from_kubeconfig(kubeconfig) if kubeconfig
               else localcluster.LocalCluster("bench-dra").start())
    namespace = f"bench-dra-{int(time.time())}"
    cluster.kubectl("create", "namespace", namespace)
    for crd in sorted((REPO / "deploy" / "crds").glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    samples: dict[str, list[float]] = {p: [] for p in PROFILES}
    with tempfile.TemporaryDirectory() as logs:
        op = OperatorProcess(cluster.kubeconfig, Path(logs), namespaces=(namespace,), resync_interval_seconds="2",
                             runtime_image="chattts-runtime:bench").start()
        try:
            for _ in range(args.rounds):
                for profile in PROFILES:
                    samples[profile] += one_round(cluster, namespace, profile, args.objects)
        finally:
            op.stop()
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    medians = {p: statistics.median(v) for p, v in samples.items()}
    result = {
        "what": "seconds from apply to status Ready (dra: and every claim allocated), one replica each",
        "objects_per_round": args.objects, "rounds": args.rounds,
        "median_seconds": medians,
        "p90_seconds": {p: statistics.quantiles(v, n=10)[-1] for p, v in samples.items()},
        "ratio_dra_to_gpu_memory": medians["dra"] / medians["gpu-memory"],
        "samples": samples,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(
        "# dra profile: time to serve against gpu-memory (same run)\n\n"
        f"`python -m bench.dra_allocation --objects {args.objects} --rounds {args.rounds}` on the local control "
        "plane (kube-scheduler allocates; devices simulated by hack/cluster/draslices.py).\n\n"
        "| profile | median s | p90 s |\n|---|---|---|\n"
        + "".join(f"| {p} | {medians[p]:.2f} | {result['p90_seconds'][p]:.2f} |\n" for p in PROFILES)
        + f"\nratio dra / gpu-memory (medians): {result['ratio_dra_to_gpu_memory']:.2f}\n")
    print(json.dumps({k: result[k] for k in ("median_seconds", "p90_seconds", "ratio_dra_to_gpu_memory")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
