"""Sizes of the ChatTTS modules and where a checkpoint keeps them.

The official 2Noise/ChatTTS checkpoint (``asset/`` directory) stores the GPT as a
Hugging Face ``LlamaModel`` folder (``asset/gpt/config.json`` + ``model.safetensors``)
and every other module as a bare safetensors state dict whose sizes are fixed in the
reference code, not in a file. We therefore take the official sizes as defaults and
read two optional overrides:

* ``asset/gpt/config.json``: the Llama body (always present in a real checkpoint);
* ``chattts_runtime.json`` at the checkpoint root: sizes of the embeddings, DVAE,
  decoder and vocoder, written by our tiny-checkpoint factory (absent in the official
  checkpoint, where the defaults below apply).

Pure Python: importing this module does not import torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# Paths inside a checkpoint directory, as in the official layout.
GPT_DIR = "asset/gpt"
GPT_CONFIG = "asset/gpt/config.json"
GPT_WEIGHTS = "asset/gpt/model.safetensors"
EMBED_WEIGHTS = "asset/Embed.safetensors"
DVAE_WEIGHTS = "asset/DVAE.safetensors"
DECODER_WEIGHTS = "asset/Decoder.safetensors"
VOCOS_WEIGHTS = "asset/Vocos.safetensors"
TOKENIZER_DIR = "asset/tokenizer"
# Speaker statistics (std then mean, 2 * hidden floats): the older official layout's torch file,
# or a safetensors file ('spk_stat'), which our random checkpoints write. The current official
# layout has neither (see model/speaker.py for where they come from then).
SPEAKER_STATS_PT = "asset/spk_stat.pt"
SPEAKER_STATS = "asset/spk_stat.safetensors"
SPEAKER_STAT_FILES = (SPEAKER_STATS_PT, SPEAKER_STATS)
RUNTIME_SIZES = "chattts_runtime.json"

SAMPLE_RATE = 24_000


class CheckpointError(ValueError):
    """The model directory is missing a file or holds tensors of the wrong shape."""


@dataclass(frozen=True)
class ConvStackSizes:
    """One ConvNeXt stack of the DVAE or the decoder (``DVAEDecoder`` in the reference)."""

    idim: int
    odim: int
    hidden: int
    n_layer: int
    bn_dim: int
    kernel: int = 7
    dilation: int = 2


@dataclass(frozen=True)
class FSQSizes:
    """Grouped residual finite-scalar quantiser of the DVAE."""

    dim: int = 1024
    levels: tuple[int, ...] = (5, 5, 5, 5)
    groups: int = 2
    residuals: int = 2


@dataclass(frozen=True)
class VocosSizes:
    input_channels: int = 100
    dim: int = 512
    intermediate_dim: int = 1536
    num_layers: int = 8
    n_fft: int = 1024
    hop_length: int = 256


@dataclass(frozen=True)
class GPTSizes:
    """The Llama body and the token spaces around it."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    num_hidden_layers: int = 20
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    num_audio_tokens: int = 626
    num_text_tokens: int = 21178
    num_vq: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def audio_eos(self) -> int:
        """The last code of each codebook ends the utterance."""
        return self.num_audio_tokens - 1


@dataclass(frozen=True)
class ModelSizes:
    gpt: GPTSizes = field(default_factory=GPTSizes)
    decoder: ConvStackSizes = field(
        default_factory=lambda: ConvStackSizes(idim=384, odim=384, hidden=512, n_layer=12, bn_dim=128))
    dvae_decoder: ConvStackSizes = field(
        default_factory=lambda: ConvStackSizes(idim=512, odim=512, hidden=256, n_layer=12, bn_dim=128))
    # The DVAE's encoder half (reference audio -> codes, for a voice from a sample).
    dvae_encoder: ConvStackSizes = field(
        default_factory=lambda: ConvStackSizes(idim=512, odim=1024, hidden=256, n_layer=12, bn_dim=128))
    fsq: FSQSizes = field(default_factory=FSQSizes)
    vocos: VocosSizes = field(default_factory=VocosSizes)
    n_mels: int = 100

    @property
    def samples_per_frame(self) -> int:
        """Audio samples per GPT frame: each frame becomes 2 mel frames of ``hop_length``."""
        return 2 * self.vocos.hop_length


