"""The CLI: config errors name the field, offline synthesize resumes, AWQ quantize round trip."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import wave

import pytest
import torch

from chattts_runtime.cli import main
from rt_helpers import REPO


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "chattts_runtime", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env=env)


@pytest.mark.parametrize("yaml_text,field", [
    ("engine:\n  max_num_seqs: 0\n", "engine.max_num_seqs"),
    ("server:\n  prot: 8000\n", "server.prot"),
    ("generation:\n  temperature: hot\n", "generation.temperature"),
    ("engine_kind: tensorrt\n", "engine_kind"),
    # The graph engine (the default) and the reference engine keep their KV cache in the activation dtype.
    ("engine:\n  kv_cache_dtype: fp8\n", "engine.kv_cache_dtype fp8: the graph engine"),
    ("engine_kind: reference\nengine:\n  kv_cache_dtype: fp8_e5m2\n", "engine.kv_cache_dtype fp8_e5m2: the reference"),
])
def test_config_errors_name_the_field(tmp_path, capsys, yaml_text, field):
    cfg = tmp_path / "runtime.yaml"
    cfg.write_text(yaml_text)
    assert main(["serve", "--config", str(cfg)]) == 2
    assert field in capsys.readouterr().err


def test_the_default_engine_is_the_one_measured_on_the_gpu_and_vllm_keeps_fp8():
    from chattts_runtime.config import EngineKind, RuntimeConfig

    assert RuntimeConfig().engine_kind is EngineKind.GRAPH
    config = RuntimeConfig.model_validate({"engine_kind": "vllm", "engine": {"kv_cache_dtype": "fp8"}})
    assert config.engine.kv_cache_dtype == "fp8"


def test_long_inputs_take_the_first_pieces_voice_on_every_engine_unless_turned_off():
    from chattts_runtime.config import RuntimeConfig

    for kind in ("graph", "reference", "vllm"):
        assert RuntimeConfig(engine_kind=kind).text.voice_from_first_piece
    assert not RuntimeConfig.model_validate({"text": {"voice_from_first_piece": False}}).text.voice_from_first_piece


def test_environment_override_errors_name_the_field(tmp_path):
    cfg = tmp_path / "runtime.yaml"
    cfg.write_text("engine_kind: reference\n")
    import os

    env = {**os.environ, "CHATTTS_SERVER__MAX_QUEUE": "-3"}
    result = run_cli("serve", "--config", str(cfg), env=env)
    assert result.returncode == 2 and "server.max_queue" in result.stderr


def test_missing_model_fails_before_serving(tmp_path):
    cfg = tmp_path / "runtime.yaml"
    cfg.write_text(f"engine_kind: reference\nmodel:\n  path: {tmp_path / 'absent'}\n")
    result = run_cli("serve", "--config", str(cfg))
    assert result.returncode == 2
    assert "model.path" in result.stderr and "does not exist" in result.stderr


def test_broken_checkpoint_fails_start_up_with_exit_1(tmp_path, tiny_checkpoint):
    import shutil

    from tests.support import free_port

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "asset/DVAE.safetensors").write_bytes(b"not safetensors")
    cfg = tmp_path / "runtime.yaml"
    cfg.write_text(f"engine_kind: reference\nmodel:\n  path: {broken}\n"
                   f"server:\n  host: 127.0.0.1\n  port: {free_port()}\n")
    result = run_cli("serve", "--config", str(cfg))
    assert result.returncode == 1
    assert "start-up failed" in result.stderr


def _config(tmp_path, checkpoint, **generation):
    cfg = tmp_path / "runtime.yaml"
    gen = {"temperature": 0, "max_new_frames": 24, "refine_text": False, **generation}
    cfg.write_text(json.dumps({"model": {"path": str(checkpoint)}, "engine_kind": "reference",
                               "device": "cpu", "generation": gen}))
    return cfg


@pytest.mark.slow
def test_synthesize_writes_audio_and_resumes(tmp_path, endless_checkpoint):
    texts = tmp_path / "texts.jsonl"
    items = [{"id": f"item-{i}", "text": f"offline sentence {i}"} for i in range(4)]
    items.append({"id": "bad-voice", "text": "x", "voice": "nobody"})
    texts.write_text("\n".join(json.dumps(i) for i in items) + "\n")
    out = tmp_path / "out"
    cfg = _config(tmp_path, endless_checkpoint)

    first = run_cli("synthesize", "--config", str(cfg), "--input", str(texts), "--out", str(out))
    assert first.returncode == 1, first.stderr  # one item failed
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    ok = {r["id"]: r for r in manifest if r["status"] == "ok"}
    assert set(ok) == {f"item-{i}" for i in range(4)}
    assert [r for r in manifest if r["status"] == "error"][0]["id"] == "bad-voice"
    with wave.open(str(out / "item-0.wav")) as w:
        assert w.getframerate() == 24_000 and w.getnframes() == (2 * 24 - 1) * 256

    # A rerun (say, after the Job was evicted) redoes only what is missing.
    (out / "item-2.wav").unlink()
    mtime = (out / "item-0.wav").stat().st_mtime_ns
    texts.write_text("\n".join(json.dumps(i) for i in items[:4]) + "\n")
    second = run_cli("synthesize", "--config", str(cfg), "--input", str(texts), "--out", str(out))
    assert second.returncode == 0, second.stderr
    assert "synthesized 1, skipped 3" in second.stdout
    assert (out / "item-2.wav").exists() and (out / "item-0.wav").stat().st_mtime_ns == mtime


def test_synthesize_rejects_bad_input_before_work(tmp_path, endless_checkpoint):
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"id": "a", "text": "ok"}\n{"id": "a", "text": "again"}\n')
    cfg = _config(tmp_path, endless_checkpoint)
    result = run_cli("synthesize", "--config", str(cfg), "--input", str(texts), "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "texts.jsonl:2: duplicate id" in result.stderr
    texts.write_text('{"id": "../escape", "text": "ok"}\n')
    result = run_cli("synthesize", "--config", str(cfg), "--input", str(texts), "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "must match" in result.stderr


@pytest.mark.slow
def test_awq_quantize_load_generate_small_error(tmp_path, tiny_checkpoint, tiny_model):
    pytest.importorskip("awq")
    calib = tmp_path / "calib.jsonl"
    calib.write_text("\n".join(json.dumps({"text": f"calibration text {i}, hello world"}) for i in range(24)))
    out = tmp_path / "awq"
    assert main(["quantize", "--model", str(tiny_checkpoint), "--out", str(out), "--calib", str(calib),
                 "--group-size", "32", "--n-samples", "16", "--max-calib-frames", "16"]) == 0
    cfg = json.loads((out / "asset/gpt/config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "awq"
    assert cfg["quantization_config"]["version"] == "gemm"
    from safetensors.torch import load_file

    body = load_file(str(out / "asset/gpt/model.safetensors"))
    assert body["layers.0.self_attn.q_proj.qweight"].dtype == torch.int32
    assert body["layers.0.self_attn.q_proj.scales"].dtype == torch.float16
    assert "layers.0.self_attn.q_proj.weight" not in body
    # embeddings and heads are untouched
    assert (out / "asset/Embed.safetensors").read_bytes() == (tiny_checkpoint / "asset/Embed.safetensors").read_bytes()

    from awq.utils.packing_utils import dequantize_gemm as awq_dequantize

    from chattts_runtime.model.awq import dequantize_gemm

    p = "layers.1.mlp.down_proj"
    ours = dequantize_gemm(body[p + ".qweight"], body[p + ".qzeros"], body[p + ".scales"], 4, 32)
    theirs = awq_dequantize(body[p + ".qweight"], body[p + ".qzeros"], body[p + ".scales"], 4, 32).float().t()
    assert torch.allclose(ours, theirs, atol=1e-3)

    from chattts_runtime.engines.base import SamplingParams, SynthesisRequest
    from chattts_runtime.engines.kvcache import BatchKVCache
    from chattts_runtime.engines.reference import ReferenceEngine
    from chattts_runtime.model import load_chattts

    quantized = load_chattts(out)

    def hidden(model):
        prompt = model.tokenizer.build("measure the quantization error", with_speaker=True)
        emb = model.gpt.prompt_embeds(prompt.input_ids, model.speaker_for("alloy"), model.tokenizer.spk_emb_id)
        g = model.sizes.gpt
        cache = BatchKVCache(g.num_hidden_layers, g.num_key_value_heads, g.head_dim, torch.float32,
                             torch.device("cpu"), rows=1)
        return model.gpt.forward_step(emb, torch.arange(emb.shape[1])[None], cache)

    ref, q = hidden(tiny_model), hidden(quantized)
    rel = ((ref - q).norm() / ref.norm()).item()
    assert rel < 0.05, rel

    async def generate():
        engine = ReferenceEngine(quantized)
        await engine.start()
        prompt = quantized.tokenizer.build("quantized speech", with_speaker=True)
        req = SynthesisRequest("q", prompt.input_ids, quantized.speaker_for("nova").numpy(),
                               SamplingParams(temperature=0, max_new_frames=10, min_new_frames=1))
        chunks = [c async for c in engine.submit(req)]
        await engine.stop()
        return chunks

    chunks = asyncio.run(generate())
    codes = torch.tensor([f for c in chunks for f in c.codes.tolist()])
    assert len(codes) >= 1
    audio = quantized.codes_to_audio(codes[None])
    assert torch.isfinite(audio).all() and audio.shape[1] == (2 * len(codes) - 1) * 256
