"""The vLLM tier: vLLM's CPU build (``.venv-vllm``, hack/setup-vllm-venv.sh) with tiny checkpoints.

Run: ``.venv-vllm/bin/python -m pytest tests/vllm_engine``. An engine takes 20-100 s to start
and ~3 GB of memory, so at most one is alive at a time: ``vllm_engine`` is module-scoped
(one per test module) and the server module starts its own only after it is gone.
Without vLLM the engine tests are skipped (the pure ones still run), unless
CHATTTS_REQUIRE_VLLM is set (CI), where that is an error.
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


def _vllm_missing() -> str | None:
    """Why vLLM cannot be used here, or None."""
    try:
        from vllm import ModelRegistry  # noqa: F401
    except ImportError as err:
        return f"vLLM is not installed ({err}): run hack/setup-vllm-venv.sh and use .venv-vllm"
    return None


VLLM_MISSING = _vllm_missing()
# These need torch only; every other module here starts or configures a vLLM engine.
_WITHOUT_VLLM = {"test_layout.py", "test_frames.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path.parent.name != "vllm_engine" or path.parent.parent.name != "tests":
            continue
        item.add_marker(pytest.mark.vllm)
        if VLLM_MISSING and path.name not in _WITHOUT_VLLM:
            if os.environ.get("CHATTTS_REQUIRE_VLLM"):
                raise pytest.UsageError(VLLM_MISSING)
            item.add_marker(pytest.mark.skip(reason=VLLM_MISSING))


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
