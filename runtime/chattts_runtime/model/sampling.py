"""ChatTTS code sampling, shared by every engine (and the vLLM plugin): the parameters and
the row-wise sampler."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from chattts_runtime.engines.reference import _Sequence


@dataclass(frozen=True)
class SamplingParams:
    """ChatTTS code sampling. ``temperature == 0`` means greedy (deterministic)."""

    temperature: float = 0.3
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.05
    repetition_window: int = 16
    max_new_frames: int = 2048
    min_new_frames: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.max_new_frames < 1:
            raise ValueError("max_new_frames must be >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0



def sample_codes(logits: torch.Tensor, seqs: list[_Sequence], eos: int) -> torch.Tensor:
    """``logits [B, num_vq, V]`` float32 -> codes ``[B, num_vq]`` following each request's params.

    Row-wise operations only, so a row's result does not depend on the batch. Sampled
    rows draw their uniforms from their own generator (seeded requests reproduce).
    """
    params = [s.request.params for s in seqs]
    counts = [len(s.frames) for s in seqs]
    blocked = [i for i, (p, n) in enumerate(zip(params, counts)) if n < p.min_new_frames]
    if blocked:
        logits = logits.clone()
        logits[blocked, :, eos] = -torch.inf
    out = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    dev = logits.device
    sub = logits[rows]
    b, q, v = sub.shape
    ps = [params[i] for i in rows]
    sub = sub / torch.tensor([p.temperature for p in ps], device=dev)[:, None, None]
    penalties = torch.tensor([p.repetition_penalty for p in ps], device=dev)
    if bool((penalties != 1.0).any()):
        window = max(p.repetition_window for p in ps)
        recent = torch.full((b, window, q), v, dtype=torch.long)  # v = "no code" (padding column)
        for j, i in enumerate(rows):
            frames = seqs[i].frames[-ps[j].repetition_window:]
            if frames:
                recent[j, window - len(frames):] = torch.from_numpy(np.stack(frames))
        freq = torch.zeros(b, q, v + 1, device=dev)
        freq.scatter_add_(2, recent.to(dev).transpose(1, 2), torch.ones(b, q, window, device=dev))
        freq = freq[:, :, :v]
        freq[:, :, eos] = 0  # the end code is never penalised
        alpha = torch.pow(penalties[:, None, None], freq)
        sub = torch.where(sub < 0, sub * alpha, sub / alpha)
    ks = torch.tensor([p.top_k if 0 < p.top_k < v else v for p in ps], device=dev)
    sorted_scores, order = torch.sort(sub, dim=-1, descending=True)
    kth = sorted_scores.gather(2, (ks - 1)[:, None, None].expand(b, q, 1))
    drop_sorted = sorted_scores < kth
    top_p = torch.tensor([p.top_p for p in ps], device=dev)[:, None, None]
    sorted_probs = sorted_scores.masked_fill(drop_sorted, -torch.inf).softmax(dim=-1)
    drop_sorted |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_p  # keep the code that crosses top_p
    probs = sorted_scores.masked_fill(drop_sorted, -torch.inf).softmax(dim=-1)
    uniforms = torch.stack([torch.rand(q, generator=seqs[i].generator) for i in rows]).to(dev)
    pick = torch.searchsorted(probs.cumsum(dim=-1), uniforms[:, :, None]).clamp_(max=v - 1)
    out[rows] = order.gather(2, pick).squeeze(-1)
    return out
