"""``engines.vllm``: the name the speech server imports; the engine lives in ``vllm_engine``."""
from chattts_runtime.engines.vllm_engine import VLLMEngine, engine_cli_args, parse_engine_args

__all__ = ["VLLMEngine", "engine_cli_args", "parse_engine_args"]
