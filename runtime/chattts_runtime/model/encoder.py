"""The DVAE's encoder half: a reference clip -> audio codes, for a voice from a sample.

Upstream's ``DVAE.sample_audio`` (``mode="encode"``): a log-mel spectrogram (torchaudio's
``MelSpectrogram`` with power 1: centred reflect-padded STFT, Hann window, HTK filterbank; its
window and filterbank are buffers in ``asset/DVAE.safetensors`` and are read from there), divided
by the DVAE's ``coef``, a strided convolution (one code frame per two mel frames), the encoder's
ConvNeXt stack, then the grouped residual FSQ's quantisation as ``vector_quantize_pytorch``
1.14.x computes it (the version the checkpoint was trained with): per group, ``project_in``, a
first ``bound``, then per residual level ``round(bound(residual / scale))`` with
``scale = (level - 1) ** -r``, the index being ``sum(digit * basis)``.

State-dict names follow the official DVAE file: ``preprocessor_mel.mel_spec.spectrogram.window``,
``preprocessor_mel.mel_spec.mel_scale.fb``, ``downsample_conv.{0,2}.*``, ``encoder.*``; the
quantiser's ``project_in`` and ``coef`` are the DVAE decode module's own.

Upstream shares the codes as a string (``Speaker.encode_prompt``): the shape as two little-endian
uint16, then the codes as little-endian uint16, raw LZMA2 (preset 9 | extreme), in base16384.
"""
from __future__ import annotations

import lzma

import numpy as np
import torch
from torch import nn

from chattts_runtime.model.audio import ConvStack, MelDecoder
from chattts_runtime.model.config import ModelSizes
from chattts_runtime.model.speaker import SpeakerError, b16384_decode, b16384_encode

_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
FSQ_BOUND_EPS = 1e-3


class _Buffers(nn.Module):
    def __init__(self, **shapes):
        super().__init__()
        for name, shape in shapes.items():
            self.register_buffer(name, torch.zeros(shape))


class _MelSpec(nn.Module):
    def __init__(self, n_fft: int, n_mels: int):
        super().__init__()
        self.spectrogram = _Buffers(window=(n_fft,))
        self.mel_scale = _Buffers(fb=(n_fft // 2 + 1, n_mels))


class _MelFeatures(nn.Module):
    def __init__(self, n_fft: int, hop_length: int, n_mels: int):
        super().__init__()
        self.n_fft, self.hop_length = n_fft, hop_length
        self.mel_spec = _MelSpec(n_fft, n_mels)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:  # [samples] -> log-mel [n_mels, frames]
        window = self.mel_spec.spectrogram.window
        spec = torch.stft(wav, self.n_fft, self.hop_length, self.n_fft, window, center=True, pad_mode="reflect",
                          normalized=False, onesided=True, return_complex=True).abs()
        mel = (spec.transpose(-1, -2) @ self.mel_spec.mel_scale.fb).transpose(-1, -2)
        return torch.log(torch.clip(mel, min=1e-5))


class DVAEEncoder(nn.Module):
    def __init__(self, sizes: ModelSizes, dvae: MelDecoder):
        super().__init__()
        s = sizes.dvae_encoder
        self.preprocessor_mel = _MelFeatures(sizes.vocos.n_fft, sizes.vocos.hop_length, sizes.n_mels)
        self.downsample_conv = nn.Sequential(nn.Conv1d(sizes.n_mels, s.idim, 3, 1, 1), nn.GELU(),
                                             nn.Conv1d(s.idim, s.idim, 4, 2, 1), nn.GELU())
        self.encoder = ConvStack(s)
        self._dvae = [dvae]  # not a submodule: its weights load (and are named) in the DVAE

    @property
    def samples_per_frame(self) -> int:
        return 2 * self.preprocessor_mel.hop_length

    @torch.inference_mode()
    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """24 kHz mono float samples ``[S]`` -> codes ``[num_vq, T]`` (int64)."""
        dvae = self._dvae[0]
        mel = self.preprocessor_mel(wav.float())
        x = self.downsample_conv(mel / dvae.coef.view(-1, 1))[None]
        feats = self.encoder(x)[0].transpose(0, 1)  # [T, fsq dim]
        quantizer = dvae.vq_layer.quantizer
        groups = feats.chunk(quantizer.groups, dim=-1)
        codes = [fsq_indices(rvq.project_in(g), rvq._levels, quantizer.residuals)
                 for rvq, g in zip(quantizer.rvqs, groups)]  # each [T, R]
        return torch.cat(codes, dim=-1).transpose(0, 1).long()  # [G * R, T], index g * R + r


def _bound(z: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    half = (levels - 1) * (1 + FSQ_BOUND_EPS) / 2
    offset = torch.where(levels % 2 == 0, 0.5, 0.0)
    shift = (offset / half).atanh()
    return (z + shift).tanh() * half - offset


def fsq_indices(z: torch.Tensor, levels: torch.Tensor, residuals: int) -> torch.Tensor:
    """Residual FSQ of ``z [T, D]`` -> indices ``[T, residuals]`` (vector_quantize_pytorch 1.14.x)."""
    half_width = levels // 2
    basis = torch.cumprod(torch.cat((torch.ones(1, dtype=levels.dtype, device=levels.device), levels[:-1])), 0)
    residual = _bound(z, levels)
    out = []
    for r in range(residuals):
        scale = (levels.float() - 1) ** -r
        normalized = _bound(residual / scale, levels).round() / half_width
        residual = residual - normalized * scale
        out.append(((normalized * half_width + half_width) * basis).sum(dim=-1).to(torch.int32))
    return torch.stack(out, dim=-1)


def encode_sample_codes(codes: np.ndarray) -> str:
    """Codes ``[num_vq, T]`` -> upstream's ``spk_smp`` string."""
    arr = np.asarray(codes).astype("<u2")
    return b16384_encode(np.array(arr.shape, dtype="<u2").tobytes()
                         + lzma.compress(arr.tobytes(), format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS))


def decode_sample_codes(text: str, num_vq: int, num_codes: int, max_frames: int) -> np.ndarray:
    """Upstream's ``spk_smp`` string -> codes ``[num_vq, T]`` int64, checked."""
    raw = b16384_decode(text)
    if len(raw) < 4:
        raise SpeakerError("speaker_sample is too short to hold a shape")
    rows, frames = (int(v) for v in np.frombuffer(raw[:4], dtype="<u2"))
    if rows != num_vq or not 1 <= frames <= max_frames:
        raise SpeakerError(f"speaker_sample holds a {rows} x {frames} code grid; the model needs {num_vq} rows "
                           f"and 1-{max_frames} frames")
    try:
        body = lzma.decompress(raw[4:], format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    except lzma.LZMAError:
        raise SpeakerError("speaker_sample does not decompress") from None
    if len(body) != 2 * rows * frames:
        raise SpeakerError("speaker_sample's codes do not match its shape")
    codes = np.frombuffer(body, dtype="<u2").astype(np.int64).reshape(rows, frames)
    if int(codes.max()) >= num_codes:
        raise SpeakerError(f"speaker_sample holds codes >= {num_codes}")
    return codes
