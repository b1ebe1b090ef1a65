"""Randomly initialised ChatTTS checkpoints in the official layout, for tests, benchmarks and demos.

No weights can be downloaded in CI, so tests build a checkpoint here: every file the
official 2Noise/ChatTTS ``asset/`` directory has (GPT folder, Embed, DVAE, Decoder,
Vocos, tokenizer), with random weights, plus ``chattts_runtime.json`` giving the
non-default module sizes. ``make_checkpoint(dir, full_sizes())`` writes the full-size
architecture (~300 M parameters) for GPU benchmarks.

Usage::

    from chattts_runtime.testing import make_tiny_checkpoint
    path = make_tiny_checkpoint(tmp_path / "chattts")          # hidden 64, 2 layers, head_dim 32
    model = chattts_runtime.model.load_chattts(path)
"""
from __future__ import annotations

import json
import math
import re
import string
from dataclasses import asdict, replace
from pathlib import Path

from chattts_runtime.model import config as layout
from chattts_runtime.model.config import ConvStackSizes, FSQSizes, GPTSizes, ModelSizes, VocosSizes
from chattts_runtime.model.prompt import CONTROL_TOKENS

# Characters the tiny tokenizer knows; anything else becomes [UNK].
_CHARS = string.ascii_lowercase + string.digits + ".,!?;:'\"-()" + "你好世界我们是的了在有一个中文语音合成"


def tiny_sizes(hidden_size: int = 64, num_layers: int = 2, num_heads: int = 2,
               intermediate_size: int | None = None) -> ModelSizes:
    """A small model of the same architecture. head_dim = hidden/heads must stay >= 32 (vLLM CPU)."""
    if hidden_size // num_heads < 32:
        raise ValueError("head_dim must be at least 32 (vLLM's CPU attention kernels need it)")
    half = hidden_size // 2
    return ModelSizes(
        gpt=GPTSizes(hidden_size=hidden_size, intermediate_size=intermediate_size or 2 * hidden_size,
                     num_attention_heads=num_heads, num_key_value_heads=num_heads,
                     num_hidden_layers=num_layers, num_text_tokens=tokenizer_vocab_size()),
        decoder=ConvStackSizes(idim=half, odim=half, hidden=32, n_layer=2, bn_dim=16),
        dvae_decoder=ConvStackSizes(idim=32, odim=32, hidden=32, n_layer=2, bn_dim=16),
        dvae_encoder=ConvStackSizes(idim=32, odim=64, hidden=32, n_layer=2, bn_dim=16),
        fsq=FSQSizes(dim=64),
        vocos=VocosSizes(dim=32, intermediate_dim=64, num_layers=2),
    )


def full_sizes() -> ModelSizes:
    """The official architecture (GPT 768 wide, 20 layers, 12 heads; official DVAE/decoder/Vocos)."""
    return ModelSizes()


def _vocab(official_order: bool = False) -> list[str]:
    """The tiny vocabulary. ``official_order``: in the order of the official checkpoint's, as far as upstream's code
    relies on it: the text vocabulary first, then the control tokens, the level tokens (``[break_k]``, ``[laugh_k]``,
    ``[oral_k]``, ``[speed_k]``) last from ``[break_0]`` on, so refine-text's ``ids < [break_0]`` filter keeps the
    text and ``[Stts]``, ``[spk_emb]``, ``[uv_break]``... (refined text can hold them: upstream's issue 459).
    Default: the control tokens right after the specials (every text id above ``[break_0]``)."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    text = list(_CHARS) + [f"##{c}" for c in _CHARS]
    if not official_order:
        return specials + list(CONTROL_TOKENS) + text
    kinds = ("break", "laugh", "oral", "speed")
    levels = sorted((t for t in CONTROL_TOKENS if re.fullmatch(r"\[[a-z]+_\d\]", t)),
                    key=lambda t: kinds.index(t[1:t.index("_")]))
    return specials + text + [t for t in CONTROL_TOKENS if t not in levels] + levels


def tokenizer_vocab_size() -> int:
    return len(_vocab())


def write_tokenizer(out_dir: Path, *, official_order: bool = False) -> None:
    """A WordPiece (BERT) tokenizer over single characters, with ChatTTS's control tokens (``_vocab``'s order)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: PLC0415
    from transformers import BertTokenizerFast  # noqa: PLC0415

    vocab = _vocab(official_order)
    core = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    core.normalizer = normalizers.BertNormalizer(lowercase=True, handle_chinese_chars=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.decoder = decoders.WordPiece()
    tok = BertTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]",
                            cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    # Control tokens are already in the vocabulary; registering them keeps them whole.
    tok.add_special_tokens({"additional_special_tokens": list(CONTROL_TOKENS)})
    if len(tok) != len(vocab):
        raise RuntimeError("control tokens were not all in the vocabulary")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))


