"""From GPT frames to a 24 kHz waveform: DVAE (codes) or decoder (hidden states) -> mel -> Vocos.

Parameter names follow the official checkpoint:

* ``asset/DVAE.safetensors``: ``coef`` (100 mel scales), ``decoder.conv_in.{0,2}.*``,
  ``decoder.decoder_block.{i}.{dwconv,norm,pwconv1,pwconv2}.*`` and ``.weight`` (layer
  scale), ``decoder.conv_out.weight``, ``out_conv.weight``, and the quantiser's
  ``vq_layer.quantizer.rvqs.{g}.project_{in,out}.{weight,bias}``. The encoder half
  (``encoder.*``, ``downsample_conv.*``, ``preprocessor_mel.*``) is only needed to clone
  a voice from audio and is skipped on load.
* ``asset/Decoder.safetensors``: the same without the quantiser, fed by GPT hidden states.
* ``asset/Vocos.safetensors``: ``backbone.embed``, ``backbone.norm``,
  ``backbone.convnext.{i}.{dwconv,norm,pwconv1,pwconv2,gamma}``,
  ``backbone.final_layer_norm``, ``head.out``, ``head.istft.window`` (the feature
  extractor's ``feature_extractor.*`` buffers are skipped).

Each GPT frame becomes two mel frames (the 2x interleave below), and each mel frame
``hop_length`` (256) samples, so one frame is 512 samples = 21.3 ms at 24 kHz.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chattts_runtime.model.config import ConvStackSizes, FSQSizes, VocosSizes


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, intermediate_dim: int, kernel: int, dilation: int,
                 scale_name: str = "weight"):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=kernel, padding=dilation * (kernel // 2),
                                dilation=dilation, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        # The DVAE calls the layer scale "weight", Vocos calls it "gamma".
        self._scale_name = scale_name
        self.register_parameter(scale_name, nn.Parameter(torch.full((dim,), 1e-6)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, C, T]
        y = self.dwconv(x).transpose(1, 2)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        y = y * getattr(self, self._scale_name)
        return x + y.transpose(1, 2)


class ConvStack(nn.Module):
    """``DVAEDecoder`` of the reference: conv in, ConvNeXt blocks, 1x1 conv out."""

    def __init__(self, s: ConvStackSizes):
        super().__init__()
        self.conv_in = nn.Sequential(
            nn.Conv1d(s.idim, s.bn_dim, 3, 1, 1), nn.GELU(), nn.Conv1d(s.bn_dim, s.hidden, 3, 1, 1))
        self.decoder_block = nn.ModuleList(
            ConvNeXtBlock(s.hidden, s.hidden * 4, s.kernel, s.dilation) for _ in range(s.n_layer))
        self.conv_out = nn.Conv1d(s.hidden, s.odim, kernel_size=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv_in(x)
        for block in self.decoder_block:
            y = block(y)
        return self.conv_out(y)


class ResidualFSQDecode(nn.Module):
    """Index -> vector half of one group of a residual finite-scalar quantiser."""

    def __init__(self, dim: int, levels: tuple[int, ...], residuals: int):
        super().__init__()
        codebook_dim = len(levels)
        self.project_in = nn.Linear(dim, codebook_dim)  # encoder side; loaded, unused here
        self.project_out = nn.Linear(codebook_dim, dim)
        lv = torch.tensor(levels, dtype=torch.long)
        self.register_buffer("_levels", lv, persistent=False)
        self.register_buffer("_basis", torch.cumprod(torch.tensor((1, *levels[:-1])), 0), persistent=False)
        self.register_buffer(
            "_scales", torch.stack([(lv.float() - 1) ** -r for r in range(residuals)]), persistent=False)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:  # indices [B, T, R]
        digits = (indices.long().unsqueeze(-1) // self._basis) % self._levels  # [B, T, R, D]
        half = (self._levels // 2).float()
        codes = (digits.float() - half) / half * self._scales  # [B, T, R, D]
        return self.project_out(codes.sum(dim=2).to(self.project_out.weight.dtype))


class GroupedFSQDecode(nn.Module):
    def __init__(self, s: FSQSizes):
        super().__init__()
        self.groups, self.residuals = s.groups, s.residuals
        self.rvqs = nn.ModuleList(
            ResidualFSQDecode(s.dim // s.groups, s.levels, s.residuals) for _ in range(s.groups))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, num_vq, T]`` -> features ``[B, dim, T]``."""
        b, _, t = codes.shape
        grouped = codes.transpose(1, 2).reshape(b, t, self.groups, self.residuals)
        out = torch.cat([rvq(grouped[:, :, g]) for g, rvq in enumerate(self.rvqs)], dim=-1)
        return out.transpose(1, 2)


