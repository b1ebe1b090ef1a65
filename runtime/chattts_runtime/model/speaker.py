"""Speaker embeddings: the ChatTTS string form and the named voice presets.

ChatTTS shares a voice as a string: the float16 speaker vector (``hidden_size`` values),
compressed with raw LZMA2 (preset 9 | extreme) and written in base16384 (each 7 bytes ->
four characters U+4E00 + 14 bits; a trailing U+3D00 + n marks n leftover bytes).
Named presets (OpenAI's voice names) are drawn deterministically from the checkpoint's
speaker statistics (``asset/spk_stat.safetensors``: std then mean), or from a unit
normal when the checkpoint carries none.
"""
from __future__ import annotations

import hashlib
import lzma

import numpy as np

PRESET_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                 "shimmer", "verse")

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


def preset_speaker(name: str, std: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Deterministic draw for a preset name (the same vector on every replica)."""
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(std.shape[0]).astype(np.float32) * std + mean).astype(np.float32)
