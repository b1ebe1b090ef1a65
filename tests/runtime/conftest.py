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
from pathlib import Path
from typing import Any, Callable

import pytest

# The graph engine's Triton kernels run on CPU in Triton's interpreter (test_graph_engine_fused.py). Triton reads
# this when it is imported (its own library kernels are decorated then), so it is set when this tier is collected,
# before any test runs; only this tier's session gets it (the vLLM tier's venv has a Triton of its own).
os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("torch", reason="the runtime tier needs torch (runtime extra)")
httpx = pytest.importorskip("httpx")
yaml = pytest.importorskip("yaml")

from rt_helpers import RunningServer, launch_server, tiny_server_config  # noqa: E402


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
        srv = launch_server(tiny_server_config(checkpoint or tiny_checkpoint, **(overrides or {})), tmp_path)
        procs.append(srv.proc)
        return srv

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
