"""The model package: checkpoint layout, loading errors, prompts, speakers, audio shapes."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from chattts_runtime.model import CheckpointError, load_chattts
from chattts_runtime.model import config as layout
from chattts_runtime.model.speaker import (
    SpeakerError, normalize_speaker, b16384_decode, b16384_encode, decode_speaker, encode_speaker, preset_speaker)


def test_tiny_checkpoint_has_the_official_layout(tiny_checkpoint):
    for rel in (layout.GPT_CONFIG, layout.GPT_WEIGHTS, layout.EMBED_WEIGHTS, layout.DVAE_WEIGHTS,
                layout.DECODER_WEIGHTS, layout.VOCOS_WEIGHTS, f"{layout.TOKENIZER_DIR}/tokenizer.json"):
        assert (tiny_checkpoint / rel).is_file(), rel
    from safetensors.torch import load_file

    embed = load_file(str(tiny_checkpoint / layout.EMBED_WEIGHTS))
    assert embed["emb_code.3.weight"].shape[0] == 626
    assert "head_code.0.parametrizations.weight.original0" in embed
    assert "head_code.0.parametrizations.weight.original1" in embed
    body = load_file(str(tiny_checkpoint / layout.GPT_WEIGHTS))
    assert "layers.0.self_attn.q_proj.weight" in body and "norm.weight" in body
    cfg = json.loads((tiny_checkpoint / layout.GPT_CONFIG).read_text())
    assert cfg["hidden_size"] // cfg["num_attention_heads"] >= 32  # vLLM's CPU attention needs it


def test_prompt_uses_chattts_control_tokens(tiny_model):
    tok = tiny_model.tokenizer
    with_spk = tok.build("hello", with_speaker=True, speed=1.0)
    without = tok.build("hello", with_speaker=False, speed=2.0)
    vocab = tok._tok.get_vocab()
    assert with_spk.input_ids[:3] == (vocab["[Stts]"], vocab["[spk_emb]"], vocab["[speed_5]"])
    assert with_spk.input_ids[-1] == vocab["[Ptts]"]
    assert without.input_ids[1:3] == (vocab["[empty_spk]"], vocab["[speed_9]"])
    # as upstream's decorate_code_prompts: [Stts], [spk_emb] and [empty_spk] typed by a user are removed
    # (in that order), anything else stays; the sample's transcript is kept as it is
    assert tok.build("[Stts]hel[empty_spk]lo [spk_emb]", with_speaker=True).input_ids == with_spk.input_ids
    kept = tok.build("hello[Ptts]", with_speaker=True).input_ids
    assert kept == with_spk.input_ids[:-1] + (vocab["[Ptts]"], vocab["[Ptts]"])
    nested = tok.build("[spk_[empty_spk]emb]hello", with_speaker=True).input_ids
    assert nested.count(vocab["[spk_emb]"]) == 2
    sampled = tok.build("hello", with_speaker=False, sample_text="[Stts]hi").input_ids
    assert sampled[:3] == (vocab["[Stts]"], vocab["[empty_spk]"], vocab["[Stts]"])


def test_codes_become_audio_of_the_expected_length(tiny_model):
    codes = torch.randint(0, 625, (2, 10, 4))
    audio = tiny_model.codes_to_audio(codes)
    assert audio.shape == (2, (2 * 10 - 1) * 256)
    assert torch.isfinite(audio).all() and audio.abs().max() > 0
    hidden = torch.randn(1, 10, tiny_model.sizes.gpt.hidden_size)
    assert tiny_model.hidden_to_audio(hidden).shape == (1, 19 * 256)


def test_speaker_string_round_trip_and_errors(tiny_model):
    for n in range(0, 20):
        data = os.urandom(n)
        assert b16384_decode(b16384_encode(data)) == data
    vec = np.random.default_rng(0).standard_normal(64).astype(np.float16)
    text = encode_speaker(vec)
    assert np.array_equal(decode_speaker(text, 64), vec.astype(np.float32))
    # the engines get it L2-normalised in float16, as upstream normalises it
    assert torch.equal(tiny_model.speaker_for(text), torch.from_numpy(normalize_speaker(vec)))
    with pytest.raises(SpeakerError, match=r"needs 128 \(64 float16 values\)"):
        decode_speaker(encode_speaker(np.zeros(32, np.float16)), 64)
    with pytest.raises(SpeakerError, match="unknown voice"):
        tiny_model.speaker_for("nobody")
    # presets are deterministic: the same voice on every replica
    assert torch.equal(tiny_model.speaker_for("nova"), tiny_model.speaker_for("nova"))
    assert not torch.equal(tiny_model.speaker_for("nova"), tiny_model.speaker_for("onyx"))
    # drawn once, then served from the model's cache: the same vector as a fresh draw, and every
    # caller owns its tensor (one that scales its own copy changes nobody else's)
    fresh = torch.from_numpy(normalize_speaker(preset_speaker("nova", tiny_model.speaker_stats)))
    mine = tiny_model.speaker_for("nova")
    assert torch.equal(mine, fresh)
    mine.mul_(3)
    assert torch.equal(tiny_model.speaker_for("nova"), fresh)


def test_missing_file_and_wrong_shapes_name_the_file(tiny_checkpoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / layout.VOCOS_WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match="Vocos.safetensors"):
        load_chattts(broken)

    shutil.copy(tiny_checkpoint / layout.VOCOS_WEIGHTS, broken / layout.VOCOS_WEIGHTS)
    cfg = json.loads((broken / layout.GPT_CONFIG).read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2
    (broken / layout.GPT_CONFIG).write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"gpt/model.safetensors.*mlp"):
        load_chattts(broken)

    with pytest.raises(CheckpointError, match="does not exist"):
        load_chattts(tmp_path / "nothing-here")


@pytest.mark.parametrize("frames", [2, 5, 16, 128])
def test_istft_equals_torch_istft(frames):
    """The written-out ISTFT (capturable in a CUDA graph) computes what torch.istft does."""
    from chattts_runtime.model.audio import ISTFT

    istft = ISTFT(1024, 256)
    gen = torch.Generator().manual_seed(frames)
    spec = torch.polar(torch.rand(2, 513, frames, generator=gen) * 3, torch.rand(2, 513, frames, generator=gen) * 6.3)
    expected = torch.istft(spec, 1024, 256, 1024, istft.window, center=True)
    got = istft(spec)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def _cuda_fp32_matmul_setting():
    matmul = torch.backends.cuda.matmul
    return matmul.fp32_precision if hasattr(matmul, "fp32_precision") else matmul.allow_tf32


def test_tf32_audio_matmuls_hold_only_inside_the_audio_decoders(tiny_checkpoint):
    """engine.audio_precision tf32: the DVAE, Decoder and Vocos run with CUDA's float32 matrix products in TF32,
    and nothing else does; on the CPU the option is off (there is no TF32), and the setting flows from the
    config through load_options to the model of the engine's own process."""
    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.engines.factory import create_engine, load_options
    from chattts_runtime.model.loader import tf32_matmuls

    before = _cuda_fp32_matmul_setting()
    model = load_chattts(tiny_checkpoint, audio_tf32=True)
    assert model.audio_tf32 is False  # CPU
    model.audio_tf32 = True  # as on CUDA: the switch is the same, only its effect needs a GPU
    seen = []
    for module in (model.dvae, model.decoder, model.vocos):
        module.register_forward_pre_hook(lambda *_: seen.append(_cuda_fp32_matmul_setting()))
    try:
        codes = torch.zeros(1, 4, model.sizes.gpt.num_vq, dtype=torch.long)
        model.codes_to_audio(codes)
        model.hidden_to_audio(torch.zeros(1, 4, model.sizes.gpt.hidden_size))
    finally:
        model.audio_tf32 = False
    assert seen == ["tf32" if hasattr(torch.backends.cuda.matmul, "fp32_precision") else True] * 4
    assert _cuda_fp32_matmul_setting() == before
    with pytest.raises(RuntimeError, match="boom"), tf32_matmuls(True):
        raise RuntimeError("boom")
    assert _cuda_fp32_matmul_setting() == before  # restored on the way out of an error too

    config = RuntimeConfig.model_validate({"engine": {"audio_precision": "tf32"}})
    assert load_options(config, "cuda")["audio_tf32"] is True
    # The engine's own process loads its model with the parent model's choice.
    separate = RuntimeConfig.model_validate({"engine_kind": "graph", "engine": {"process": "separate"}})
    model.audio_tf32 = True
    try:
        assert create_engine(separate, model, observer=None).spec.audio_tf32 is True
    finally:
        model.audio_tf32 = False
    assert load_options(RuntimeConfig(), "cuda")["audio_tf32"] is True  # the default on CUDA
    assert load_options(RuntimeConfig(), "cpu")["audio_tf32"] is False  # no TF32 on a CPU
    float32 = RuntimeConfig.model_validate({"engine": {"audio_precision": "float32"}})
    assert load_options(float32, "cuda")["audio_tf32"] is False
    with pytest.raises(ValueError, match="audio_precision"):
        RuntimeConfig.model_validate({"engine": {"audio_precision": "bfloat16"}})