class QuantizerHolder(nn.Module):
    """Keeps the ``vq_layer.quantizer.rvqs`` key path of the official state dict."""

    def __init__(self, s: FSQSizes):
        super().__init__()
        self.quantizer = GroupedFSQDecode(s)


class MelDecoder(nn.Module):
    """The DVAE decode path (``with_quantizer``: input codes) or the Decoder (input hidden states)."""

    def __init__(self, stack: ConvStackSizes, n_mels: int, fsq: FSQSizes | None):
        super().__init__()
        self.register_buffer("coef", torch.ones(1, n_mels, 1))
        self.decoder = ConvStack(stack)
        self.out_conv = nn.Conv1d(stack.odim, n_mels, 3, 1, 1, bias=False)
        self.vq_layer = QuantizerHolder(fsq) if fsq is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """codes ``[B, num_vq, T]`` (DVAE) or hidden ``[B, H, T]`` (decoder) -> mel ``[B, n_mels, 2T]``."""
        feats = self.vq_layer.quantizer(x) if self.vq_layer is not None else x
        feats = feats.to(self.out_conv.weight.dtype)
        b, c, t = feats.shape
        # Channel halves interleave in time: frame i -> mel frames 2i (first half), 2i+1 (second).
        feats = feats.view(b, 2, c // 2, t).permute(0, 2, 3, 1).reshape(b, c // 2, 2 * t)
        return self.out_conv(self.decoder(feats)) * self.coef


class VocosBackbone(nn.Module):
    def __init__(self, s: VocosSizes):
        super().__init__()
        self.embed = nn.Conv1d(s.input_channels, s.dim, kernel_size=7, padding=3)
        self.norm = nn.LayerNorm(s.dim, eps=1e-6)
        self.convnext = nn.ModuleList(
            ConvNeXtBlock(s.dim, s.intermediate_dim, kernel=7, dilation=1, scale_name="gamma")
            for _ in range(s.num_layers))
        self.final_layer_norm = nn.LayerNorm(s.dim, eps=1e-6)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # [B, n_mels, T] -> [B, T, dim]
        x = self.norm(self.embed(mel).transpose(1, 2)).transpose(1, 2)
        for block in self.convnext:
            x = block(x)
        return self.final_layer_norm(x.transpose(1, 2))


class ISTFT(nn.Module):
    """Centred inverse STFT (Hann window, ``win_length == n_fft``), as ``torch.istft`` computes it.

    Written out (inverse real FFT per frame, windowed overlap-add, divided by the summed
    squared window) because ``torch.istft`` checks its window envelope with a host sync,
    which a CUDA graph cannot hold; this version captures, so the graph engine can decode
    audio windows with replayed graphs.
    """

    def __init__(self, n_fft: int, hop_length: int):
        super().__init__()
        self.n_fft, self.hop_length = n_fft, hop_length
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, spec: torch.Tensor) -> torch.Tensor:  # [B, n_fft // 2 + 1, frames] complex
        frames = spec.shape[-1]
        n_fft, hop = self.n_fft, self.hop_length
        length = n_fft + hop * (frames - 1)
        pieces = torch.fft.irfft(spec, n=n_fft, dim=1) * self.window[None, :, None]  # [B, n_fft, frames]
        fold = dict(output_size=(1, length), kernel_size=(1, n_fft), stride=(1, hop))
        signal = F.fold(pieces, **fold)[:, 0, 0]  # overlap-add
        envelope = F.fold((self.window ** 2)[None, :, None].expand(1, n_fft, frames), **fold)[0, 0, 0]
        start, stop = n_fft // 2, length - n_fft // 2  # centred: drop the padding on both sides
        return signal[:, start:stop] / envelope[start:stop]


class ISTFTHead(nn.Module):
    def __init__(self, s: VocosSizes):
        super().__init__()
        self.out = nn.Linear(s.dim, s.n_fft + 2)
        self.istft = ISTFT(s.n_fft, s.hop_length)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, dim] -> [B, samples]
        x = self.out(x).transpose(1, 2).float()
        mag, phase = x.chunk(2, dim=1)
        mag = torch.exp(mag).clip(max=1e2)  # same safeguard as Vocos
        return self.istft(torch.polar(mag, phase))


class Vocos(nn.Module):
    def __init__(self, s: VocosSizes):
        super().__init__()
        self.backbone = VocosBackbone(s)
        self.head = ISTFTHead(s)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(mel.to(self.head.out.weight.dtype)))