def _only_known(cls: type, data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: expected a mapping")
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise CheckpointError(f"{where}: unknown keys {unknown}")
    return dict(data)


def _build_sizes(data: dict[str, Any], where: str) -> ModelSizes:
    top = _only_known(ModelSizes, data, where)
    kwargs: dict[str, Any] = {}
    if "gpt" in top:
        kwargs["gpt"] = GPTSizes(**_only_known(GPTSizes, top["gpt"], f"{where}: gpt"))
    for name in ("decoder", "dvae_decoder", "dvae_encoder"):
        if name in top:
            kwargs[name] = ConvStackSizes(**_only_known(ConvStackSizes, top[name], f"{where}: {name}"))
    if "fsq" in top:
        fsq = _only_known(FSQSizes, top["fsq"], f"{where}: fsq")
        if "levels" in fsq:
            fsq["levels"] = tuple(int(v) for v in fsq["levels"])
        kwargs["fsq"] = FSQSizes(**fsq)
    if "vocos" in top:
        kwargs["vocos"] = VocosSizes(**_only_known(VocosSizes, top["vocos"], f"{where}: vocos"))
    if "n_mels" in top:
        kwargs["n_mels"] = int(top["n_mels"])
    return ModelSizes(**kwargs)


# Keys of a Hugging Face Llama config.json that we read; others (architectures, dtype...) are ignored.
_LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "num_hidden_layers", "max_position_embeddings", "rms_norm_eps")


def read_llama_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"missing {path}: not a ChatTTS checkpoint directory") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: invalid JSON: {err}") from None
    out = {k: data[k] for k in _LLAMA_KEYS if k in data}
    if out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = data.get("num_attention_heads", GPTSizes.num_attention_heads)
    theta = data.get("rope_theta")
    if theta is None and isinstance(data.get("rope_parameters"), dict):
        theta = data["rope_parameters"].get("rope_theta")
    if theta is None and isinstance(data.get("rope_scaling"), dict):
        theta = data["rope_scaling"].get("rope_theta")
    if theta is not None:
        out["rope_theta"] = float(theta)
    return out


def load_model_sizes(model_dir: str | Path) -> ModelSizes:
    """Sizes for the checkpoint in ``model_dir`` (official defaults + the two overrides)."""
    root = Path(model_dir)
    if not root.is_dir():
        raise CheckpointError(f"model directory {root} does not exist")
    extra: dict[str, Any] = {}
    sizes_file = root / RUNTIME_SIZES
    if sizes_file.exists():
        try:
            extra = json.loads(sizes_file.read_text())
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{sizes_file}: invalid JSON: {err}") from None
    gpt = dict(extra.pop("gpt", {}))
    gpt.update(read_llama_config(root / GPT_CONFIG))
    extra["gpt"] = gpt
    sizes = _build_sizes(extra, str(sizes_file))
    g = sizes.gpt
    if g.hidden_size % g.num_attention_heads:
        raise CheckpointError(f"{GPT_CONFIG}: hidden_size {g.hidden_size} is not a multiple of "
                              f"num_attention_heads {g.num_attention_heads}")
    if sizes.decoder.idim * 2 != g.hidden_size:
        raise CheckpointError(f"decoder.idim must be half the GPT hidden size ({g.hidden_size // 2}), "
                              f"got {sizes.decoder.idim}")
    if sizes.dvae_decoder.idim * 2 != sizes.fsq.dim:
        raise CheckpointError(f"dvae_decoder.idim must be half of fsq.dim ({sizes.fsq.dim // 2}), "
                              f"got {sizes.dvae_decoder.idim}")
    if sizes.fsq.groups * sizes.fsq.residuals != g.num_vq:
        raise CheckpointError(f"fsq.groups * fsq.residuals must equal num_vq {g.num_vq}")
    codebook = 1
    for level in sizes.fsq.levels:
        codebook *= level
    if codebook != g.num_audio_tokens - 1:
        raise CheckpointError(f"the FSQ codebook has {codebook} codes but num_audio_tokens is "
                              f"{g.num_audio_tokens} (codes + 1 end-of-audio code)")
    return sizes
