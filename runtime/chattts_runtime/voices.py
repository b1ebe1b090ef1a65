"""``POST /v1/audio/voices``: a reference clip -> upstream's speaker-sample string (``spk_smp``).

Body (JSON, at most ``MAX_BODY_BYTES``): ``{"audio": "<base64 WAV>"}`` with a mono, 24 kHz,
16-bit PCM WAV of 1 to 30 seconds. The DVAE encoder (``model/encoder.py``) turns it into codes;
the answer carries them as the string a speech request sends in ``speaker_sample`` (with the
clip's transcript in ``speaker_sample_text``). Nothing is stored server-side: the string is the voice.
"""
from __future__ import annotations

import base64
import binascii
import io
import wave

import numpy as np

from chattts_runtime.controls import MAX_SAMPLE_SECONDS
from chattts_runtime.model.config import SAMPLE_RATE

MAX_BODY_BYTES = 4 * 1024 * 1024
MIN_SAMPLE_SECONDS = 1.0


class VoiceError(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def clip_from_payload(payload: object) -> np.ndarray:
    """The request body -> float32 samples in [-1, 1), checked."""
    if not isinstance(payload, dict) or not isinstance(payload.get("audio"), str):
        raise VoiceError("audio", "the body must be a JSON object with 'audio': a base64 WAV file")
    try:
        data = base64.b64decode(payload["audio"], validate=True)
    except (binascii.Error, ValueError):
        raise VoiceError("audio", "audio is not valid base64") from None
    try:
        with wave.open(io.BytesIO(data)) as wav:
            channels, width, rate, frames = wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()
            pcm = wav.readframes(frames)
    except (wave.Error, EOFError) as err:
        raise VoiceError("audio", f"audio is not a PCM WAV file ({err})") from None
    if channels != 1 or width != 2 or rate != SAMPLE_RATE:
        raise VoiceError("audio", f"audio must be mono 16-bit PCM at {SAMPLE_RATE} Hz; got {channels} channel(s), "
                                  f"{8 * width}-bit, {rate} Hz")
    seconds = frames / rate
    if not MIN_SAMPLE_SECONDS <= seconds <= MAX_SAMPLE_SECONDS:
        raise VoiceError("audio", f"audio must last {MIN_SAMPLE_SECONDS:g}-{MAX_SAMPLE_SECONDS:g} s; got {seconds:.2f} s")
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def clip_codes(model, samples: np.ndarray) -> np.ndarray:
    """Samples -> the DVAE encoder's codes ``[num_vq, T]`` (upstream's ``sample_audio``; off the event loop)."""
    import torch  # noqa: PLC0415

    with torch.inference_mode():
        return model.encoder(torch.from_numpy(np.ascontiguousarray(samples)).to(model.device)).cpu().numpy()


def encode_clip(model, samples: np.ndarray) -> dict:
    """Samples -> the voice object (runs the encoder: call it off the event loop)."""
    from chattts_runtime.model.encoder import encode_sample_codes  # noqa: PLC0415

    codes = clip_codes(model, samples)
    return {"object": "voice", "speaker_sample": encode_sample_codes(codes), "frames": int(codes.shape[1]),
            "seconds": round(len(samples) / SAMPLE_RATE, 3)}
