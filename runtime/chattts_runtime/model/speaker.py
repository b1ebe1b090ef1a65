"""Speaker embeddings: the ChatTTS string form and the named voice presets.

ChatTTS shares a voice as a string: the float16 speaker vector (``hidden_size`` values),
compressed with raw LZMA2 (preset 9 | extreme) and written in base16384 (each 7 bytes ->
four characters U+4E00 + 14 bits; a trailing U+3D00 + n marks n leftover bytes).
Named presets (OpenAI's voice names) are drawn from the speaker statistics (std then
mean, ``2 * hidden`` values) the way upstream's ``Chat.sample_random_speaker`` draws a
speaker: ``randn(hidden, float16) * std + mean`` in float16, here from a generator seeded
by the preset's name, so every replica has the same voices. Where the statistics are
(:func:`find_speaker_stats`): the older official layout ships ``asset/spk_stat.pt``; the
current one ships none (upstream 0.2.x carries them in its own code, ``Config.spk_stat``,
a base16384 string), so they are read from an installed upstream package when there is
one, without importing it. With no statistics, presets are refused (no made-up voices).

Speaker vectors reach the engines L2-normalised in float16, as upstream normalises them.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import lzma
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from chattts_runtime.model.config import SPEAKER_STAT_FILES

if TYPE_CHECKING:
    import torch

PRESET_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                 "shimmer", "verse")
# OpenAI's newer voices: presets drawn the same way (by name), kept apart so the tuple above, which the
# quantizer's calibration cycles through, stays as it was.
NEWER_PRESET_VOICES = ("marin", "cedar")
VOICE_NAMES = PRESET_VOICES + NEWER_PRESET_VOICES

_BASE = 0x4E00
_TAIL = 0x3D00
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


class SpeakerError(ValueError):
    """The voice is neither a preset nor a valid speaker embedding string."""


def b16384_encode(data: bytes) -> str:
    tail = len(data) % 7
    value = int.from_bytes(data, "big") if data else 0
    bits = len(data) * 8
    nchars = (bits + 13) // 14
    value <<= nchars * 14 - bits
    chars = [chr(_BASE + ((value >> (14 * (nchars - 1 - i))) & 0x3FFF)) for i in range(nchars)]
    if tail:
        chars.append(chr(_TAIL + tail))
    return "".join(chars)


def b16384_decode(text: str) -> bytes:
    text = text.strip()
    tail = 0
    if text and _TAIL < ord(text[-1]) <= _TAIL + 6:
        tail = ord(text[-1]) - _TAIL
        text = text[:-1]
    value = 0
    for ch in text:
        code = ord(ch) - _BASE
        if not 0 <= code < 0x4000:
            raise SpeakerError("not a base16384 string")
        value = (value << 14) | code
    full_chars = len(text) - (tail * 8 + 13) // 14
    if full_chars < 0 or full_chars % 4:
        raise SpeakerError("truncated base16384 string")
    nbytes = full_chars // 4 * 7 + tail
    bits = len(text) * 14
    return (value >> (bits - nbytes * 8)).to_bytes(nbytes, "big") if nbytes else b""


def encode_speaker(vector: np.ndarray) -> str:
    raw = np.asarray(vector, dtype=np.float16).tobytes()
    return b16384_encode(lzma.compress(raw, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS))


def decode_speaker(text: str, dim: int) -> np.ndarray:
    want = dim * 2  # float16 values
    # Never inflate past what a real embedding needs: a small LZMA bomb would otherwise fill memory.
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    try:
        raw = decompressor.decompress(b16384_decode(text), max_length=want + 1)
    except lzma.LZMAError:
        raise SpeakerError("speaker embedding string does not decompress") from None
    if len(raw) != want:
        raise SpeakerError(f"speaker embedding decompresses to {'more than ' if len(raw) > want else ''}"
                           f"{min(len(raw), want)} bytes, the model needs {want} ({dim} float16 values)")
    vec = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
    if vec.size != dim:
        raise SpeakerError(f"speaker embedding has {vec.size} values, the model needs {dim}")
    if not np.isfinite(vec).all():
        raise SpeakerError("speaker embedding holds non-finite values")
    return vec


def looks_like_speaker_string(voice: str) -> bool:
    return len(voice) > 16 and all(_BASE <= ord(c) < _BASE + 0x4000 or _TAIL < ord(c) <= _TAIL + 6
                                   for c in voice)


# -- statistics -------------------------------------------------------------------------------

UPSTREAM_CONFIG = "config/config.py"  # inside an installed ChatTTS package


@dataclass(frozen=True)
class SpeakerStats:
    std: "torch.Tensor"   # float16 [hidden]
    mean: "torch.Tensor"  # float16 [hidden]
    source: str


def stats_from_values(values, dim: int, source: str) -> SpeakerStats:
    import torch  # noqa: PLC0415

    flat = torch.as_tensor(values).detach().flatten()
    if flat.numel() != 2 * dim:
        raise SpeakerError(f"{source}: expected {2 * dim} speaker statistics (std then mean), got {flat.numel()}")
    std, mean = flat.to(torch.float16).chunk(2)
    return SpeakerStats(std.clone(), mean.clone(), source)


def upstream_package_stats_string() -> tuple[str, Path] | None:
    """``Config.spk_stat`` of an installed upstream ``chattts`` package, read from its source (not imported)."""
    spec = importlib.util.find_spec("ChatTTS")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / UPSTREAM_CONFIG
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and node.target.id == "spk_stat" and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                return node.value.value, path
    return None


def find_speaker_stats(root: Path, dim: int) -> SpeakerStats | None:
    import torch  # noqa: PLC0415

    for rel in SPEAKER_STAT_FILES:
        path = root / rel
        if not path.exists():
            continue
        if path.suffix == ".pt":
            return stats_from_values(torch.load(path, map_location="cpu", weights_only=True), dim, str(path))
        from safetensors.torch import load_file  # noqa: PLC0415

        tensor = load_file(str(path)).get("spk_stat")
        if tensor is None:
            raise SpeakerError(f"{path}: no 'spk_stat' tensor")
        return stats_from_values(tensor, dim, str(path))
    upstream = upstream_package_stats_string()
    if upstream is not None:
        text, path = upstream
        values = np.frombuffer(b16384_decode(text), dtype=np.float16).copy()
        if values.size == 2 * dim:  # the package's statistics are for the official width only
            return stats_from_values(torch.from_numpy(values), dim, str(path))
    return None


def missing_stats_message(root: Path) -> str:
    files = " or ".join(str(root / rel) for rel in SPEAKER_STAT_FILES)
    return (f"voice presets need the checkpoint's speaker statistics: none found ({files} is missing, and no "
            f"installed chattts package provides them); pass a ChatTTS speaker embedding string as voice")


# -- presets and normalisation ----------------------------------------------------------------

def sample_speaker(stats: SpeakerStats, generator=None) -> "torch.Tensor":
    """Upstream's random speaker: ``randn(hidden)`` in the statistics' float16, times std, plus mean."""
    import torch  # noqa: PLC0415

    return torch.randn(stats.std.shape[0], generator=generator, dtype=stats.std.dtype).mul_(stats.std).add_(stats.mean)


def preset_seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def preset_speaker(name: str, stats: SpeakerStats) -> np.ndarray:
    """Deterministic draw for a preset name (the same vector on every replica), float16 values."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(preset_seed(name))
    return sample_speaker(stats, generator).numpy()


def normalize_speaker(vector: np.ndarray) -> np.ndarray:
    """L2-normalised in float16, as upstream's ``Speaker.apply`` does; float32 out for the engines."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812

    half = torch.from_numpy(np.asarray(vector, dtype=np.float16).copy())
    return F.normalize(half, p=2.0, dim=0, eps=1e-12).float().numpy()