def make_checkpoint(out_dir: str | Path, sizes: ModelSizes, *, seed: int = 0, endless: bool = False) -> Path:
    """Write a random checkpoint of ``sizes`` in the official layout; returns ``out_dir``.

    ``endless``: the end-of-audio code always scores 0 while the best other code scores
    above 0, so generation runs to ``max_new_frames`` (benchmarks and tests that need a
    known length); otherwise random weights end whenever the argmax happens to be 625.
    """
    import torch  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415

    from chattts_runtime.model.audio import MelDecoder, Vocos  # noqa: PLC0415
    from chattts_runtime.model.encoder import DVAEEncoder  # noqa: PLC0415
    from chattts_runtime.model.gpt import ChatTTSGPT  # noqa: PLC0415

    root = Path(out_dir)
    (root / layout.GPT_DIR).mkdir(parents=True, exist_ok=True)
    write_tokenizer(root / layout.TOKENIZER_DIR)
    vocab = tokenizer_vocab_size()
    if sizes.gpt.num_text_tokens < vocab:
        sizes = replace(sizes, gpt=replace(sizes.gpt, num_text_tokens=vocab))

    torch.manual_seed(seed)
    g = sizes.gpt
    gpt = ChatTTSGPT(g)
    with torch.no_grad():
        for emb in (*gpt.embed.emb_code, gpt.embed.emb_text):
            emb.weight.normal_(0.0, 0.5)

    def contiguous(state: dict) -> dict:
        return {k: v.detach().contiguous().clone() for k, v in state.items()}

    if endless:
        with torch.no_grad():
            for head in gpt.embed.head_code:
                head.parametrizations.weight.original0[g.audio_eos].zero_()
    save_file(contiguous(gpt.embed.state_dict()), str(root / layout.EMBED_WEIGHTS))
    save_file(contiguous(gpt.llama.state_dict()), str(root / layout.GPT_WEIGHTS))
    llama_config = {
        "architectures": ["LlamaModel"], "model_type": "llama",
        "hidden_size": g.hidden_size, "intermediate_size": g.intermediate_size,
        "num_attention_heads": g.num_attention_heads, "num_key_value_heads": g.num_key_value_heads,
        "num_hidden_layers": g.num_hidden_layers, "max_position_embeddings": g.max_position_embeddings,
        "rms_norm_eps": g.rms_norm_eps, "rope_theta": g.rope_theta, "hidden_act": "silu",
        "vocab_size": g.num_text_tokens, "tie_word_embeddings": False, "torch_dtype": "float32",
        "attention_bias": False, "mlp_bias": False,
    }
    (root / layout.GPT_CONFIG).write_text(json.dumps(llama_config, indent=2))

    dvae = MelDecoder(sizes.dvae_decoder, sizes.n_mels, sizes.fsq)
    decoder = MelDecoder(sizes.decoder, sizes.n_mels, None)
    vocos = Vocos(sizes.vocos)
    with torch.no_grad():
        for module in (dvae, decoder):
            module.coef.uniform_(0.5, 1.5)
            for name, p in module.named_parameters():
                if name.endswith(".weight") and "decoder_block" in name and p.dim() == 1 and "norm" not in name:
                    p.fill_(0.1)  # layer scale: visible but stable residual branches
        for block in vocos.backbone.convnext:
            block.gamma.fill_(0.1)
        vocos.head.out.weight.mul_(0.5)
        vocos.head.out.bias.fill_(-2.0)  # quiet magnitudes: exp(-2) ~ 0.14
    encoder = DVAEEncoder(sizes, dvae)
    with torch.no_grad():
        mel = encoder.preprocessor_mel
        mel.mel_spec.spectrogram.window.copy_(torch.hann_window(sizes.vocos.n_fft))
        mel.mel_spec.mel_scale.fb.copy_(htk_mel_filterbank(sizes.vocos.n_fft // 2 + 1, sizes.n_mels))
        for name, p in encoder.named_parameters():
            if "decoder_block" in name and name.endswith(".weight") and p.dim() == 1 and "norm" not in name:
                p.fill_(0.1)
    save_file({**contiguous(dvae.state_dict()), **contiguous(encoder.state_dict())}, str(root / layout.DVAE_WEIGHTS))
    save_file(contiguous(decoder.state_dict()), str(root / layout.DECODER_WEIGHTS))
    save_file(contiguous(vocos.state_dict()), str(root / layout.VOCOS_WEIGHTS))
    stats = torch.cat([torch.full((g.hidden_size,), 1.0), torch.zeros(g.hidden_size)])
    save_file({"spk_stat": stats}, str(root / layout.SPEAKER_STATS))

    if sizes != ModelSizes():
        extra = asdict(sizes)
        extra["gpt"] = {k: v for k, v in extra["gpt"].items()
                        if k in ("num_audio_tokens", "num_text_tokens", "num_vq")}
        (root / layout.RUNTIME_SIZES).write_text(json.dumps(extra, indent=2, sort_keys=True))
    return root


def htk_mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int = 24_000):
    """Triangular filters on the HTK mel scale, 0 Hz to Nyquist, unnormalised ``[n_freqs, n_mels]``
    (the DVAE encoder's front end; a real checkpoint ships its own)."""
    import torch  # noqa: PLC0415

    freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    mel = torch.linspace(0.0, 2595.0 * math.log10(1.0 + (sample_rate / 2) / 700.0), n_mels + 2)
    points = 700.0 * (10 ** (mel / 2595.0) - 1.0)
    slopes = points[None, :] - freqs[:, None]
    widths = points[1:] - points[:-1]
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    return torch.clamp(torch.minimum(down, up), min=0.0)


def make_tiny_checkpoint(out_dir: str | Path, *, seed: int = 0, endless: bool = False, **size_kwargs) -> Path:
    return make_checkpoint(out_dir, tiny_sizes(**size_kwargs), seed=seed, endless=endless)
