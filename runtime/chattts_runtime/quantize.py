"""AWQ quantization of the ChatTTS GPT's decoder linear layers (AutoAWQ 0.2.9), and loading it back.

The GPT never sees token ids: its inputs are text embeddings and sums of audio-code
embeddings. AutoAWQ calibrates a causal LM from token ids, so calibration goes through
a *virtual vocabulary*: every calibration input vector (prompt embeddings of a text,
then the code embeddings of frames the 16-bit model generates for it) becomes one row of
the embedding table of a temporary ``LlamaForCausalLM`` that wraps our Llama body, and
the calibration "tokens" are the row indices. AutoAWQ then sees exactly the activations
the GPT sees when serving.

Output: the input checkpoint with ``asset/gpt/`` replaced by the quantized body
(``layers.{i}.*_proj.{qweight,qzeros,scales}``, int32-packed GEMM layout, float16
scales) and ``quantization_config`` (``quant_method: awq``, ``version: gemm``) in its
``config.json``, which vLLM's AWQ loader reads. Embeddings, heads, norms, DVAE, decoder
and vocoder stay in their original precision.

The runtime loads this on any device by dequantizing (``model/awq.py``);
the vLLM engine runs the packed weights directly.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch

from chattts_runtime.model import config as layout

log = logging.getLogger(__name__)


class QuantizeError(ValueError):
    pass


# -- quantizing ----------------------------------------------------------------------------

def read_calibration_texts(path: Path, n_samples: int) -> list[str]:
    if not path.exists():
        raise QuantizeError(f"calibration file {path} does not exist")
    texts = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise QuantizeError(f"{path}:{lineno}: invalid JSON: {err}") from None
        text = data.get("text") if isinstance(data, dict) else data if isinstance(data, str) else None
        if not isinstance(text, str) or not text.strip():
            raise QuantizeError(f"{path}:{lineno}: expected {{\"text\": \"...\"}} with non-empty text")
        texts.append(text)
        if len(texts) == n_samples:
            break
    if not texts:
        raise QuantizeError(f"{path}: no calibration texts")
    return texts


def calibration_sequences(model, texts: list[str], max_frames: int, seed: int = 0) -> list[torch.Tensor]:
    """Per text: the GPT's input vectors ``[T, H]`` (prompt, then codes the model itself generates)."""
    import asyncio  # noqa: PLC0415

    from chattts_runtime.engines.base import SamplingParams, SynthesisRequest  # noqa: PLC0415
    from chattts_runtime.engines.reference import ReferenceEngine  # noqa: PLC0415
    from chattts_runtime.model.speaker import PRESET_VOICES  # noqa: PLC0415

    prompts = []
    for i, text in enumerate(texts):
        speaker = model.speaker_for(PRESET_VOICES[i % len(PRESET_VOICES)])
        prompts.append((model.tokenizer.build(text, with_speaker=True).input_ids, speaker))

    async def generate() -> list[list]:
        engine = ReferenceEngine(model, max_num_seqs=16, max_waiting=len(prompts) + 1,
                                 max_model_len=model.sizes.gpt.max_position_embeddings)
        await engine.start()

        async def one(i: int, ids, speaker) -> list:
            req = SynthesisRequest(f"calib-{i}", ids, speaker.numpy(),
                                   SamplingParams(max_new_frames=max_frames, min_new_frames=1, seed=seed + i))
            frames = []
            async for chunk in engine.submit(req):
                frames.extend(chunk.codes)
            return frames

        try:
            return await asyncio.gather(*(one(i, ids, spk) for i, (ids, spk) in enumerate(prompts)))
        finally:
            await engine.stop()

    generated = asyncio.run(generate())
    sequences = []
    with torch.inference_mode():
        for (ids, speaker), frames in zip(prompts, generated):
            emb = model.gpt.prompt_embeds(ids, speaker, model.tokenizer.spk_emb_id)[0]
            if frames:
                codes = torch.tensor([list(f) for f in frames], dtype=torch.long, device=emb.device)
                emb = torch.cat((emb, model.gpt.embed.embed_codes(codes)), dim=0)
            sequences.append(emb.float().cpu())
    return sequences


