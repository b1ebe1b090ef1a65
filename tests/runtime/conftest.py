"""Fixtures for the runtime tier: tiny random checkpoints and real servers on loopback.

``tiny_checkpoint`` ends generation at random (like a real model); ``endless_checkpoint``
never emits the end code, so output length is exactly ``max_new_frames`` frames.
``start_server(**overrides)`` runs ``chattts-runtime serve`` as a subprocess on a free
loopback port and waits for ``/ready``; servers are terminated (by pid) after the test.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("torch", reason="the runtime tier needs torch (runtime extra)")
httpx = pytest.importorskip("httpx")
yaml = pytest.importorskip("yaml")

from rt_helpers import REPO, RunningServer, merge, wait_ready  # noqa: E402
from tests.support import free_port  # noqa: E402


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/runtime/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.runtime)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from chattts_runtime.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="session")
def endless_checkpoint(tmp_path_factory) -> Path:
    from chattts_runtime.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "endless", endless=True, seed=1)


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    from chattts_runtime.model import load_chattts

    return load_chattts(tiny_checkpoint)


@pytest.fixture
def start_server(tmp_path, tiny_checkpoint) -> Callable[..., RunningServer]:
    procs: list[subprocess.Popen] = []

    def start(overrides: dict[str, Any] | None = None, checkpoint: Path | None = None) -> RunningServer:
        port = free_port()
        config = merge({
            "model": {"path": str(checkpoint or tiny_checkpoint)},
            "engine_kind": "reference",
            "device": "cpu",
            "server": {"host": "127.0.0.1", "port": port, "shutdown_grace_seconds": 30},
            "generation": {"temperature": 0, "max_new_frames": 48, "refine_text": False},
        }, overrides or {})
        cfg_path = tmp_path / f"runtime-{port}.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        log_path = tmp_path / f"server-{port}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHATTTS_")}
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "2")
        proc = subprocess.Popen([sys.executable, "-m", "chattts_runtime", "serve", "--config", str(cfg_path)],
                                stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env, cwd=REPO)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, log_path)
        return RunningServer(proc, url, log_path)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
