"""The parity tier: upstream ChatTTS (``chattts`` 0.2.5) and the runtime on the same random weights.

``hack/setup-venv.sh`` installs upstream's package and the few modules its model code imports
into ``.venv/parity-site`` (``tests/parity/requirements.txt``); this conftest appends that folder
to ``sys.path`` (lowest priority: nothing the runtime imports resolves there first).

``upstream`` (session) builds upstream's modules (GPT with its Llama body, Embed, DVAE with its
encoder, Decoder, Vocos) with random weights, at a small configuration that upstream's classes
accept, exactly as ``Chat._load`` builds them, saves them in upstream's checkpoint layout, loads
them back through upstream's own ``Chat._load`` and through ``chattts_runtime.model.load_chattts``.
A missing or broken upstream package fails every test here (``pytest.fail``), never skips.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the parity tier needs torch (runtime extra)")

PARITY_SITE = Path(os.environ.get("CHATTTS_PARITY_SITE", Path(sys.prefix) / "parity-site"))
if PARITY_SITE.is_dir() and str(PARITY_SITE) not in sys.path:
    sys.path.append(str(PARITY_SITE))

# The small configuration (upstream's classes take every size from their config; n_mels stays 100).
HIDDEN, HEADS, LAYERS = 128, 4, 2
SPEAKER_STD_SEED = 7


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/parity/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.parity)


def import_upstream():
    """Upstream's package, or a failure that says how to install it."""
    try:
        import ChatTTS  # noqa: PLC0415
        from ChatTTS.model import dvae  # noqa: F401, PLC0415
    except Exception as err:  # noqa: BLE001  (ImportError, or a broken extension)
        pytest.fail(f"upstream ChatTTS is not importable from {PARITY_SITE} ({type(err).__name__}: {err}); "
                    f"run hack/setup-venv.sh (it installs tests/parity/requirements.txt there)", pytrace=False)
    return ChatTTS


def perturb(module, *, scale_1d: float = 0.1, seed: int = 1234) -> None:
    """Random init is near-identity in places (layer scale 1e-6, norms = 1, weight-norm g = |v|):
    perturb every float parameter so that every path and every eps/scale is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not p.is_floating_point():
                continue
            if name.endswith("original0"):  # weight-norm g
                p.mul_(1.0 + 0.3 * torch.rand(p.shape, generator=g))
            elif p.dim() == 1 and ("norm" in name or name.endswith("layernorm.weight")):
                if name.endswith("bias"):
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
                else:
                    p.mul_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1 and (name.endswith(".weight") or name.endswith("gamma")):
                # ConvNeXt layer scales (DVAE "weight", Vocos "gamma"): 1e-6 -> ~0.1
                p.copy_(scale_1d * (1 + 0.3 * torch.randn(p.shape, generator=g)))
            elif name.endswith("bias"):
                p.add_(0.02 * torch.randn(p.shape, generator=g))


def small_config(ChatTTS, text_tokens: int, spk_stat: str):
    """Upstream's ``Config`` with every module shrunk (the classes read all sizes from it)."""
    from ChatTTS.config.config import DVAE, GPT, VQ, BackboneInitArgs, Config, Decoder, Embed  # noqa: PLC0415

    cfg = Config()
    half = HIDDEN // 2
    cfg.gpt = GPT(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_attention_heads=HEADS,
                  num_hidden_layers=LAYERS, num_text_tokens=text_tokens)
    cfg.embed = Embed(hidden_size=HIDDEN, num_text_tokens=text_tokens)
    cfg.decoder = Decoder(idim=half, odim=half, hidden=32, n_layer=2, bn_dim=16)
    cfg.dvae = DVAE(encoder=Decoder(idim=32, odim=64, hidden=32, n_layer=2, bn_dim=16),
                    decoder=Decoder(idim=32, odim=32, hidden=32, n_layer=2, bn_dim=16), vq=VQ(dim=64))
    cfg.vocos.backbone.init_args = BackboneInitArgs(dim=32, intermediate_dim=64, num_layers=2)
    cfg.vocos.head.init_args.dim = 32
    cfg.spk_stat = spk_stat
    return cfg


def runtime_sizes(cfg) -> dict:
    """The same sizes as ``chattts_runtime.json`` (the runtime's override file) spells them."""
    def stack(d):
        return {"idim": d.idim, "odim": d.odim, "hidden": d.hidden, "n_layer": d.n_layer, "bn_dim": d.bn_dim}

    bb = cfg.vocos.backbone.init_args
    return {
        "gpt": {"num_audio_tokens": cfg.gpt.num_audio_tokens, "num_text_tokens": cfg.gpt.num_text_tokens,
                "num_vq": cfg.gpt.num_vq},
        "decoder": stack(cfg.decoder), "dvae_decoder": stack(cfg.dvae.decoder),
        "dvae_encoder": stack(cfg.dvae.encoder),
        "fsq": {"dim": cfg.dvae.vq.dim, "levels": list(cfg.dvae.vq.levels), "groups": cfg.dvae.vq.G,
                "residuals": cfg.dvae.vq.R},
        "vocos": {"input_channels": bb.input_channels, "dim": bb.dim, "intermediate_dim": bb.intermediate_dim,
                  "num_layers": bb.num_layers},
    }


