"""Turn the benchmark's results into the printed table and the markdown file (pure)."""
from __future__ import annotations

from typing import Any


def ratio(a: float | None, b: float | None) -> float | None:
    if not a or not b:
        return None
    return round(a / b, 2)


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.2f}{unit}"
    return f"{value}{unit}"


def rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, goal) rows."""
    out: list[tuple[str, str, str]] = []
    for size in results.get("sizes", []):
        base = results.get(f"baseline_{size}") or {}
        op = results.get(f"operator_{size}") or {}
        out.append((f"N={size}: bare writes, children exist (s)", _fmt(base.get("seconds_children_exist")), ""))
        out.append((f"N={size}: operator, children + status written (s)", _fmt(op.get("seconds_children_and_status")), ""))
        summary = results.get(f"create_summary_{size}")
        out.append((f"N={size}: ratio operator / bare writes" + (" (the last pair)" if summary else ""),
                    _fmt(ratio(op.get("seconds_children_and_status"), base.get("seconds_children_exist")), "x"),
                    "" if summary else "<= 1.2x"))
        if summary:
            each = ", ".join(f"{_fmt(p.get('ratio'), 'x')} ({p['order']})" for p in results.get(f"create_pairs_{size}") or [])
            out.append((f"N={size}: ratio, median of {summary['pairs']} alternating pairs, each side on a fresh "
                        "control plane", f"{_fmt(summary.get('median_ratio'), 'x')} (pairs: {each}); all Ready: "
                        f"median {_fmt(summary.get('median_ready_ratio'), 'x')}", "<= 1.2x"))
        out.append((f"N={size}: all Ready, operator / bare (s)",
                    f"{_fmt(op.get('seconds_ready'))} / {_fmt(base.get('seconds_deployments_ready'))} = "
                    f"{_fmt(ratio(op.get('seconds_ready'), base.get('seconds_deployments_ready')), 'x')}", ""))
        out.append((f"N={size}: operator requests / writes per object",
                    f"{_fmt(op.get('requests_per_object'))} / {_fmt(op.get('writes_per_object'))}", ""))
        own = op.get("operator_counted_per_object") or {}
        if own:
            # The API server's counter has no client label: its GETs of ChatTTSDeployments are not the operator's.
            out.append((f"N={size}: the operator's own count per object: requests / writes (status patches, Events)",
                        f"{_fmt(own.get('requests'))} / {_fmt(own.get('writes'))} ({_fmt(own.get('status_patches'))}, "
                        f"{_fmt(own.get('events'))})", ""))
        out.append((f"N={size}: operator requests per reconcile", _fmt(op.get("requests_per_reconcile")), ""))
        out.append((f"N={size}: operator handler failures retried (API 5xx/timeouts)",
                    _fmt(op.get("operator_temporary_failures")), "0"))
    noop = results.get("noop_resync") or {}
    out.append(("no-op resync: writes (API server / operator counters)",
                f"{_fmt(noop.get('operator_writes_counted_by_apiserver'))} / "
                f"{_fmt(noop.get('operator_writes_counted_by_operator'))}", "0"))
    out.append(("no-op resync: reads per object, pass duration (s)",
                f"{_fmt(noop.get('reads_per_object'))}, {_fmt(noop.get('pass_seconds'))}", ""))
    for key, what in (("reaction", ""), ("reaction_compare", f" ({(results.get('restart_compare') or {}).get('label')})")):
        reaction = results.get(key) or {}
        if key == "reaction" or "p50_ms" in reaction:
            out.append((f"spec change -> Deployment updated, p50 / p99 (ms), {reaction.get('managed', '?')} managed{what}",
                        f"{_fmt(reaction.get('p50_ms'))} / {_fmt(reaction.get('p99_ms'))}", "p99 <= 1000"))
            out.append((f"inside the operator: queued / built / applied, mean (ms); loop lag mean (ms){what}",
                        " / ".join(_fmt(v) for v in (reaction.get("operator_stage_mean_ms") or {}).values())
                        + f"; {_fmt(reaction.get('operator_loop_lag_mean_ms'))}", ""))
            gc_full = reaction.get("operator_gc_full") or {}
            if gc_full:
                out.append((f"operator's full garbage collections meanwhile: count, over 0.1 s, total (ms){what}",
                            f"{gc_full.get('count')}, {gc_full.get('over 0.1 s', 'n/a')}, {_fmt(gc_full.get('total_ms'))}",
                            ""))
            visible = (reaction.get("segments_ms") or {}).get("visible_to_deployment") or {}
            if visible:
                out.append((f"change visible to watchers -> Deployment updated, p50 / p99 (ms){what}",
                            f"{_fmt(visible.get('p50'))} / {_fmt(visible.get('p99'))}", ""))
    for key in ("restart_none", "restart_compare", "restart_short_resync", "restart_unrelated"):
        r = results.get(key) or {}
        if "label" not in r:
            continue
        out.append((f"restart ({r['label']}): resume all {r['managed']} (s), requests, writes",
                    f"{_fmt(r.get('seconds_to_resume_all'))}, {r.get('startup_requests')}, {r.get('startup_writes')}",
                    "writes 0"))
        out.append((f"restart ({r['label']}): RSS / peak (MiB), idle CPU %",
                    f"{_fmt(r.get('rss_mib'))} / {_fmt(r.get('peak_rss_mib'))}, {_fmt(r.get('idle_cpu_percent'))}",
                    "flat"))
    unrelated = results.get("unrelated") or {}
    if "deployments" in unrelated:
        out.append((f"while {unrelated['deployments']} Deployments + Pods are created: operator RSS before -> after "
                    "(MiB), CPU s",
                    f"{_fmt(unrelated.get('operator_rss_mib_before'))} -> {_fmt(unrelated.get('operator_rss_mib_after'))}"
                    f", {_fmt(unrelated.get('operator_cpu_seconds_meanwhile'))}", "flat"))
    return out


def table(results: dict[str, Any]) -> str:
    data = rows(results)
    width = max(len(r[0]) for r in data)
    vwidth = max(len(r[1]) for r in data)
    lines = [f"{'figure':<{width}}  {'value':<{vwidth}}  goal", "-" * (width + vwidth + 10)]
    lines += [f"{a:<{width}}  {b:<{vwidth}}  {c}" for a, b, c in data]
    return "\n".join(lines)


def markdown(results: dict[str, Any], raw_name: str = "operator-scale-results.json") -> str:
    meta = results.get("meta", {})
    module = (meta.get("settings") or {}).get("operator_module", "chattts_operator")
    lines = [
        "# Operator at scale: benchmark results",
        "",
        f"Run `{meta.get('command', 'python -m bench.operator_scale')}` on {meta.get('date', '?')}; "
        f"machine: {meta.get('machine', '?')}; versions: "
        + ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items()) + ".",
        "",
        "Everything runs on this one machine: etcd, kube-apiserver, controller-manager, scheduler, kwok "
        "(8 simulated H200 nodes), the operator (a subprocess, cluster-wide, as the chart runs it) and the "
        "benchmark client, so absolute times include their contention for the cores; the ratios compare "
        "runs on the same API server minutes apart.",
        "",
        f"Operator run as `python -m {module}`.",
        "",
        "| figure | value | goal |",
        "|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows(results)]
    lines += ["", "Definitions:", "",
              "- *bare writes*: a plain asyncio script with the same client concurrency creates each "
              "ChatTTSDeployment and server-side applies the four children the operator's own builders "
              "produce for it (no operator running). *children exist*: the last child seen by a watch.",
              "- *operator*: the same objects are created with the operator running; done when a watch has "
              "seen every child and every status with `observedGeneration` of the object's generation.",
              "- *alternating pairs* (`--create-pairs`, the largest size): bare writes and operator in turn, "
              "the order reversed every pair, each side on a freshly purged control plane; the ratio is "
              "the median of the pairs' (bench/operator_scale/pairs.py).",
              "- *Ready*: every Deployment (baseline) or ChatTTSDeployment status (operator) reports its "
              "replica ready (kwok marks pods Ready once the scheduler bound them).",
              "- Requests are counted by the API server (`apiserver_request_total`, before/after) and "
              "attributed to the operator by verb/resource (bench/operator_scale/apimetrics.py); WATCH "
              "requests are left out.",
              "", f"Raw figures: `{raw_name}`."]
    return "\n".join(lines) + "\n"
