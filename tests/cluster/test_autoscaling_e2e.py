"""Autoscaling end to end: real runtime processes, the real metric, the real control plane.

The serving pods are kwok pods (no containers run), so each pod is mapped to a real
``chattts-runtime serve`` process on loopback (tiny random checkpoint, reference engine,
CPU): the test annotates every pod with its process's metrics URL
(``tts.chattts.io/metrics-url``, honoured because the operator runs with
``CHATTTS_AUTOSCALER_METRICS_URL_ANNOTATION=1``), and its load generator sends speech
requests only to processes whose pods are Ready, as a Service would. The operator
(subprocess, as in its container) scrapes those processes' /metrics, scales the
ChatTTSDeployment up under load through the scale subresource and back down after it,
and records its decisions in status. The load is bounded in time and request count.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from chattts_operator.api.autoscaling import parse_duration
from bench.operator_scale.operatorproc import OperatorProcess
from tests.cluster.helpers import INSTANCE, OPERATOR_SETTINGS, apply, get, runtime_yaml
from tests.support import ctd, free_port, install_crds, wait_until

pytest.importorskip("torch", reason="the runtime processes need torch (runtime extra)")
httpx = pytest.importorskip("httpx")
yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
METRICS_URL_ANNOTATION = "tts.chattts.io/metrics-url"
PROCESSES = 3  # = maxReplicas
SLOTS = 2  # engine.maxNumSeqs on both sides: the runtime runs 2 requests at once
CLIENTS = 6  # concurrent load: three times one replica's slots
LOAD_SECONDS = 75
MAX_REQUESTS = 3000


@pytest.fixture(scope="module")
def runtime_processes(tmp_path_factory):
    """PROCESSES runtime servers on loopback; yields their base URLs; killed (by pid) after."""
    from chattts_runtime.testing import make_tiny_checkpoint

    base = tmp_path_factory.mktemp("autoscale-runtime")
    # "endless": no end code, so every request generates exactly max_new_frames frames.
    checkpoint = make_tiny_checkpoint(base / "tiny", endless=True, seed=3)
    procs, urls = [], []
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATTTS_")}
    env["OMP_NUM_THREADS"] = "1"
    try:
        for i in range(PROCESSES):
            port = free_port()
            config = {
                "model": {"path": str(checkpoint)},
                "engine_kind": "reference",
                "device": "cpu",
                "engine": {"max_num_seqs": SLOTS},
                "server": {"host": "127.0.0.1", "port": port, "shutdown_grace_seconds": 5},
                "generation": {"temperature": 0, "max_new_frames": 32, "refine_text": False},
            }
            cfg = base / f"runtime-{i}.yaml"
            cfg.write_text(yaml.safe_dump(config))
            log = (base / f"runtime-{i}.log").open("w")
            procs.append(subprocess.Popen([sys.executable, "-m", "chattts_runtime", "serve", "--config", str(cfg)],
                                          stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(procs, urls):
            wait_until(lambda: _ready(proc, url), f"runtime {url} ready", timeout=180)
        yield urls
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)


def _ready(proc: subprocess.Popen, url: str) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"runtime {url} exited with {proc.returncode}")
    try:
        with urllib.request.urlopen(url + "/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


class PodMapper(threading.Thread):
    """Gives every live pod of the ChatTTSDeployment a runtime process (an annotation) and
    tells the load generator which processes currently stand for Ready pods."""

    def __init__(self, kubectl, namespace: str, name: str, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.kubectl, self.namespace, self.name, self.urls = kubectl, namespace, name, urls
        self.assigned: dict[str, str] = {}  # pod -> process URL
        self.ready_urls: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.sync()
                self.stop.wait(0.5)
        except BaseException as err:  # surfaced by the test
            self.error = err

    def sync(self) -> None:
        pods = get(self.kubectl, self.namespace, "pods", "-l", f"{INSTANCE}={self.name}")["items"]
        live = {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}
        for gone in set(self.assigned) - set(live):
            del self.assigned[gone]
        ready = []
        for pod_name, pod in sorted(live.items(), key=lambda kv: kv[1]["metadata"]["creationTimestamp"]):
            if pod_name not in self.assigned:
                free = [u for u in self.urls if u not in self.assigned.values()]
                if not free:
                    continue  # more pods than processes: cannot happen below maxReplicas
                self.assigned[pod_name] = free[0]
                self.kubectl("annotate", "pod", pod_name, "-n", self.namespace, "--overwrite",
                             f"{METRICS_URL_ANNOTATION}={free[0]}/metrics")
            conditions = pod.get("status", {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                ready.append(self.assigned[pod_name])
        self.ready_urls = ready


class Load(threading.Thread):
    """CLIENTS closed-loop clients sending speech requests to Ready pods' processes."""

    def __init__(self, mapper: PodMapper) -> None:
        super().__init__(daemon=True)
        self.mapper = mapper
        self.stop = threading.Event()
        self.sent = 0
        self.failed = 0
        self._lock = threading.Lock()

    def run(self) -> None:
        deadline = time.monotonic() + LOAD_SECONDS
        workers = [threading.Thread(target=self._client, args=(deadline, i), daemon=True) for i in range(CLIENTS)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    def _client(self, deadline: float, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set() and time.monotonic() < deadline:
                with self._lock:
                    if self.sent >= MAX_REQUESTS:
                        return
                    self.sent += 1
                urls = self.mapper.ready_urls
                if not urls:
                    time.sleep(0.2)
                    continue
                try:
                    resp = client.post(rng.choice(urls) + "/v1/audio/speech",
                                       json={"model": "chattts", "voice": "alloy", "input": "hello world",
                                             "response_format": "pcm"})
                    if resp.status_code != 200:
                        self.failed += 1
                except httpx.HTTPError:
                    self.failed += 1


def autoscaling_status(kubectl, namespace: str, name: str) -> dict:
    return (get(kubectl, namespace, "ctd", name).get("status") or {}).get("autoscaling") or {}


def test_scales_up_under_load_and_back_down_after_it(cluster, namespace, runtime_processes, tmp_path):
    kubectl = cluster.kubectl
    install_crds(cluster)
    op = OperatorProcess(cluster.kubeconfig, tmp_path, namespaces=(namespace,), **OPERATOR_SETTINGS)
    op.env["CHATTTS_AUTOSCALER_METRICS_URL_ANNOTATION"] = "1"
    op.env["CHATTTS_AUTOSCALER_INTERVAL_SECONDS"] = "2"
    op.start()
    mapper = load = None
    try:
        apply(kubectl, namespace, ctd(
            "voice", replicas=1, engine={"maxNumSeqs": SLOTS},
            autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": PROCESSES,
                         "targetSchedulerDeadlineWait": "5ms", "window": "10s", "staleness": "30s",
                         "behavior": {"scaleDown": {"stabilizationWindowSeconds": 15}}}))
        mapper = PodMapper(kubectl, namespace, "voice", runtime_processes)
        mapper.start()
        wait_until(lambda: mapper.ready_urls, "the first pod Ready and mapped", timeout=120)

        # Idle: the autoscaler runs (a metric is read) and keeps one replica.
        idle = wait_until(lambda: (s := autoscaling_status(kubectl, namespace, "voice")).get("conditions") and s,
                          "the autoscaler's first status", timeout=60)
        assert get(kubectl, namespace, "ctd", "voice")["spec"]["replicas"] == 1, idle

        # Under load the wait rises above 5 ms and the operator scales up.
        load = Load(mapper)
        load.start()
        wait_until(lambda: (o := get(kubectl, namespace, "ctd", "voice"))["spec"]["replicas"] > 1 and o,
                               "a scale-up under load", timeout=LOAD_SECONDS)
        wait_until(lambda: len(mapper.ready_urls) > 1, "new pods Ready and serving", timeout=60)
        load.stop.set()
        load.join(timeout=90)
        assert load.sent > 0 and load.failed < load.sent / 10, (load.sent, load.failed)

        # The scale subresource is written before the decision lands in status: read status
        # once it has caught up, rather than from the object that first showed the new size.
        status = wait_until(
            lambda: (s := autoscaling_status(kubectl, namespace, "voice")).get("decisions")
            and any(d["reason"] == "ScaleUp" for d in s["decisions"]) and s,
            "the scale-up recorded in status", timeout=30)
        up = [d for d in status["decisions"] if d["reason"] == "ScaleUp"]
        assert up[0]["currentReplicas"] == 1 and up[0]["desiredReplicas"] > 1
        assert parse_duration(up[0]["metricValue"]) > 0.005, up[0]
        # spec.replicas was written through the scale subresource by the autoscaler's field manager.
        managers = {(m["manager"], m.get("subresource")) for m in
                    json.loads(kubectl("get", "ctd", "voice", "-n", namespace, "--show-managed-fields",
                                       "-o", "json").stdout)["metadata"]["managedFields"]}
        assert ("chattts-autoscaler", "scale") in managers, managers

        # After the load the fleet is idle and the autoscaler scales back to minReplicas.
        wait_until(lambda: get(kubectl, namespace, "ctd", "voice")["spec"]["replicas"] == 1,
                   "the scale-down after the load", timeout=120)
        final = wait_until(lambda: (s := autoscaling_status(kubectl, namespace, "voice"))["decisions"][-1][
            "reason"] == "ScaleDown" and s, "the scale-down recorded in status", timeout=30)
        print("decisions:", json.dumps(final["decisions"], indent=1))
        assert final["decisions"][-1]["currentReplicas"] > 1, final["decisions"]
        # The story is all there: the scale-up, then the scale-down (none lost to a stale watch event).
        reasons = [d["reason"] for d in final["decisions"]]
        assert "ScaleUp" in reasons and reasons.index("ScaleUp") < len(reasons) - 1, reasons
        conditions = {c["type"]: c for c in final["conditions"]}
        assert conditions["ScalingActive"]["status"] == "True"
        assert conditions["AbleToScale"]["status"] == "True"
        events = get(kubectl, namespace, "events", "--field-selector", "involvedObject.name=voice")["items"]
        assert {"ScaledUp", "ScaledDown"} <= {e["reason"] for e in events}
        assert mapper.error is None, mapper.error
    finally:
        if load is not None:
            load.stop.set()
        if mapper is not None:
            mapper.stop.set()
        op.stop()
        print(f"--- operator log ---\n{op.log_tail(120)}")
        kubectl("delete", "-n", namespace, "ctd", "--all", "--wait=false", check=False)


def runtime_engine_config(kubectl, namespace: str, name: str) -> dict:
    return yaml.safe_load(runtime_yaml(kubectl, namespace, name))["engine"]


def test_batch_token_tuning_raises_at_max_replicas_and_lowers_when_quiet(cluster, namespace, runtime_processes,
                                                                       tmp_path):
    """One replica that may not grow: sustained waits raise maxNumBatchedTokens one step (a
    rolling update through the runtime ConfigMap); a quiet period lowers it back."""
    kubectl = cluster.kubectl
    install_crds(cluster)
    op = OperatorProcess(cluster.kubeconfig, tmp_path, namespaces=(namespace,), **OPERATOR_SETTINGS)
    op.env["CHATTTS_AUTOSCALER_METRICS_URL_ANNOTATION"] = "1"
    op.env["CHATTTS_AUTOSCALER_INTERVAL_SECONDS"] = "2"
    op.start()
    mapper = load = None
    try:
        apply(kubectl, namespace, ctd(
            "tuned", replicas=1, engine={"kind": "vllm", "maxNumSeqs": SLOTS},  # tuning is vLLM's knob
            autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 1, "window": "6s", "staleness": "30s",
                         "batchTokenTuning": {"enabled": True, "step": 1024, "cap": 9216,
                                              "sustainedFor": "4s", "quietPeriod": "8s"}}))
        mapper = PodMapper(kubectl, namespace, "tuned", runtime_processes)
        mapper.start()
        wait_until(lambda: mapper.ready_urls, "the pod Ready and mapped", timeout=120)
        assert runtime_engine_config(kubectl, namespace, "tuned").get("max_num_batched_tokens") is None

        load = Load(mapper)
        load.start()
        tuned = wait_until(
            lambda: autoscaling_status(kubectl, namespace, "tuned").get("batchTokenTuning", {}).get(
                "maxNumBatchedTokens") == 9216, "maxNumBatchedTokens raised", timeout=LOAD_SECONDS)
        assert tuned
        # The core rolls it out: the runtime config now carries the raised value.
        wait_until(lambda: runtime_engine_config(kubectl, namespace, "tuned").get("max_num_batched_tokens") == 9216,
                   "the raised value in the runtime ConfigMap", timeout=30)
        load.stop.set()
        load.join(timeout=90)

        # Quiet: after the quiet period it steps back to the spec's own value (unset).
        wait_until(lambda: autoscaling_status(kubectl, namespace, "tuned").get("batchTokenTuning", {}).get(
            "maxNumBatchedTokens") is None, "maxNumBatchedTokens lowered", timeout=90)
        wait_until(lambda: runtime_engine_config(kubectl, namespace, "tuned").get("max_num_batched_tokens") is None,
                   "the runtime ConfigMap back to the spec", timeout=30)
        events = get(kubectl, namespace, "events", "--field-selector", "involvedObject.name=tuned")["items"]
        reasons = [e["reason"] for e in events]
        assert reasons.count("BatchTokensRaised") == 1 and reasons.count("BatchTokensLowered") == 1, reasons
        assert get(kubectl, namespace, "ctd", "tuned")["spec"]["replicas"] == 1
        assert mapper.error is None, mapper.error
    finally:
        if load is not None:
            load.stop.set()
        if mapper is not None:
            mapper.stop.set()
        op.stop()
        print(f"--- operator log ---\n{op.log_tail(80)}")
        kubectl("delete", "-n", namespace, "ctd", "--all", "--wait=false", check=False)


