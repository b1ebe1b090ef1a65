"""Load a ChatTTS checkpoint directory (official layout) into :class:`ChatTTSModel`."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from chattts_runtime.model import config as layout
from chattts_runtime.model.audio import MelDecoder, Vocos
from chattts_runtime.model.config import CheckpointError, ModelSizes, load_model_sizes
from chattts_runtime.model.gpt import ChatTTSGPT
from chattts_runtime.model.prompt import PromptTokenizer
from chattts_runtime.model.speaker import (
    PRESET_VOICES, SpeakerError, decode_speaker, looks_like_speaker_string, preset_speaker)

log = logging.getLogger(__name__)

# Keys present in official files that the serving path does not use.
_SKIPPED_PREFIXES = {
    layout.DVAE_WEIGHTS: ("encoder.", "downsample_conv.", "preprocessor_mel."),
    layout.VOCOS_WEIGHTS: ("feature_extractor.",),
    layout.GPT_WEIGHTS: ("embed_tokens.",),
}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file  # noqa: PLC0415

    if not path.exists():
        raise CheckpointError(f"missing {path}")
    return load_file(str(path))


def load_into(module: nn.Module, state: dict[str, torch.Tensor], root: Path, rel: str) -> None:
    skip = _SKIPPED_PREFIXES.get(rel, ())
    state = {k: v for k, v in state.items() if not k.startswith(skip)}
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{root / rel}: missing keys {missing[:8]}, unexpected keys {unexpected[:8]}")
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise CheckpointError(f"{root / rel}: {key} has shape {tuple(value.shape)}, "
                                  f"the configured model needs {tuple(expected[key].shape)}")
    module.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})


def gpt_quantization(model_dir: Path) -> dict | None:
    data = json.loads((model_dir / layout.GPT_CONFIG).read_text())
    q = data.get("quantization_config")
    return q if isinstance(q, dict) else None


@dataclass
class ChatTTSModel:
    sizes: ModelSizes
    gpt: ChatTTSGPT
    dvae: MelDecoder      # codes -> mel
    decoder: MelDecoder | None  # hidden states -> mel (optional path)
    vocos: Vocos
    tokenizer: PromptTokenizer
    speaker_std: np.ndarray
    speaker_mean: np.ndarray
    quantization: dict | None = None

    @property
    def device(self) -> torch.device:
        return self.gpt.device

    def speaker_for(self, voice: str) -> torch.Tensor:
        """A preset name or a ChatTTS speaker embedding string -> speaker vector."""
        dim = self.sizes.gpt.hidden_size
        if voice in PRESET_VOICES:
            vec = preset_speaker(voice, self.speaker_std, self.speaker_mean)
        elif looks_like_speaker_string(voice):
            vec = decode_speaker(voice, dim)
        else:
            raise SpeakerError(f"unknown voice {voice[:40]!r}: use one of {', '.join(PRESET_VOICES)} "
                               f"or a ChatTTS speaker embedding string")
        return torch.from_numpy(vec)

    @torch.inference_mode()
    def codes_to_audio(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, T, num_vq]`` (long) -> float32 waveform ``[B, T * samples_per_frame]``."""
        mel = self.dvae(codes.to(self.device).transpose(1, 2))
        return self.vocos(mel).float()

    @torch.inference_mode()
    def hidden_to_audio(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.decoder is None:
            raise CheckpointError("this checkpoint has no asset/Decoder.safetensors")
        mel = self.decoder(hidden.to(self.device).transpose(1, 2))
        return self.vocos(mel).float()


def _speaker_stats(root: Path, dim: int) -> tuple[np.ndarray, np.ndarray]:
    path = root / layout.SPEAKER_STATS
    if not path.exists():
        return np.ones(dim, np.float32), np.zeros(dim, np.float32)
    stat = read_safetensors(path)
    tensor = stat.get("spk_stat")
    if tensor is None or tensor.numel() != 2 * dim:
        raise CheckpointError(f"{path}: expected a 'spk_stat' tensor of {2 * dim} values (std then mean)")
    std, mean = tensor.float().flatten().numpy().reshape(2, dim)
    return std.copy(), mean.copy()


def load_chattts(model_dir: str | Path, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> ChatTTSModel:
    """Build the modules from the checkpoint's sizes and load every state dict, checked."""
    root = Path(model_dir)
    sizes = load_model_sizes(root)
    tokenizer = PromptTokenizer(root / layout.TOKENIZER_DIR)
    if tokenizer.vocab_size > sizes.gpt.num_text_tokens:
        raise CheckpointError(f"tokenizer has {tokenizer.vocab_size} tokens but the text embedding only "
                              f"{sizes.gpt.num_text_tokens}")

    gpt = ChatTTSGPT(sizes.gpt, dtype=torch.float32)
    load_into(gpt.embed, read_safetensors(root / layout.EMBED_WEIGHTS), root, layout.EMBED_WEIGHTS)
    body_state = read_safetensors(root / layout.GPT_WEIGHTS)
    quant = gpt_quantization(root)
    if quant is not None:
        from chattts_runtime.quantize import dequantize_awq_state  # noqa: PLC0415

        body_state = dequantize_awq_state(body_state, quant)
    load_into(gpt.llama, body_state, root, layout.GPT_WEIGHTS)
    gpt.embed.fuse_weight_norm()

    dvae = MelDecoder(sizes.dvae_decoder, sizes.n_mels, sizes.fsq)
    load_into(dvae, read_safetensors(root / layout.DVAE_WEIGHTS), root, layout.DVAE_WEIGHTS)
    decoder = None
    if (root / layout.DECODER_WEIGHTS).exists():
        decoder = MelDecoder(sizes.decoder, sizes.n_mels, None)
        load_into(decoder, read_safetensors(root / layout.DECODER_WEIGHTS), root, layout.DECODER_WEIGHTS)
    vocos = Vocos(sizes.vocos)
    load_into(vocos, read_safetensors(root / layout.VOCOS_WEIGHTS), root, layout.VOCOS_WEIGHTS)

    std, mean = _speaker_stats(root, sizes.gpt.hidden_size)
    dev = torch.device(device)
    # The GPT runs in `dtype`; embeddings/heads, DVAE and vocoder stay float32 (small, and
    # the heads' argmax must not depend on the GPT's precision more than necessary).
    gpt.llama.to(device=dev, dtype=dtype)
    gpt.embed.to(device=dev)
    for module in (gpt, dvae, vocos) + ((decoder,) if decoder is not None else ()):
        module.to(dev).eval().requires_grad_(False)
    return ChatTTSModel(sizes, gpt, dvae, decoder, vocos, tokenizer, std, mean, quant)
