"""The ChatTTS model: checkpoint layout, modules, prompts, speakers (see README.md here).

``load_chattts(path)`` is the entry point; the submodules import torch, this package's
``config`` module does not.
"""
from chattts_runtime.model.config import (
    SAMPLE_RATE, CheckpointError, GPTSizes, ModelSizes, load_model_sizes)

__all__ = ["SAMPLE_RATE", "CheckpointError", "GPTSizes", "ModelSizes", "load_model_sizes", "load_chattts",
           "ChatTTSModel"]


def __getattr__(name: str):
    # Lazy: the loader pulls in torch and transformers.
    if name in ("load_chattts", "ChatTTSModel"):
        from chattts_runtime.model import loader  # noqa: PLC0415

        return getattr(loader, name)
    raise AttributeError(name)
