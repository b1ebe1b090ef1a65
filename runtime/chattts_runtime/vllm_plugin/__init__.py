"""ChatTTS on vLLM: an out-of-tree model plugin.

vLLM loads it through the ``vllm.general_plugins`` entry point (``register`` below) in
every process it starts. Modules:

* ``layout``: how frames map onto token ids (pure Python);
* ``frames``: per-request frame state in the worker process;
* ``logits``: the logits processor that keeps batch rows -> requests current;
* ``model``: the ChatTTS GPT for vLLM (``ChatTTSForAudioCodes``).

The engine that drives it is ``chattts_runtime.engines.vllm_engine``.
"""
from __future__ import annotations

from chattts_runtime.vllm_plugin.layout import ARCHITECTURE

MODEL_CLASS = "chattts_runtime.vllm_plugin.model:ChatTTSForAudioCodes"
LOGITS_PROCESSOR = "chattts_runtime.vllm_plugin.logits:ChatTTSBatchTracker"


def register() -> None:
    """Register the model class with vLLM (lazily: vLLM imports it when needed). Idempotent."""
    from vllm import ModelRegistry  # noqa: PLC0415  (only where vLLM is installed)

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