BAD_AUTOSCALING = [
    ({"enabled": True, "minReplicas": 3, "maxReplicas": 2}, "minReplicas must not exceed autoscaling.maxReplicas"),
    ({"enabled": True}, "maxReplicas is required when autoscaling.enabled is true"),
    ({"enabled": True, "maxReplicas": 2, "targetSchedulerDeadlineWait": "5"}, "targetSchedulerDeadlineWait"),
    ({"enabled": True, "maxReplicas": 2, "metrics": {"type": "prometheus"}}, "needs metrics.prometheus.url"),
    ({"enabled": True, "maxReplicas": 2, "metrics": {"type": "prometheus", "prometheus": {
        "url": "http://p:9090", "query": 'up{job="$job"}'}}}, "unknown placeholder"),
    ({"enabled": True, "maxReplicas": 2, "batchTokenTuning": {"enabled": True}}, "cap is required"),
    ({"enabled": True, "maxReplicas": 2, "batchTokenTuning": {"step": 2048, "cap": 1024}}, "cap must be at least step"),
    ({"enabled": True, "maxReplicas": 2, "behavior": {"scaleUp": {"selectPolicy": "Sometimes"}}}, "selectPolicy"),
]


def test_bad_autoscaling_specs_are_rejected_at_apply_time(cluster, namespace):
    """The API server itself refuses them (schema and CEL), with a message naming the problem."""
    kubectl = cluster.kubectl
    install_crds(cluster)
    for autoscaling, message in BAD_AUTOSCALING:
        obj = ctd("bad", autoscaling=autoscaling)
        result = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)
        assert result.returncode != 0, f"accepted: {autoscaling}"
        assert message in result.stderr, (autoscaling, result.stderr)
    # The same shapes, made valid, are accepted ($$ is a literal dollar in a query).
    good = ctd("good", engine={"kind": "vllm"}, autoscaling={  # batch-token tuning is the vllm engine's
        "enabled": True, "minReplicas": 1, "maxReplicas": 2,
        "metrics": {"type": "prometheus", "prometheus": {
            "url": "http://p:9090", "query": 'max(x{namespace="$namespace",${selector}}) * $$5 + $quantile'}},
        "batchTokenTuning": {"enabled": True, "step": 1024, "cap": 16384}})
    kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(good))
