"""Operator scale benchmark: ``python -m bench.operator_scale [--sizes 100,1000] [--out bench/results]``.

Starts its own local control plane (``--cluster-name``, default ``opscale-bench``; never the
test cluster) with the nodes of ``nodes.yaml``, runs the phases of ``run.py`` and writes
``operator-scale-results.json`` and ``operator-scale-results.md``. ``--keep-cluster``
leaves the cluster running (``python hack/cluster/localcluster.py down --name opscale-bench``).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.operator_scale import pairs, report
from bench.operator_scale.kubeapi import Api, ssl_context_for
from bench.operator_scale.run import REPO, Bench, install_crds, log, versions

sys.path.insert(0, str(REPO / "hack" / "cluster"))
import localcluster  # noqa: E402

NODES_FILE = Path(__file__).resolve().parent / "nodes.yaml"


def machine() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import os  # noqa: PLC0415
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // 2 ** 20
    return f"{os.cpu_count()} cores ({cpu}), {mem} GiB, {platform.system()} {platform.release()}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000", help="comma-separated numbers of ChatTTSDeployments")
    parser.add_argument("--unrelated", type=int, default=5000, help="unrelated Deployments (and as many Pods); 0: skip")
    parser.add_argument("--reaction-samples", type=int, default=200)
    parser.add_argument("--reaction-rate", type=float, default=5.0, help="spec changes per second (open loop)")
    parser.add_argument("--resync-interval", type=float, default=30.0,
                        help="the operator's resync interval for the no-op resync phase (s)")
    parser.add_argument("--concurrency", type=int, default=32, help="the benchmark client's requests in flight")
    parser.add_argument("--max-minutes", type=float, default=45.0, help="phases after this are skipped")
    parser.add_argument("--operator-module", default="chattts_operator",
                        help="what `python -m` runs as the operator: chattts_operator, or an experiment variant "
                             "such as bench.operator_scale.variant_bounded")
    parser.add_argument("--reaction-compare", default="", metavar="SETTING=VALUE,...",
                        help="after the reaction phase, restart the operator with these settings (e.g. "
                             "event_loop=asyncio) and measure the reaction again: an A/B in the same run")
    parser.add_argument("--profile", action="store_true", help="py-spy the operator during the create and reaction phases")
    parser.add_argument("--fresh-cluster-per-side", action=argparse.BooleanOptionalAction, default=True,
                        help="purge and restart the control plane between a size's baseline and its operator "
                        "phase, so the operator does not run on the baseline's leftovers (a 1,000-object "
                        "namespace just deleted weighed on it: findings' fifth round)")
    parser.add_argument("--create-pairs", type=int, default=3,
                        help="the largest size's create is measured as this many pairs of bare writes and "
                        "operator, in alternating order, each side on a fresh control plane: the figure is "
                        "the median of the pairs' ratios (pairs.py; one pair moved 0.96x-1.33x between runs)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the bare writes (a confirming run of the later phases: no ratio then)")
    parser.add_argument("--cluster-name", default="opscale-bench")
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace, cluster: localcluster.LocalCluster, results: dict) -> None:
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results["sizes"] = sizes
    deadline = time.monotonic() + args.max_minutes * 60
    out_file = args.out / "operator-scale-results.json"

    def save() -> None:
        out_file.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")

    def connect() -> Api:
        return Api(cluster.server, ssl_context_for(cluster.pki), connections=args.concurrency + 16)

    async with contextlib.AsyncExitStack() as stack:
        api = await stack.enter_async_context(connect())
        bench = Bench(cluster, api, args.out, args.concurrency, deadline)
        bench.profile = args.profile
        bench.operator_module = args.operator_module
        async def phase(key: str, coro) -> None:
            """Run one phase; a failure is recorded and the next phase still runs."""
            if time.monotonic() > deadline:
                results[key] = {"skipped": "out of time (--max-minutes)"}
                coro.close()
                return
            try:
                results[key] = await coro
            except Exception as err:  # noqa: BLE001 - keep the other figures
                log(f"phase {key} failed: {err!r}")
                results[key] = {"error": repr(err)}
            save()

        async def fresh_cluster(side: str) -> None:
            log(f"fresh control plane for the {side} side")
            await asyncio.to_thread(restart_cluster, cluster)
            bench.api = await stack.enter_async_context(connect())  # new PKI and ports

        try:
            for i, n in enumerate(sizes):
                largest = i == len(sizes) - 1
                if args.no_baseline:
                    await phase(f"operator_{n}", bench.operator_create(n, keep=largest))
                    continue
                # Alternating pairs (pairs.py); baseline_N and operator_N hold the last of each side.
                sides = pairs.side_order(args.create_pairs if largest else 1)
                fresh = args.fresh_cluster_per_side
                done: list[tuple[str, dict]] = []
                for j, side in enumerate(sides):
                    if j and fresh:
                        await fresh_cluster(side)
                    last = j == len(sides) - 1
                    if side == pairs.BASELINE:
                        await phase(f"baseline_{n}", bench.baseline(n, clean_up=not fresh))
                    else:
                        await phase(f"operator_{n}", bench.operator_create(n, keep=largest and last,
                                                                           clean_up=not fresh))
                    done.append((side, results.get(f"{side}_{n}") or {}))
                if len(sides) > 2:
                    results[f"create_pairs_{n}"] = pairs.pair_up(done)
                    results[f"create_summary_{n}"] = pairs.summary(results[f"create_pairs_{n}"])
                    save()
            managed = sizes[-1]
            interval = str(args.resync_interval)
            # With the operator's default settings (resync every 300 s): the resume storm, then
            # the reaction time; then with a short resync interval, one no-op resync pass.
            await phase("restart_none", bench.restart(managed, "no unrelated objects"))
            await phase("reaction", bench.reaction(f"bench-op-{managed}", managed, args.reaction_samples,
                                                   args.reaction_rate))
            if args.reaction_compare:
                compare = dict(pair.split("=", 1) for pair in args.reaction_compare.split(","))
                await phase("restart_compare", bench.restart(managed, f"compare: {args.reaction_compare}", **compare))
                await phase("reaction_compare", bench.reaction(f"bench-op-{managed}", managed, args.reaction_samples,
                                                               args.reaction_rate, label="compare"))
            await phase("restart_short_resync", bench.restart(managed, f"resync every {interval} s",
                                                              resync_interval_seconds=interval))
            await phase("noop_resync", bench.noop_resync(managed, args.resync_interval))
            if args.unrelated:
                await phase("unrelated", bench.create_unrelated(args.unrelated))
                await phase("restart_unrelated", bench.restart(
                    managed, f"{args.unrelated} unrelated Deployments + Pods", resync_interval_seconds=interval))
        finally:
            if bench.operator is not None:
                bench.operator.stop()
            save()


def restart_cluster(cluster: localcluster.LocalCluster) -> None:
    """An empty control plane again: new etcd, ports and PKI, the CRDs installed."""
    cluster.stop(purge=True)
    cluster.start()
    install_crds(cluster)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = localcluster.LocalCluster(args.cluster_name, nodes_file=NODES_FILE)
    log(f"starting cluster {args.cluster_name!r}")
    cluster.stop(purge=True)  # a fresh, empty etcd: earlier runs must not weigh on this one
    cluster.start()
    results: dict = {"meta": {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "command": "python -m bench.operator_scale " + " ".join(argv if argv is not None else sys.argv[1:]),
        "versions": versions(cluster),
        "settings": {k: str(v) for k, v in vars(args).items()},
    }}
    try:
        install_crds(cluster)
        asyncio.run(run(args, cluster, results))
    finally:
        if not args.keep_cluster:
            cluster.stop(purge=True)
        (args.out / "operator-scale-results.md").write_text(report.markdown(results))
        print(report.table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
