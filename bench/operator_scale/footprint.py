"""What unrelated objects cost the operator, and what server-side label selectors save:
``python -m bench.operator_scale.footprint [--unrelated 5000] [--managed 100]``.

On its own cluster (default ``opscale-footprint``): M managed ChatTTSDeployments (scaled to
zero: their pods do not matter here), then for "no unrelated objects" and "U unrelated
Deployments + U Pods" the operator is started fresh, once as it is and once with
server-side label selectors on its Deployment watch (variant_selectors.py), and measured:
start-up (resume of all M) requests and CPU, resident memory, idle CPU, and the CPU it
spends while 500 unrelated Deployments change (events it must filter out itself).
Writes ``operator-scale-footprint.json`` and ``.md`` under ``--out``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.operator_scale import workload
from bench.operator_scale.scale import NODES_FILE, machine
from bench.operator_scale.kubeapi import Api, bounded_gather, ssl_context_for
from bench.operator_scale.run import REPO, Bench, install_crds, loadavg, log, versions

sys.path.insert(0, str(REPO / "hack" / "cluster"))
import localcluster  # noqa: E402

VARIANTS = {"as is": "chattts_operator",
            "kopf label_selectors variant": "bench.operator_scale.variant_selectors"}


async def churn_cpu(bench: Bench, namespaces: list[str], count: int) -> dict:
    """Operator CPU while ``count`` unrelated Deployments get an annotation changed."""
    op = bench.operator
    before = op.proc_sample()
    stamp = str(time.time())
    jobs = [lambda i=i: bench.api.merge_patch("Deployment", namespaces[i % len(namespaces)], f"other-{i:05d}",
                                              {"metadata": {"annotations": {"bench/churn": stamp}}})
            for i in range(count)]
    t0 = time.monotonic()
    await bounded_gather(jobs, bench.concurrency)
    await asyncio.sleep(5)
    after = op.proc_sample()
    return {"changed": count, "seconds": round(time.monotonic() - t0, 1),
            "operator_cpu_seconds": round(after.cpu_seconds - before.cpu_seconds, 2)}


async def run(args, cluster, results: dict) -> None:
    async with Api(cluster.server, ssl_context_for(cluster.pki), connections=args.concurrency + 16) as api:
        bench = Bench(cluster, api, args.out, args.concurrency, time.monotonic() + args.max_minutes * 60)
        namespace = "bench-footprint"
        if await api.get("Namespace", None, namespace) is None:
            await bench.create_namespace(namespace)
        existing = {o["metadata"]["name"] for o in await api.list("ChatTTSDeployment", namespace)}
        await bounded_gather([lambda i=i: api.create(workload.chattts_deployment(workload.ctd_name(i), namespace,
                                                                                  replicas=0))
                              for i in range(args.managed) if workload.ctd_name(i) not in existing],
                             args.concurrency)
        unrelated_ns = [f"bench-unrelated-{k}" for k in range(10)]
        try:
            for scene in ("none", "unrelated"):
                if scene == "unrelated":
                    if bench.operator is None:
                        bench.start_operator()
                    results["unrelated_created"] = await bench.create_unrelated(args.unrelated)
                for label, module in VARIANTS.items():
                    key = f"{scene}: {label}"
                    result = await bench.restart(args.managed, key, module=module)
                    if scene == "unrelated":
                        result["churn"] = await churn_cpu(bench, unrelated_ns, min(500, args.unrelated))
                    result["loadavg_1m_end"] = loadavg()
                    results.setdefault("runs", []).append(result)
                    (args.out / "operator-scale-footprint.json").write_text(json.dumps(results, indent=2) + "\n")
        finally:
            if bench.operator is not None:
                bench.operator.stop()


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = ["# Operator footprint with unrelated objects", "",
             f"`{meta['command']}` on {meta['date']}; {meta['machine']}; "
             + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".", "",
             f"{meta['managed']} managed ChatTTSDeployments; the operator watches the whole cluster (as the chart "
             "runs it) and is started fresh for each row.", "",
             "| scene / operator | resume all (s) | start-up requests | start-up CPU (s) | RSS (MiB) | peak RSS (MiB) "
             "| idle CPU % | CPU for 500 unrelated changes (s) | load avg |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results.get("runs", []):
        churn = r.get("churn", {}).get("operator_cpu_seconds", "")
        lines.append(f"| {r['label']} | {r['seconds_to_resume_all']} | {r['startup_requests']} | "
                     f"{r['startup_cpu_seconds']} | {r['rss_mib']} | {r['peak_rss_mib']} | {r['idle_cpu_percent']} | "
                     f"{churn} | {r['loadavg_1m']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_scale.footprint",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--unrelated", type=int, default=5000)
    parser.add_argument("--managed", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-minutes", type=float, default=40)
    parser.add_argument("--cluster-name", default="opscale-footprint")
    parser.add_argument("--keep-cluster", action="store_true", help="leave it running (and reuse it next time)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = localcluster.LocalCluster(args.cluster_name, nodes_file=NODES_FILE)
    log(f"starting (or reusing) cluster {args.cluster_name!r}")
    cluster.start()
    results = {"meta": {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
                        "command": "python -m bench.operator_scale.footprint "
                                   + " ".join(argv if argv is not None else sys.argv[1:]),
                        "versions": versions(cluster), "managed": args.managed, "unrelated": args.unrelated}}
    try:
        install_crds(cluster)
        asyncio.run(run(args, cluster, results))
    finally:
        if not args.keep_cluster:
            cluster.stop(purge=True)
        (args.out / "operator-scale-footprint.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "operator-scale-footprint.md").write_text(markdown(results))
        print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
