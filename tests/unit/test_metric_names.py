"""Every metric the chart's dashboard, the autoscaler's default PromQL and its scrape read is one that a
registry declares: the runtime's (its names in ``chattts_runtime.metric_names``, registered by
``RuntimeMetrics``) or the operator's (``core.metrics``). A renamed metric fails here, not on a blank panel."""
from __future__ import annotations

import json
import re
from pathlib import Path

from chattts_runtime import metric_names
from chattts_runtime.metrics import RuntimeMetrics

from chattts_operator.api.autoscaling import DEFAULT_PROMETHEUS_QUERY
from chattts_operator.autoscaling import signals
from chattts_operator.core import metrics as operator_metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "deploy/helm/chattts-operator/files/dashboards"
SERIES_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")
PROMQL_WORDS = {"by", "sum", "rate", "max", "min", "count", "histogram_quantile", "le", "without", "on", "avg",
                "increase", "irate", "clamp_min", "clamp_max", "label_replace", "topk", "bottomk", "offset"}
# vLLM's own gauges, read where a pod runs vLLM's OpenAI server instead of ours (signals' fallbacks).
VLLM_NAMES = {"vllm:num_requests_running", "vllm:num_requests_waiting"}


def declared() -> set[str]:
    names = set()
    for registry in (RuntimeMetrics().registry, operator_metrics.REGISTRY):
        for family in registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
    return names


def series_names(promql: str) -> set[str]:
    promql = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]', " ", promql)  # strings, selectors, ranges
    promql = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", promql)  # label lists
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", promql))
    return {w for w in words if ("_" in w or ":" in w) and w not in PROMQL_WORDS and not w.startswith("$")}


def expressions(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def base(series: str) -> str:
    for suffix in SERIES_SUFFIXES:
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def test_the_runtime_registers_every_name_it_declares():
    registered = {family.name for family in RuntimeMetrics().registry.collect()}
    names = {value for key, value in vars(metric_names).items() if key.isupper()}
    assert names == registered


def test_dashboards_and_queries_read_only_declared_metrics():
    known = declared()
    exprs = [DEFAULT_PROMETHEUS_QUERY]
    for path in sorted(DASHBOARDS.glob("*.json")):
        exprs += list(expressions(json.loads(path.read_text())))
    assert len(exprs) > 10  # the dashboard's panels were found
    unknown = {s for e in exprs for s in series_names(e) if s not in known and base(s) not in known}
    assert not unknown, f"metrics no registry declares: {sorted(unknown)}"


def test_the_autoscalers_scrape_reads_declared_metrics():
    known = declared() | VLLM_NAMES
    wanted = {signals.WAIT_HISTOGRAM, signals.FRAMES_SUM, *signals.RUNNING_GAUGES, *signals.WAITING_GAUGES}
    assert {w for w in wanted if w not in known and base(w) not in known} == set()
    assert signals.WAIT_HISTOGRAM == metric_names.SCHEDULER_DEADLINE_WAIT
