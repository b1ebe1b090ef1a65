"""The operator as a subprocess (``python -m chattts_operator run``), as its container runs it.

Used by the benchmark and by the fault tests (tests/cluster/test_faults*.py): it can be
killed with SIGKILL, its /proc read, its /metrics scraped.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

from prometheus_client.parser import text_string_to_metric_families

from bench.operator_scale import procstat
from bench.runtime.launch import free_port  # noqa: F401  (one port picker for tests and benches)

REPO = Path(__file__).resolve().parents[2]




class OperatorProcess:
    """One operator subprocess at a time; ``start()`` again after ``stop()``/``kill()`` restarts it."""

    instances = 0  # log files of every instance and start stay apart

    def __init__(self, kubeconfig: Path | str, log_dir: Path, namespaces: tuple[str, ...] = (),
                 verbose: bool = False, module: str = "chattts_operator", **settings: str) -> None:
        self.namespaces = namespaces  # empty: the whole cluster (the chart's default)
        self.verbose = verbose  # kopf's DEBUG log (watch restarts after 410 Gone are logged there)
        self.module = module  # what `python -m` runs: the operator, or an experiment variant of it
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "CHATTTS_OPERATOR_METRICS_PORT": str(self.metrics_port),
            "CHATTTS_OPERATOR_HEALTH_PORT": str(self.health_port),
            "CHATTTS_OPERATOR_RUNTIME_IMAGE": "chattts-runtime:bench",
            # kwok's pods serve nothing at their made-up addresses: the UpstreamData question to each
            # Ready pod's /health would only time out and be measured as operator work.
            "CHATTTS_OPERATOR_UPSTREAM_DATA_INTERVAL_SECONDS": "0",
            **{f"CHATTTS_OPERATOR_{key.upper()}": str(value) for key, value in settings.items()},
        }
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        OperatorProcess.instances += 1
        self.instance = OperatorProcess.instances
        self._log: IO | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.instance}-{self.starts}.log"

    def start(self, wait: bool = True, timeout: float = 90) -> "OperatorProcess":
        self.starts += 1
        scope = [arg for ns in self.namespaces for arg in ("--namespace", ns)] or ["--all-namespaces"]
        self._log = open(self.log_path, "w")
        flags = ["--verbose"] if self.verbose else []
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, "run", *scope, *flags],
                                     env=self.env, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)
        if wait:
            self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"operator exited ({self.proc and self.proc.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"operator not healthy after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        """Signal it and wait; SIGKILL is a crash (no cleanup handlers run)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)

    def proc_sample(self) -> procstat.ProcSample:
        return procstat.sample(self.pid)

    def log_tail(self, lines: int = 80) -> str:
        path = self.log_path
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def metric_sum(self, name: str, **labels: str) -> float:
        return sum(value for (metric, pairs), value in self.metrics().items()
                   if metric == name and all(dict(pairs).get(k) == v for k, v in labels.items()))
