"""The vLLM tier: vLLM's CPU build (``.venv-vllm``, hack/setup-vllm-venv.sh) with tiny checkpoints.

Run: ``.venv-vllm/bin/python -m pytest tests/vllm``. An engine takes 20-100 s to start
and ~3 GB of memory, so at most one is alive at a time: ``vllm_engine`` is module-scoped
(one per test module) and the server module starts its own only after it is gone.
Without vLLM the tier is skipped, unless CHATTTS_REQUIRE_VLLM is set (CI), where that
is an error.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "chattts-operator" / "vllm"
# Before vLLM is imported: a small CPU KV cache, and caches outside the repository.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CACHE_ROOT", str(_CACHE / "cache"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_CACHE / "inductor"))

try:
    import vllm  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    if os.environ.get("CHATTTS_REQUIRE_VLLM"):
        raise
    pytest.skip(f"vLLM is not installed ({err}): run hack/setup-vllm-venv.sh and use .venv-vllm",
                allow_module_level=True)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/vllm/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from chattts_runtime.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    from chattts_runtime.model import load_chattts

    return load_chattts(tiny_checkpoint)


CPU_ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 16}


@pytest.fixture(scope="session")
def vllm_runtime_config():
    """``(checkpoint, **engine) -> RuntimeConfig`` sized for the CPU (float32: exact numerics; eager: quick start)."""
    from chattts_runtime.config import RuntimeConfig

    def make(checkpoint: Path, **engine):
        return RuntimeConfig.model_validate({"model": {"path": str(checkpoint)}, "engine_kind": "vllm",
                                             "engine": {**CPU_ENGINE, **engine}, "device": "cpu"})

    return make


@pytest.fixture(scope="session")
def endless_checkpoint(tmp_path_factory) -> Path:
    """Never emits the end code: every request yields exactly ``max_new_frames`` frames."""
    from chattts_runtime.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "endless", endless=True, seed=1)