def write_upstream_checkpoint(ChatTTS, cfg, root: Path) -> None:
    """Random modules built as ``Chat._load`` builds them, saved where its loader reads them."""
    from safetensors.torch import save_file  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaModel  # noqa: PLC0415
    from vocos import Vocos  # noqa: PLC0415
    from vocos.pretrained import instantiate_class  # noqa: PLC0415

    from ChatTTS.model import DVAE, Embed  # noqa: PLC0415

    def save(module, name):
        save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(asset / name))

    torch.manual_seed(0)
    asset = root / "asset"
    asset.mkdir(parents=True, exist_ok=True)
    vocos = Vocos(feature_extractor=instantiate_class(args=(), init=asdict(cfg.vocos.feature_extractor)),
                  backbone=instantiate_class(args=(), init=asdict(cfg.vocos.backbone)),
                  head=instantiate_class(args=(), init=asdict(cfg.vocos.head)))
    perturb(vocos)
    with torch.no_grad():  # quiet magnitudes, as a trained head has
        vocos.head.out.weight.mul_(0.5)
        vocos.head.out.bias.add_(-2.0)
    save(vocos, "Vocos.safetensors")
    dvae = DVAE(decoder_config=asdict(cfg.dvae.decoder), encoder_config=asdict(cfg.dvae.encoder),
                vq_config=asdict(cfg.dvae.vq), dim=cfg.dvae.decoder.idim, coef=None)
    perturb(dvae)
    save(dvae, "DVAE.safetensors")
    embed = Embed(cfg.embed.hidden_size, cfg.embed.num_audio_tokens, cfg.embed.num_text_tokens, cfg.embed.num_vq)
    with torch.no_grad():
        for e in (*embed.emb_code, embed.emb_text):
            e.weight.normal_(0.0, 0.5)
    perturb(embed)
    save(embed, "Embed.safetensors")
    llama = LlamaModel(LlamaConfig(**asdict(cfg.gpt)))
    perturb(llama)
    llama.save_pretrained(str(asset / "gpt"), safe_serialization=True)
    decoder = DVAE(decoder_config=asdict(cfg.decoder), dim=cfg.decoder.idim, coef=str(dvae))
    perturb(decoder)
    save(decoder, "Decoder.safetensors")


def speaker_stat_string(dim: int) -> str:
    """Upstream's ``Config.spk_stat`` form (base16384 of float16 std then mean) for random statistics."""
    import numpy as np  # noqa: PLC0415
    import pybase16384 as b14  # noqa: PLC0415

    rng = np.random.default_rng(SPEAKER_STD_SEED)
    stat = np.concatenate([rng.uniform(0.5, 1.5, dim), rng.normal(0.0, 0.3, dim)]).astype(np.float16)
    return b14.encode_to_string(stat.tobytes())


@dataclass
class Upstream:
    """Both sides over one checkpoint directory."""

    root: Path
    chat: object  # upstream's ChatTTS.Chat, loaded by its own _load
    model: object  # chattts_runtime.model.ChatTTSModel
    cfg: object


@pytest.fixture(scope="session")
def upstream(tmp_path_factory) -> Upstream:
    return build_upstream(tmp_path_factory, official_order=False)


@pytest.fixture(scope="session")
def upstream_official_order(tmp_path_factory) -> Upstream:
    """The same, with the tokenizer in the official vocabulary's order (text ids below ``[break_0]``, so
    refine-text's output keeps its text; ``chattts_runtime.testing._vocab``)."""
    return build_upstream(tmp_path_factory, official_order=True)


def build_upstream(tmp_path_factory, *, official_order: bool) -> Upstream:
    ChatTTS = import_upstream()
    from chattts_runtime.model import load_chattts  # noqa: PLC0415
    from chattts_runtime.testing import tokenizer_vocab_size, write_tokenizer  # noqa: PLC0415

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    root = tmp_path_factory.mktemp("upstream-official" if official_order else "upstream") / "chattts"
    cfg = small_config(ChatTTS, tokenizer_vocab_size(), speaker_stat_string(HIDDEN))
    write_upstream_checkpoint(ChatTTS, cfg, root)
    write_tokenizer(root / "asset" / "tokenizer", official_order=official_order)
    (root / "chattts_runtime.json").write_text(json.dumps(runtime_sizes(cfg), indent=2))

    chat = ChatTTS.Chat()
    chat.config = cfg
    paths = {k: str(root / v) for k, v in asdict(cfg.path).items()}
    assert chat._load(device=torch.device("cpu"), **paths), "upstream's loader refused the checkpoint"
    model = load_chattts(root)
    return Upstream(root, chat, model, cfg)