def quantize_checkpoint(model_dir: Path, out_dir: Path, calib: Path, *, w_bit: int = 4, group_size: int = 128,
                        n_samples: int = 512, zero_point: bool = True, max_calib_frames: int = 64) -> Path:
    from chattts_runtime.model import load_chattts  # noqa: PLC0415
    from chattts_runtime.model.awq import gpt_quantization  # noqa: PLC0415

    if out_dir.resolve() == model_dir.resolve():
        raise QuantizeError("--out must differ from --model")
    if w_bit != 4:
        raise QuantizeError("only 4-bit AWQ is supported (GEMM kernels)")
    if (model_dir / layout.GPT_CONFIG).exists() and gpt_quantization(model_dir) is not None:
        raise QuantizeError(f"{model_dir} is already quantized")
    sizes = layout.load_model_sizes(model_dir)
    g = sizes.gpt
    for name, dim in (("hidden_size", g.hidden_size), ("intermediate_size", g.intermediate_size)):
        if dim % group_size:
            raise QuantizeError(f"--group-size {group_size} must divide {name} {dim}")
    texts = read_calibration_texts(calib, n_samples)
    try:
        from awq import AutoAWQForCausalLM  # noqa: PLC0415
    except ImportError as err:
        raise QuantizeError(f"AutoAWQ is not installed (pip install autoawq==0.2.9 --no-deps): {err}") from None

    model = load_chattts(model_dir, device="cpu", dtype=torch.float32)
    log.info("calibration: generating up to %d frames for %d texts", max_calib_frames, len(texts))
    sequences = calibration_sequences(model, texts, max_calib_frames)
    table = torch.cat(sequences, dim=0)
    token_lists, offset = [], 0
    for seq in sequences:
        token_lists.append(list(range(offset, offset + seq.shape[0])))
        offset += seq.shape[0]
    longest = max(len(t) for t in token_lists)
    max_seq_len = max(longest, min(512, offset))

    with tempfile.TemporaryDirectory(prefix="chattts-awq-") as tmp:
        wrapper_dir = Path(tmp) / "wrapper"
        _write_virtual_vocab_lm(model, table, wrapper_dir)
        del model
        awq_model = AutoAWQForCausalLM.from_pretrained(str(wrapper_dir), torch_dtype=torch.float32,
                                                       device_map="cpu", safetensors=True)
        quant_config = {"zero_point": zero_point, "q_group_size": group_size, "w_bit": w_bit, "version": "GEMM"}
        awq_model.quantize(None, quant_config=quant_config, calib_data=token_lists,
                           max_calib_seq_len=max_seq_len, max_calib_samples=len(token_lists),
                           n_parallel_calib_samples=None)
        state = {k[len("model."):]: v for k, v in awq_model.model.state_dict().items()
                 if k.startswith("model.") and not k.startswith("model.embed_tokens")}

    body: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith(".scales") or (value.is_floating_point() and not key.endswith(".qweight")):
            value = value.to(torch.float16)
        body[key] = value.contiguous()
    _copy_checkpoint(model_dir, out_dir)
    from safetensors.torch import save_file  # noqa: PLC0415

    save_file(body, str(out_dir / layout.GPT_WEIGHTS))
    cfg = json.loads((model_dir / layout.GPT_CONFIG).read_text())
    cfg["torch_dtype"] = "float16"
    cfg["quantization_config"] = {"quant_method": "awq", "bits": w_bit, "group_size": group_size,
                                  "zero_point": zero_point, "version": "gemm", "modules_to_not_convert": None}
    (out_dir / layout.GPT_CONFIG).write_text(json.dumps(cfg, indent=2))
    log.info("wrote AWQ checkpoint to %s", out_dir)
    return out_dir


def _write_virtual_vocab_lm(model, table: torch.Tensor, out: Path) -> None:
    """Save a LlamaForCausalLM whose token embedding rows are the calibration input vectors."""
    from safetensors.torch import save_file  # noqa: PLC0415
    from transformers import LlamaConfig  # noqa: PLC0415

    g = model.sizes.gpt
    config = LlamaConfig(
        vocab_size=table.shape[0], hidden_size=g.hidden_size, intermediate_size=g.intermediate_size,
        num_attention_heads=g.num_attention_heads, num_key_value_heads=g.num_key_value_heads,
        num_hidden_layers=g.num_hidden_layers, max_position_embeddings=g.max_position_embeddings,
        rms_norm_eps=g.rms_norm_eps, rope_theta=g.rope_theta, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    out.mkdir(parents=True)
    config.save_pretrained(str(out))
    state = {f"model.{k}": v.float().contiguous() for k, v in model.gpt.llama.state_dict().items()}
    state["model.embed_tokens.weight"] = table.contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def _copy_checkpoint(src: Path, dst: Path) -> None:
    if dst.exists() and any(dst.iterdir()):
        raise QuantizeError(f"output directory {dst} is not empty")
    shutil.copytree(src, dst, dirs_exist_ok=True)
