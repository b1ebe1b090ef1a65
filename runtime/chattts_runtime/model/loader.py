"""Load a ChatTTS checkpoint directory (official layout) into :class:`ChatTTSModel`."""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from chattts_runtime.model import config as layout
from chattts_runtime.model.audio import MelDecoder, Vocos
from chattts_runtime.model.awq import dequantize_awq_state, gpt_quantization
from chattts_runtime.model.encoder import DVAEEncoder
from chattts_runtime.model.config import CheckpointError, ModelSizes, load_model_sizes
from chattts_runtime.model.gpt import ChatTTSGPT
from chattts_runtime.model.prompt import PromptTokenizer
from chattts_runtime.model.speaker import (
    VOICE_NAMES, SpeakerError, SpeakerStats, decode_speaker, find_speaker_stats, looks_like_speaker_string,
    missing_stats_message, normalize_speaker, preset_speaker)

log = logging.getLogger(__name__)

ENCODER_PREFIXES = ("encoder.", "downsample_conv.", "preprocessor_mel.")
# Keys present in official files that the serving path does not use.
_SKIPPED_PREFIXES = {
    layout.DVAE_WEIGHTS: ENCODER_PREFIXES,  # loaded into the DVAEEncoder instead (model/encoder.py)
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


@dataclass
class ChatTTSModel:
    sizes: ModelSizes
    gpt: ChatTTSGPT
    dvae: MelDecoder      # codes -> mel
    decoder: MelDecoder | None  # hidden states -> mel (optional path)
    vocos: Vocos
    tokenizer: PromptTokenizer
    speaker_stats: SpeakerStats | None  # None: the checkpoint has none, presets are refused
    quantization: dict | None = None
    root: Path | None = None
    encoder: DVAEEncoder | None = None  # reference clip -> codes (voice from a sample); None if not shipped
    # The audio decoders' float32 matrix products on tensor cores (engine.audio_precision tf32; CUDA only).
    audio_tf32: bool = False
    # A preset's normalised vector, drawn once: the draw and the norm cost a request a quarter of a
    # millisecond of the speech API's event loop, every time, for the same few vectors.
    _presets: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return self.gpt.device

    def speaker_for(self, voice: str) -> torch.Tensor:
        """A preset name or a ChatTTS speaker embedding string -> L2-normalised speaker vector."""
        dim = self.sizes.gpt.hidden_size
        if voice in VOICE_NAMES:
            if self.speaker_stats is None:
                raise SpeakerError(missing_stats_message(self.root or Path("<model dir>")))
            preset = self._presets.get(voice)
            if preset is None:
                preset = self._presets[voice] = normalize_speaker(preset_speaker(voice, self.speaker_stats))
            return torch.from_numpy(preset.copy())  # callers own their tensor
        if looks_like_speaker_string(voice):
            vec = decode_speaker(voice, dim)
        else:
            raise SpeakerError(f"unknown voice {voice[:40]!r}: use one of {', '.join(VOICE_NAMES)} "
                               f"or a ChatTTS speaker embedding string")
        return torch.from_numpy(normalize_speaker(vec))

    @torch.inference_mode()
    def codes_to_audio(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, T, num_vq]`` (long) -> float32 waveform ``[B, T * samples_per_frame]``."""
        with tf32_matmuls(self.audio_tf32):
            mel = self.dvae(codes.to(self.device).transpose(1, 2))
            return self.vocos(mel).float()

    @torch.inference_mode()
    def hidden_to_audio(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.decoder is None:
            raise CheckpointError("this checkpoint has no asset/Decoder.safetensors")
        with tf32_matmuls(self.audio_tf32):
            mel = self.decoder(hidden.to(self.device).transpose(1, 2))
            return self.vocos(mel).float()


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """CUDA float32 matrix products in TF32 inside the block when ``enabled``, as they were after it. The
    switch is torch's process-wide one: an engine decodes audio on one thread, and captures its audio
    graphs inside this block, so the replays keep the kernels chosen here."""
    if not enabled:
        yield
        return
    matmul = torch.backends.cuda.matmul
    # torch >= 2.9 has fp32_precision; reading state set through the other API is then an error.
    name, value = ("fp32_precision", "tf32") if hasattr(matmul, "fp32_precision") else ("allow_tf32", True)
    before = getattr(matmul, name)
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, before)


def strip_model_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``LlamaForCausalLM``-style body (``model.layers...``, maybe ``lm_head``) as the bare
    ``LlamaModel`` keys; upstream's ``LlamaModel.from_pretrained`` accepts both."""
    if not any(k.startswith("model.") for k in state) or any(k.startswith("layers.") for k in state):
        return state
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def load_chattts(model_dir: str | Path, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, audio_tf32: bool = False) -> ChatTTSModel:
    """Build the modules from the checkpoint's sizes and load every state dict, checked. ``audio_tf32``: the
    audio decoders' matrix products in TF32 (``ChatTTSModel.audio_tf32``), on CUDA only."""
    root = Path(model_dir)
    sizes = load_model_sizes(root)
    tokenizer = PromptTokenizer(root / layout.TOKENIZER_DIR)
    if tokenizer.vocab_size > sizes.gpt.num_text_tokens:
        raise CheckpointError(f"tokenizer has {tokenizer.vocab_size} tokens but the text embedding only "
                              f"{sizes.gpt.num_text_tokens}")

    gpt = ChatTTSGPT(sizes.gpt, dtype=torch.float32)
    load_into(gpt.embed, read_safetensors(root / layout.EMBED_WEIGHTS), root, layout.EMBED_WEIGHTS)
    body_state = strip_model_prefix(read_safetensors(root / layout.GPT_WEIGHTS))
    quant = gpt_quantization(root)
    if quant is not None:
        body_state = dequantize_awq_state(body_state, quant)
    load_into(gpt.llama, body_state, root, layout.GPT_WEIGHTS)
    gpt.embed.fuse_weight_norm()

    dvae = MelDecoder(sizes.dvae_decoder, sizes.n_mels, sizes.fsq)
    dvae_state = read_safetensors(root / layout.DVAE_WEIGHTS)
    load_into(dvae, dvae_state, root, layout.DVAE_WEIGHTS)
    encoder = None
    encoder_state = {k: v for k, v in dvae_state.items() if k.startswith(ENCODER_PREFIXES)}
    if encoder_state:
        encoder = DVAEEncoder(sizes, dvae)
        load_into(encoder, encoder_state, root, layout.DVAE_WEIGHTS + " (encoder)")
    decoder = None
    if (root / layout.DECODER_WEIGHTS).exists():
        decoder = MelDecoder(sizes.decoder, sizes.n_mels, None)
        load_into(decoder, read_safetensors(root / layout.DECODER_WEIGHTS), root, layout.DECODER_WEIGHTS)
    vocos = Vocos(sizes.vocos)
    load_into(vocos, read_safetensors(root / layout.VOCOS_WEIGHTS), root, layout.VOCOS_WEIGHTS)

    try:
        speaker_stats = find_speaker_stats(root, sizes.gpt.hidden_size)
    except SpeakerError as err:
        raise CheckpointError(str(err)) from None
    if speaker_stats is None:
        log.warning("%s: no speaker statistics; voice presets will be refused", missing_stats_message(root))
    dev = torch.device(device)
    # The GPT runs in `dtype`; embeddings/heads, DVAE and vocoder stay float32 (small, and
    # the heads' argmax must not depend on the GPT's precision more than necessary).
    gpt.llama.to(device=dev, dtype=dtype)
    gpt.embed.to(device=dev)
    for module in (gpt, dvae, vocos, decoder, encoder):
        if module is not None:
            module.to(dev).eval().requires_grad_(False)
    return ChatTTSModel(sizes, gpt, dvae, decoder, vocos, tokenizer, speaker_stats, quant, root, encoder,
                        audio_tf32=audio_tf32 and dev.type == "cuda")
