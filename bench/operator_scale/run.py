"""The phases of the benchmark, against its own local control plane.

Order (each phase bounded in time; a phase that runs out records ``timed_out``):
 1. for N in sizes: baseline (no operator: create N ChatTTSDeployments and server-side
    apply their children from the operator's builders), then the operator (cluster-wide
    subprocess, create the same N objects, wait for every child and status, then ready);
 2. with the largest N managed: a restart of the operator (the resume storm: time,
    requests, writes, memory, CPU), a no-op resync pass (requests and writes), the
    reaction time from spec change to Deployment update;
 3. 5,000 unrelated Deployments and Pods created while the operator runs (its memory and
    CPU meanwhile), then a restart with them present.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Awaitable, Callable

from chattts_operator.core.settings import OperatorSettings

from bench.operator_scale import apimetrics, workload
from bench.operator_scale.kubeapi import Api, ApiError, bounded_gather
from bench.operator_scale.latency import GcPauses, full_collections, percentile, segment_summary
from bench.operator_scale.operatorproc import OperatorProcess
from bench.operator_scale.tracker import NamespaceTracker

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "deploy" / "crds"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loadavg() -> float:
    """The 1-minute load average: how busy the (shared) machine was around a phase."""
    return float(Path("/proc/loadavg").read_text().split()[0])


class Bench:
    def __init__(self, cluster, api: Api, out_dir: Path, concurrency: int, deadline: float) -> None:
        self.cluster, self.api, self.out_dir = cluster, api, out_dir
        self.concurrency = concurrency
        self.deadline = deadline  # time.monotonic() after which phases are skipped
        self.log_dir = out_dir / "operator-scale-logs"
        self.operator: OperatorProcess | None = None
        self.results: dict[str, Any] = {}
        self.profile = False  # sample the operator's stacks with py-spy during the create phases
        self.operator_module = "chattts_operator"  # or an experiment variant (variant_*.py)
        self._reaction_phases = 0  # reaction phases run so far (each patches values of its own)

    def remaining(self, cap: float) -> float:
        return max(5.0, min(cap, self.deadline - time.monotonic()))

    # --- cluster helpers -------------------------------------------------------------------

    async def api_counts(self) -> Counter:
        return apimetrics.parse_request_totals(await self.api.text("/metrics"))

    async def create_namespace(self, name: str) -> None:
        await self.api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    async def delete_namespace(self, name: str, timeout: float = 400) -> float:
        started = time.monotonic()
        await self.api.delete("Namespace", None, name)
        while await self.api.get("Namespace", None, name) is not None:
            if time.monotonic() - started > timeout:
                log(f"namespace {name} still terminating after {timeout:.0f}s; going on")
                break
            await asyncio.sleep(1)
        return time.monotonic() - started

    async def create_ctds(self, namespace: str, n: int,
                          then: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> list[dict[str, Any]]:
        async def one(i: int) -> dict[str, Any]:
            created = await self.api.create(workload.chattts_deployment(workload.ctd_name(i), namespace))
            if then is not None:
                await then(created)
            return created
        return await bounded_gather([lambda i=i: one(i) for i in range(n)], self.concurrency)

    def start_operator(self, module: str | None = None, **settings: str) -> OperatorProcess:
        module = module or self.operator_module
        if self.operator is not None:
            self.operator.stop()
        self.operator = OperatorProcess(self.cluster.kubeconfig, self.log_dir, module=module, **settings)
        self.operator.start()
        return self.operator

    # --- phase: baseline ---------------------------------------------------------------------

    async def baseline(self, n: int, clean_up: bool = True) -> dict[str, Any]:
        """``clean_up``: delete the namespace afterwards (pointless when the control plane is
        purged next: deleting 1,000 objects' namespace takes minutes)."""
        namespace = f"bench-base-{n}"
        await self.create_namespace(namespace)
        tracker = await NamespaceTracker(self.api, namespace).start()
        try:
            return await self._baseline(n, namespace, tracker)
        finally:
            await tracker.stop()
            if clean_up:
                seconds = await self.delete_namespace(namespace)
                log(f"namespace {namespace} deleted in {seconds:.0f}s")

    async def _baseline(self, n: int, namespace: str, tracker: NamespaceTracker) -> dict[str, Any]:
        settings = OperatorSettings(runtime_image="chattts-runtime:bench")
        names = [workload.ctd_name(i) for i in range(n)]
        before = await self.api_counts()
        retries_before = self.api.retries
        writes = 0

        async def write_children(created: dict[str, Any]) -> None:
            nonlocal writes
            for child in workload.baseline_children(created, settings):
                await self.api.apply(child, field_manager="chattts-operator")
                writes += 1

        t0 = time.monotonic()
        await self.create_ctds(namespace, n, then=write_children)
        t_written = time.monotonic() - t0
        done = await tracker.wait_for(lambda: tracker.all_children(names), self.remaining(300))
        t_children = (tracker.last_child_time(names) - t0) if done else None
        ready = await tracker.wait_for(lambda: len(tracker.deployment_ready) >= n, self.remaining(600))
        t_ready = (max(tracker.deployment_ready[x] for x in names) - t0) if ready else None
        window = apimetrics.delta(await self.api_counts(), before)
        result = {
            "n": n, "concurrency": self.concurrency, "child_writes": writes, "loadavg_1m": loadavg(),
            "seconds_writes_returned": round(t_written, 2),
            "seconds_children_exist": round(t_children, 2) if t_children else None,
            "seconds_deployments_ready": round(t_ready, 2) if t_ready else None,
            "apply_requests": sum(v for k, v in window.items() if k.verb == "APPLY"),
            "client_retries": self.api.retries - retries_before,
            "timed_out": not (done and ready),
        }
        log(f"baseline N={n}: {result}")
        return result

    # --- phase: the operator creates -------------------------------------------------------------

    async def operator_create(self, n: int, keep: bool, clean_up: bool = True) -> dict[str, Any]:
        """``keep``: leave the operator and its objects for the later phases; else stop it and,
        with ``clean_up``, delete the namespace."""
        namespace = f"bench-op-{n}"
        op = self.start_operator()
        await self.create_namespace(namespace)
        tracker = await NamespaceTracker(self.api, namespace).start()
        failed = True
        try:
            result = await self._operator_create(n, op, tracker)
            failed = False
            return result
        finally:
            await tracker.stop()
            if failed or not keep:
                op.stop()
                if clean_up:
                    seconds = await self.delete_namespace(namespace)
                    log(f"namespace {namespace} deleted in {seconds:.0f}s")

    async def _operator_create(self, n: int, op: OperatorProcess, tracker: NamespaceTracker) -> dict[str, Any]:
        namespace = tracker.namespace
        names = [workload.ctd_name(i) for i in range(n)]
        before = await self.api_counts()
        reconciles_before = op.metric_sum("chattts_operator_reconciles_total")
        own_before = own_requests(op)
        cpu_before = op.proc_sample().cpu_seconds
        profiler = self._start_profiler(op, f"create-{n}") if self.profile else None
        t0 = time.monotonic()
        await self.create_ctds(namespace, n)
        t_created = time.monotonic() - t0
        done = await tracker.wait_for(lambda: tracker.all_children(names) and len(tracker.status_written) >= n,
                                      self.remaining(600))
        t_done = time.monotonic() - t0
        t_children = (tracker.last_child_time(names) - t0) if tracker.all_children(names) else None
        t_status = (max(tracker.status_written.values()) - t0) if len(tracker.status_written) >= n else None
        ready = await tracker.wait_for(lambda: len(tracker.ctd_ready) >= n, self.remaining(600))
        t_ready = (max(tracker.ctd_ready[x] for x in names) - t0) if ready else None
        await asyncio.sleep(3)  # trailing reconciles of the last ready pods
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=60)
        window = apimetrics.delta(await self.api_counts(), before)
        attribution = apimetrics.attribute(window)
        reconciles = op.metric_sum("chattts_operator_reconciles_total") - reconciles_before
        own = apimetrics.own_window(own_requests(op), own_before)
        sample = op.proc_sample()
        result = {
            "n": n, "module": op.module, "loadavg_1m": loadavg(),
            # kopf's retries (before #19b's level-based handling) and the controller's own.
            "operator_temporary_failures": sum(op.log_text().count(s) for s in ("failed temporarily", "(retrying in")),
            "seconds_creates_returned": round(t_created, 2),
            "seconds_children_exist": round(t_children, 2) if t_children else None,
            "seconds_status_written": round(t_status, 2) if t_status else None,
            "seconds_children_and_status": round(max(t_children or 0, t_status or 0), 2) if done else None,
            "seconds_ready": round(t_ready, 2) if t_ready else None,
            "reconciles": int(reconciles),
            "operator_requests": attribution.total, "operator_reads": attribution.reads,
            "operator_writes": attribution.writes, "events_all_clients": attribution.events_all_clients,
            "requests_per_object": round(attribution.total / n, 2),
            "writes_per_object": round(attribution.writes / n, 2),
            "requests_per_reconcile": round(attribution.total / reconciles, 2) if reconciles else None,
            "by_request": attribution.by_key,
            # The operator's own count: what the attribution above guesses.
            "operator_counted_requests": own,
            "operator_counted_per_object": apimetrics.own_per_object(own, n),
            "operator_cpu_seconds": round(sample.cpu_seconds - cpu_before, 1),
            "operator_rss_mib": round(sample.rss_mib, 1), "operator_peak_rss_mib": round(sample.peak_rss_mib, 1),
            "timed_out": not (done and ready),
            "progress_at_end": tracker.snapshot(),
        }
        _ = t_done
        log(f"operator N={n}: {result}")
        return result

    def _start_profiler(self, op: OperatorProcess, label: str) -> subprocess.Popen | None:
        # py-spy next to this Python, else $PY_SPY (a venv of its own: the shared ones stay as they are)
        py_spy = Path(sys.executable).parent / "py-spy"
        if not py_spy.exists():
            py_spy = Path(os.environ.get("PY_SPY", "/nonexistent"))
        if not py_spy.exists():
            log("py-spy not installed: no profile")
            return None
        out = self.log_dir / f"profile-{label}.txt"
        return subprocess.Popen([str(py_spy), "record", "--pid", str(op.pid), "--rate", "50", "--nonblocking",
                                 "--format", "raw", "-o", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # --- phase: restart (resume storm), footprint --------------------------------------------------

    async def restart(self, managed: int, label: str, module: str | None = None,
                      **settings: str) -> dict[str, Any]:
        module = module or self.operator_module
        if self.operator is not None:
            self.operator.stop()
        before = await self.api_counts()
        t0 = time.monotonic()
        op = self.start_operator(module, **settings)
        t_healthy = time.monotonic() - t0
        timeout = self.remaining(300)
        resumed = 0.0
        while time.monotonic() - t0 < timeout:
            # Objects kopf had handled before come back as resumes; new ones as creates.
            resumed = (op.metric_sum("chattts_operator_reconciles_total", trigger="resume")
                       + op.metric_sum("chattts_operator_reconciles_total", trigger="create"))
            if resumed >= managed:
                break
            await asyncio.sleep(0.25)
        t_resumed = time.monotonic() - t0
        startup = op.proc_sample()
        await asyncio.sleep(2)
        window = apimetrics.delta(await self.api_counts(), before)
        attribution = apimetrics.attribute(window)
        # Idle: nothing changes; what does it cost to stay up?
        idle_seconds = 20.0
        idle_start = op.proc_sample()
        await asyncio.sleep(idle_seconds)
        idle_end = op.proc_sample()
        result = {
            "label": label, "module": module, "managed": managed, "loadavg_1m": loadavg(),
            "seconds_to_healthy": round(t_healthy, 2), "seconds_to_resume_all": round(t_resumed, 2),
            "resumed": int(resumed), "timed_out": resumed < managed,
            "startup_cpu_seconds": round(startup.cpu_seconds, 1),
            "startup_requests": attribution.total, "startup_writes": attribution.writes,
            "startup_by_request": attribution.by_key,
            "rss_mib": round(idle_end.rss_mib, 1), "peak_rss_mib": round(idle_end.peak_rss_mib, 1),
            "idle_cpu_percent": round(100 * (idle_end.cpu_seconds - idle_start.cpu_seconds) / idle_seconds, 2),
        }
        log(f"restart ({label}): {result}")
        return result

    # --- phase: no-op resync ------------------------------------------------------------------------

    async def noop_resync(self, managed: int, interval: float) -> dict[str, Any]:
        op = self.operator
        assert op is not None

        async def next_pass_end(after: float, timeout: float) -> float | None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                value = op.metric_sum("chattts_operator_resync_last_success_timestamp_seconds")
                if value > after:
                    return value
                await asyncio.sleep(0.25)
            return None

        first = await next_pass_end(op.metric_sum("chattts_operator_resync_last_success_timestamp_seconds"),
                                    self.remaining(interval * 3 + 120))
        if first is None:
            return {"timed_out": True}
        before = await self.api_counts()
        writes_before = op.metric_sum("chattts_operator_child_writes_total") + op.metric_sum(
            "chattts_operator_status_writes_total")
        resyncs_before = op.metric_sum("chattts_operator_reconciles_total", trigger="resync")
        cpu_before = op.proc_sample().cpu_seconds
        second = await next_pass_end(first, self.remaining(interval * 3 + 120))
        if second is None:
            return {"timed_out": True}
        window = apimetrics.delta(await self.api_counts(), before)
        attribution = apimetrics.attribute(window)
        passes = op.metric_sum("chattts_operator_reconciles_total", trigger="resync") - resyncs_before
        result = {
            "managed": managed, "interval_seconds": interval, "loadavg_1m": loadavg(),
            "pass_seconds": round(second - first - interval, 2),
            "resync_reconciles": int(passes),
            "results": {r: int(op.metric_sum("chattts_operator_reconciles_total", trigger="resync", result=r))
                        for r in ("noop", "applied", "blocked", "error")},
            "operator_writes_counted_by_apiserver": attribution.writes,
            "operator_writes_counted_by_operator": int(op.metric_sum("chattts_operator_child_writes_total")
                                                       + op.metric_sum("chattts_operator_status_writes_total")
                                                       - writes_before),
            "operator_reads": attribution.reads,
            "reads_per_object": round(attribution.reads / managed, 2),
            "by_request": attribution.by_key,
            "cpu_seconds": round(op.proc_sample().cpu_seconds - cpu_before, 1),
            "timed_out": False,
        }
        log(f"no-op resync: {result}")
        return result

    # --- phase: reaction time ---------------------------------------------------------------------------

    async def reaction(self, namespace: str, managed: int, samples: int, rate: float,
                       label: str = "") -> dict[str, Any]:
        tracker = await NamespaceTracker(self.api, namespace).start()
        # Each reaction phase patches values no earlier phase wrote: a value equal to the live one is
        # no change at all (no new generation, nothing to wait for).
        first_value = 100 + 50 * self._reaction_phases
        self._reaction_phases += 1
        names = [workload.ctd_name(i) for i in range(managed)]
        stride = max(1, managed // samples)
        chosen = [names[(i * stride) % managed] for i in range(samples)]
        latencies: list[float] = []
        # Each change's end-to-end time cut where this process can see it: the PATCH's answer, the
        # watch event of the new generation (the change visible to every watcher, the operator's
        # too), and its Deployment's new template.
        segments: list[dict[str, float]] = []
        missed = 0
        # The observer's own pauses delay what it timestamps: its heap (the trackers' thousands of
        # objects) is frozen for the phase, as the operator's is (core/heap.py), and measured.
        gc.collect()
        gc.freeze()
        bench_gc = GcPauses().install()
        before = await self.api_counts()
        inside_before = self._spec_change_histogram()
        seconds_before = apimetrics.parse_request_seconds(await self.api.text("/metrics"))
        cpu_before = self.operator.proc_sample().cpu_seconds
        profiler = self._start_profiler(self.operator, "-".join(filter(None, ("reaction", label)))) if self.profile else None

        async def change(i: int, name: str) -> None:
            nonlocal missed
            future = tracker.expect_hash_change(name)
            visible = tracker.expect_generation_change(name)
            sent = time.monotonic()
            await self.api.merge_patch("ChatTTSDeployment", namespace, name,
                                       {"spec": {"engine": {"maxNumSeqs": first_value + i % 50}}})
            answered = time.monotonic()
            try:
                seen = await asyncio.wait_for(future, timeout=60)
                latencies.append(seen - sent)
                at = visible.result() if visible.done() else seen
                segments.append({"name": name, "total": seen - sent, "patch_answered": answered - sent,
                                 "visible": at - sent, "visible_to_deployment": seen - at})
            except asyncio.TimeoutError:
                missed += 1

        tasks = []
        t0 = time.monotonic()
        for i, name in enumerate(chosen):
            if time.monotonic() > self.deadline:
                break
            tasks.append(asyncio.create_task(change(i, name)))
            await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
        await asyncio.gather(*tasks)
        bench_gc.uninstall()
        gc.unfreeze()
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=60)
        window = apimetrics.delta(await self.api_counts(), before)
        attribution = apimetrics.attribute(window, bench_patches=len(tasks))
        inside = {k: v - inside_before.get(k, 0) for k, v in self._spec_change_histogram().items()}
        api_ms = apimetrics.mean_ms_between(
            apimetrics.parse_request_seconds(await self.api.text("/metrics")), seconds_before,
            ("APPLY configmaps", "APPLY deployments", "PATCH chattsdeployments", "PATCH chattsdeployments/status"))
        await tracker.stop()
        result = {
            "managed": managed, "changes": len(tasks), "rate_per_second": rate, "missed": missed,
            "loadavg_1m": loadavg(),
            "p50_ms": round(1000 * percentile(latencies, 50), 1) if latencies else None,
            "p90_ms": round(1000 * percentile(latencies, 90), 1) if latencies else None,
            "p99_ms": round(1000 * percentile(latencies, 99), 1) if latencies else None,
            "max_ms": round(1000 * max(latencies), 1) if latencies else None,
            "mean_ms": round(1000 * statistics.fmean(latencies), 1) if latencies else None,
            # Inside the operator: its watch event of the change to its Deployment applied.
            "operator_event_to_apply_mean_ms": round(1000 * inside["sum"] / inside["count"], 1)
            if inside.get("count") else None,
            "operator_event_to_apply_within": {le: round(n / inside["count"], 3) for le, n in inside.items()
                                               if le.startswith("<=") and inside.get("count")},
            "operator_update_reconcile_mean_ms": round(1000 * inside["reconcile_sum"] / inside["reconcile_count"], 1)
            if inside.get("reconcile_count") else None,
            # The same span by stage: event -> reconcile start, -> desired state built, -> applied.
            "operator_stage_mean_ms": {stage: round(1000 * inside[f"stage_{stage}_sum"] / inside[f"stage_{stage}_count"], 1)
                                       for stage in ("queued", "built", "applied") if inside.get(f"stage_{stage}_count")},
            # How late the operator's event loop ran a ready timer (its queueing), over the phase.
            "operator_loop_lag_mean_ms": round(1000 * inside["loop_lag_sum"] / inside["loop_lag_count"], 2)
            if inside.get("loop_lag_count") else None,
            "operator_loop_lag_within": {k.removeprefix("loop_lag "): round(v / inside["loop_lag_count"], 3)
                                         for k, v in inside.items() if k.startswith("loop_lag <=")
                                         and inside.get("loop_lag_count")},
            # The operator's garbage collector: full collections (generation 2) and their pauses.
            "operator_gc_full": full_collections(inside),
            "bench_gc_pauses": bench_gc.summary(),
            "segments_ms": segment_summary(segments),
            "operator_cpu_seconds": round(self.operator.proc_sample().cpu_seconds - cpu_before, 1),
            "apiserver_mean_ms": api_ms,  # the API server's own time per request, by kind
            "operator_requests_per_change": round(attribution.total / max(1, len(tasks)), 2),
            "operator_writes_per_change": round(attribution.writes / max(1, len(tasks)), 2),
            "by_request": attribution.by_key,
        }
        log(f"reaction: {result}")
        return result

    def _spec_change_histogram(self) -> dict[str, float]:
        """The operator's chattts_operator_spec_change_seconds: buckets by upper bound, sum, count."""
        out: dict[str, float] = {}
        if self.operator is None:
            return out
        for (name, labels), value in self.operator.metrics().items():
            if name == "chattts_operator_spec_change_seconds_bucket" and dict(labels)["le"] in ("0.25", "0.5", "1.0"):
                out[f"<= {dict(labels)['le']} s"] = value
            elif name in ("chattts_operator_spec_change_seconds_sum", "chattts_operator_spec_change_seconds_count"):
                out[name.rsplit("_", 1)[1]] = value
            elif name.startswith("chattts_operator_reconcile_duration_seconds_") and dict(labels).get("trigger") == "update" \
                    and name.rsplit("_", 1)[1] in ("sum", "count"):
                out["reconcile_" + name.rsplit("_", 1)[1]] = value
            elif name.startswith("chattts_operator_spec_change_stage_seconds_") and name.rsplit("_", 1)[1] in ("sum", "count"):
                out[f"stage_{dict(labels)['stage']}_{name.rsplit('_', 1)[1]}"] = value
            elif name.startswith("chattts_operator_gc_pause_seconds_") and dict(labels).get("generation") == "2":
                suffix = name.rsplit("_", 1)[1]
                if suffix in ("sum", "count"):
                    out[f"gc2_{suffix}"] = value
                elif suffix == "bucket" and dict(labels)["le"] in ("0.05", "0.1", "0.25"):
                    out[f"gc2 <= {dict(labels)['le']} s"] = value
            elif name.startswith("chattts_operator_event_loop_lag_seconds_"):
                suffix = name.rsplit("_", 1)[1]
                if suffix in ("sum", "count"):
                    out[f"loop_lag_{suffix}"] = value
                elif suffix == "bucket" and dict(labels)["le"] in ("0.01", "0.05", "0.1", "0.25"):
                    out[f"loop_lag <= {dict(labels)['le']} s"] = value
        return out

    # --- phase: unrelated objects ---------------------------------------------------------------------

    async def create_unrelated(self, count: int, namespaces: int = 10) -> dict[str, Any]:
        op = self.operator
        assert op is not None
        names = [f"bench-unrelated-{k}" for k in range(namespaces)]
        for name in names:
            if await self.api.get("Namespace", None, name) is None:
                await self.create_namespace(name)
        before = op.proc_sample()
        t0 = time.monotonic()
        jobs = []
        for i in range(count):
            ns = names[i % namespaces]
            jobs.append(lambda i=i, ns=ns: self._create_ignoring_conflict(workload.unrelated_deployment(i, ns)))
            jobs.append(lambda i=i, ns=ns: self._create_ignoring_conflict(workload.unrelated_pod(i, ns)))
        await bounded_gather(jobs, self.concurrency)
        seconds = time.monotonic() - t0
        await asyncio.sleep(20)  # the controller-manager makes their ReplicaSets; watches settle
        after = op.proc_sample()
        result = {
            "deployments": count, "pods": count, "seconds_to_create": round(seconds, 1),
            "operator_rss_mib_before": round(before.rss_mib, 1), "operator_rss_mib_after": round(after.rss_mib, 1),
            "operator_cpu_seconds_meanwhile": round(after.cpu_seconds - before.cpu_seconds, 1),
            "operator_peak_rss_mib": round(after.peak_rss_mib, 1),
        }
        log(f"unrelated objects: {result}")
        return result

    async def _create_ignoring_conflict(self, manifest: dict[str, Any]) -> None:
        try:
            await self.api.create(manifest)
        except ApiError as err:
            if err.status != 409:
                raise


def own_requests(op: OperatorProcess) -> dict[str, float]:
    """The operator's requests so far by "METHOD resource", from its own counter."""
    out: dict[str, float] = {}
    for (name, labels), value in op.metrics().items():
        if name == "chattts_operator_api_requests_total":
            label = dict(labels)
            out[f"{label.get('method')} {label.get('resource')}"] = value
    return out


def install_crds(cluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=chattts-bench", "-f", str(CRD_DIR))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/chattsdeployments.tts.chattts.io")
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", "ctd", "-A", check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the ctd resource never became servable")
        time.sleep(0.3)


def versions(cluster) -> dict[str, str]:
    import kopf  # noqa: PLC0415
    import kubernetes_asyncio  # noqa: PLC0415

    server = json.loads(cluster.kubectl("version", "-o", "json").stdout).get("serverVersion", {})
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {"kubernetes": server.get("gitVersion", "?"), "kopf": kopf.__version__ if hasattr(kopf, "__version__")
            else _dist_version("kopf"), "kubernetes_asyncio": kubernetes_asyncio.__version__,
            "python": sys.version.split()[0], "commit": git.stdout.strip()}


def _dist_version(name: str) -> str:
    from importlib.metadata import version  # noqa: PLC0415
    return version(name)
