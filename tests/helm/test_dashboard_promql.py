"""Every PromQL expression of the chart's Grafana dashboard, checked by promtool (Prometheus's
own parser and engine, Debian's prometheus package; `.ci/run` installs it):

1. ``promtool check rules`` parses each expression (as a recording rule);
2. ``promtool test rules`` evaluates each over series built from what the exporters
   really register (the operator's registry and the runtime's, every metric with its own
   label names, plus the labels Prometheus's scrape adds), and each must return data: a
   metric or label name the exporters do not have, or a join on a label they lack,
   returns nothing and fails.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import CHART

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")

# Grafana's variables, as a Prometheus would see them with "All" selected.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$namespace": ".*", "$deployment": ".*"}
# Labels Prometheus's scrape adds: the PodMonitor relabels the ChatTTSDeployment name into
# chattts_deployment; both targets get namespace, pod and job.
TARGET_LABELS = {"namespace": "tts", "pod": "tts-0", "job": "chattts"}
SERVING_LABELS = {**TARGET_LABELS, "chattts_deployment": "tts"}


def dashboard_expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable, variables substituted."""
    dashboard = json.loads((CHART / "files" / "dashboards" / "chattts.json").read_text())
    found = [(f"panel {p['title']!r} {t['refId']}", t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            # label_values(<selector>, <label>) is Grafana's: Prometheus evaluates the selector.
            inner = re.fullmatch(r"label_values\((.*),\s*[a-zA-Z_]\w*\)", query["query"])
            found.append((f"variable {variable['name']!r}", inner.group(1) if inner else query["query"]))
    out = []
    for where, expr in found:
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        out.append((where, expr))
    return out


def exported_series() -> list[dict]:
    """promtool input series: one per series name each registry exports, with every label
    name the metric declares (prometheus-client keeps them on the collector)."""
    from chattts_operator.core.metrics import REGISTRY as OPERATOR_REGISTRY
    from chattts_runtime.metrics import RuntimeMetrics

    series = [{"series": _selector("up", SERVING_LABELS), "values": "1+0x40"}]
    for registry, extra in ((OPERATOR_REGISTRY, TARGET_LABELS), (RuntimeMetrics().registry, SERVING_LABELS)):
        for collector in list(registry._collector_to_names):  # noqa: SLF001 - label names of childless metrics
            kind = getattr(collector, "_type", None)
            if kind is None:
                continue
            labels = {**extra, **{name: _label_value(name) for name in collector._labelnames}}  # noqa: SLF001
            name = collector._name  # noqa: SLF001
            if kind == "counter":
                series.append({"series": _selector(name + "_total", labels), "values": "0+10x40"})
            elif kind == "histogram":
                for bound in ("0.005", "0.1", "1", "+Inf"):
                    series.append({"series": _selector(name + "_bucket", {**labels, "le": bound}), "values": "0+10x40"})
                for suffix in ("_count", "_sum"):
                    series.append({"series": _selector(name + suffix, labels), "values": "0+10x40"})
            else:
                series.append({"series": _selector(name, labels), "values": "1+0x40"})
    return series


def _label_value(label: str) -> str:
    return {"window": "day", "class": "online", "state": "Suspended"}.get(label, "x")


def _selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_promtool_parses_every_dashboard_expression(tmp_path: Path):
    expressions = dashboard_expressions()
    assert len(expressions) > 20
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expression_{i}", "expr": expr} for i, (_, expr) in enumerate(expressions)]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dashboard_expression_returns_data_from_the_exported_series(tmp_path: Path):
    expressions = dashboard_expressions()
    (tmp_path / "empty-rules.yaml").write_text("groups: []\n")
    tests = {
        "rule_files": ["empty-rules.yaml"],
        "evaluation_interval": "30s",
        "tests": [{
            "interval": "30s",
            "input_series": exported_series(),
            # absent(x) is empty exactly when x returns data.
            "promql_expr_test": [{"expr": f"absent({expr})", "eval_time": "15m", "exp_samples": []}
                                 for _, expr in expressions],
        }],
    }
    path = tmp_path / "dashboard-test.yaml"
    path.write_text(yaml.safe_dump(tests, width=10_000))
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        empty = [where for where, expr in expressions if f"absent({expr})" in result.stdout + result.stderr]
        pytest.fail(f"dashboard queries with no data from the exporters: {empty or '?'}\n{result.stdout}{result.stderr}")


def test_the_check_catches_a_metric_the_exporters_lack(tmp_path: Path):
    """The evaluation test above can fail: a misspelt name returns nothing."""
    (tmp_path / "empty-rules.yaml").write_text("groups: []\n")
    tests = {"rule_files": ["empty-rules.yaml"], "evaluation_interval": "30s", "tests": [{
        "interval": "30s", "input_series": exported_series(),
        "promql_expr_test": [{"expr": "absent(sum(chattts_autoscaler_desired_replica))", "eval_time": "15m",
                              "exp_samples": []}]}]}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(tests, width=10_000))
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_serving_series_carry_the_label_the_podmonitor_adds():
    # The serving panels group by chattts_deployment: the PodMonitor must add it.
    podmonitor = (CHART / "templates" / "podmonitor.yaml").read_text()
    assert "targetLabel: chattts_deployment" in podmonitor
