"""Operator throughput and steady-state writes, against a real API server.

    python -m bench.operator [--objects 1000] [--rounds 3] [--kubeconfig PATH]

Without --kubeconfig it starts the local control plane (hack/cluster, needs its binaries)
and stops it at the end. Per round, in fresh namespaces:

- baseline: the same API server takes the *bare writes* the operator would make for N
  ChatTTSDeployments (zero replicas, so no pod churn muddies either side): create the N objects, then server-side apply their ConfigMap,
  Deployment, Service and PodDisruptionBudget (built by the operator's own builders) and
  patch their status, 64 requests in flight;
- operator: the operator (a subprocess, as in its container, already running and idle)
  watches a namespace; the N objects are created the same way and the clock stops when
  every object has its four children and a status for its generation.

Rounds alternate which side goes first. Reported: medians over rounds and the ratio
operator/baseline (goal: <= 1.5), then, after
the last round, the writes one resync pass of all N objects makes (goal: 0, counted by
resourceVersion of every object and child and by the operator's write counters) and the
operator's resident memory.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "cluster"))

from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

from chattts_operator.api.chattts import API_VERSION, KIND, PLURAL  # noqa: E402
from chattts_operator.kube import Kube, make_api_client  # noqa: E402
from chattts_operator.reconcile import Observed, compute_status, desired_state, parse_spec  # noqa: E402
from chattts_operator.settings import OperatorSettings  # noqa: E402

RESULTS = REPO / "bench" / "results"
IN_FLIGHT = 64
CHILD_LISTS = {
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
}
SELECTOR = "app.kubernetes.io/managed-by=chattts-operator"


def ctd(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
        # Zero replicas: the benchmark measures the operator's own API work, not the pod churn
        # the controller-manager and kwok would add to whichever phase runs next.
        "spec": {"replicas": 0, "model": {"hostPath": {"path": "/srv/models/chattts"}, "format": "awq"},
                 "gpu": {"memory": "8Gi"}},
    }


async def _bounded(calls, limit: int = IN_FLIGHT) -> list[Any]:
    """Run coroutine factories, ``limit`` at a time; an overloaded API server's 429/5xx is
    retried (the operator retries those too), so both sides pay the same back-off."""
    semaphore = asyncio.Semaphore(limit)

    async def run(make):
        async with semaphore:
            for attempt in range(8):
                try:
                    return await make()
                except ApiException as err:
                    if err.status not in (429, 500, 503, 504) or attempt == 7:
                        raise
                    await asyncio.sleep(0.5 * 2 ** attempt)
    return await asyncio.gather(*(run(m) for m in calls))


async def create_namespace(kube: Kube, name: str) -> None:
    await kube._call("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": name}})


async def create_objects(kube: Kube, namespace: str, n: int) -> list[dict[str, Any]]:
    path = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"
    return await _bounded(
        (lambda i=i: kube._call("POST", path, body=ctd(f"tts-{i}"))) for i in range(n))


async def baseline_round(kube: Kube, namespace: str, n: int) -> float:
    settings = OperatorSettings()
    await create_namespace(kube, namespace)
    started = time.perf_counter()
    created = await create_objects(kube, namespace, n)

    async def children_and_status(body: dict[str, Any]) -> None:
        desired = desired_state(body, parse_spec(body), settings, largest_node_gpu_mib=None)
        live = None
        for child in desired.children():
            applied = await kube.apply(child)
            if child["kind"] == "Deployment":
                live = applied
        status = compute_status(desired, Observed(live, deployment_applied=True), None, "2026-01-01T00:00:00Z")
        await kube.patch_status(KIND, namespace, body["metadata"]["name"], status)

    await _bounded((lambda b=body: children_and_status(b)) for body in created)
    return time.perf_counter() - started


async def list_items(kube: Kube, path: str, selector: str | None = None) -> list[dict[str, Any]]:
    query = [("labelSelector", selector)] if selector else []
    data = await kube._call("GET", path, query=query)
    return data.get("items") or []


async def all_reconciled(kube: Kube, namespace: str, n: int) -> bool:
    objs = await list_items(kube, f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}")
    done = sum(1 for o in objs if (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"]
               and (o.get("status") or {}).get("appliedGeneration") == o["metadata"]["generation"])
    if done < n:
        return False
    for path in CHILD_LISTS.values():
        if len(await list_items(kube, path.format(ns=namespace), SELECTOR)) < n:
            return False
    return True


async def resource_versions(kube: Kube, namespace: str) -> dict[str, str]:
    out = {}
    paths = {"ctd": f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}",
             **{k: p.format(ns=namespace) for k, p in CHILD_LISTS.items()}}
    for kind, path in paths.items():
        for item in await list_items(kube, path):
            out[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Operator:
    def __init__(self, kubeconfig: Path, namespaces: list[str], resync: float, log: Path) -> None:
        self.metrics_port, self.health_port = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig),
               "CHATTTS_OPERATOR_METRICS_PORT": str(self.metrics_port),
               "CHATTTS_OPERATOR_HEALTH_PORT": str(self.health_port),
               "CHATTTS_OPERATOR_RESYNC_INTERVAL_SECONDS": str(resync),
               "CHATTTS_OPERATOR_RESYNC_CONCURRENCY": "32"}
        args = [sys.executable, "-m", "chattts_operator", "run"]
        for ns in namespaces:
            args += ["--namespace", ns]
        self.proc = subprocess.Popen(args, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + 60
        while not self._get(f"http://127.0.0.1:{self.health_port}/healthz"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"operator did not start; see {log}")
            time.sleep(0.3)

    @staticmethod
    def _get(url: str) -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.read().decode()
        except OSError:
            return None

    def metric(self, name: str, **labels: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families
        text = self._get(f"http://127.0.0.1:{self.metrics_port}/metrics") or ""
        total = 0.0
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def operator_round(kube: Kube, namespace: str, n: int) -> float:
    started = time.perf_counter()
    await create_objects(kube, namespace, n)
    while True:
        try:
            if await all_reconciled(kube, namespace, n):
                break
        except ApiException as err:
            if err.status not in (429, 500, 503, 504):
                raise  # a busy API server only delays the check
        await asyncio.sleep(0.25)
    return time.perf_counter() - started


async def main_async(args: argparse.Namespace, kubeconfig: Path) -> dict[str, Any]:
    os.environ["KUBECONFIG"] = str(kubeconfig)
    kube = Kube(await make_api_client())
    stamp = str(int(time.time()))
    log_dir = RESULTS / "tmp"
    log_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "apply", "--server-side", "--force-conflicts",
                    "-f", str(REPO / "deploy" / "crds" / "tts.chattts.io_chattsdeployments.yaml")],
                   check=True, capture_output=True)
    subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "wait", "--for=condition=Established",
                    "crd/chattsdeployments.tts.chattts.io"], check=True, capture_output=True)
    op_namespaces = [f"bench-op-{stamp}-{r}" for r in range(args.rounds)]
    for ns in op_namespaces:
        await create_namespace(kube, ns)
    operator = Operator(kubeconfig, op_namespaces, args.resync, log_dir / f"operator-{stamp}.log")
    baseline, measured = [], []
    try:
        await asyncio.sleep(2)  # let the operator finish its initial (empty) listing
        rss_idle = operator.rss_mib()
        for r in range(args.rounds):
            # Alternate the order so neither side always runs on a cluster still busy with the other.
            if r % 2 == 0:
                baseline.append(await baseline_round(kube, f"bench-base-{stamp}-{r}", args.objects))
                measured.append(await operator_round(kube, op_namespaces[r], args.objects))
            else:
                measured.append(await operator_round(kube, op_namespaces[r], args.objects))
                baseline.append(await baseline_round(kube, f"bench-base-{stamp}-{r}", args.objects))
            print(f"round {r}: baseline {baseline[-1]:.2f}s operator {measured[-1]:.2f}s", flush=True)

        # Steady state: one more resync pass over everything must write nothing.
        await asyncio.sleep(2 * args.resync)  # let rollouts' trailing events settle
        before = {ns: await resource_versions(kube, ns) for ns in op_namespaces}
        writes_before = (operator.metric("chattts_operator_child_writes_total")
                         + operator.metric("chattts_operator_status_writes_total"))
        passes_before = operator.metric("chattts_operator_reconciles_total", trigger="resync")
        total = args.objects * args.rounds
        deadline = time.monotonic() + 10 * args.resync + 120
        while operator.metric("chattts_operator_reconciles_total", trigger="resync") < passes_before + total:
            if time.monotonic() > deadline:
                raise RuntimeError("the resync pass did not finish")
            await asyncio.sleep(1)
        after = {ns: await resource_versions(kube, ns) for ns in op_namespaces}
        changed = sum(1 for ns in op_namespaces for k, v in after[ns].items() if before[ns].get(k) != v)
        writes = (operator.metric("chattts_operator_child_writes_total")
                  + operator.metric("chattts_operator_status_writes_total")) - writes_before
        rss_loaded = operator.rss_mib()
    finally:
        operator.stop()
        for ns in op_namespaces + [f"bench-base-{stamp}-{r}" for r in range(args.rounds)]:
            try:
                await kube._call("DELETE", f"/api/v1/namespaces/{ns}")
            except Exception:  # noqa: BLE001 - best effort on a cluster we may share
                pass
        await kube.close()
    base_median, op_median = statistics.median(baseline), statistics.median(measured)
    return {
        "objects": args.objects,
        "rounds": args.rounds,
        "baseline_seconds": baseline,
        "operator_seconds": measured,
        "baseline_median_seconds": round(base_median, 3),
        "operator_median_seconds": round(op_median, 3),
        "ratio_operator_to_baseline": round(op_median / base_median, 3),
        "resync_objects_checked": total,
        "resync_changed_resource_versions": changed,
        "resync_operator_writes": writes,
        "operator_rss_mib_idle": round(rss_idle, 1),
        "operator_rss_mib_after": round(rss_loaded, 1),
        "host_cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator", description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--resync", type=float, default=20.0, help="operator resync interval, seconds")
    parser.add_argument("--kubeconfig", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "operator-results.json")
    args = parser.parse_args(argv)

    cluster = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        import localcluster
        cluster = localcluster.LocalCluster("bench-operator").start()
        kubeconfig = cluster.kubeconfig
    try:
        result = asyncio.run(main_async(args, kubeconfig))
    finally:
        if cluster is not None:
            cluster.stop(purge=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
