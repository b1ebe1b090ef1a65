"""Token sampling as upstream ChatTTS does it, shared by every engine.

Upstream (``chattts`` 0.2.5, ``GPT.generate`` with the processors of ``gen_logits``) turns a
step's logits into a token, per row (a request's codebook, or its text head), in this order:

1. divide by the temperature (a per-codebook list is allowed for codes);
2. repetition penalty over the row's last 16 *generated* tokens: ``alpha = penalty ** count``,
   negative scores multiplied by ``alpha``, positive ones divided (no penalty when it is 1);
3. top-p as transformers' ``TopPLogitsWarper(top_p, min_tokens_to_keep=3)``: ascending sort,
   drop the tokens whose cumulative probability is ``<= 1 - top_p``, keep the best 3 anyway;
4. top-k as ``TopKLogitsWarper(top_k, min_tokens_to_keep=3)``: keep scores ``>=`` the
   ``max(top_k, 3)``-th best (ties kept);
5. while fewer than ``min_new`` tokens were generated, the end token's score becomes ``-inf``
   (after the warpers, so the survivors are renormalised);
6. softmax and one draw.

A frame ends when any codebook draws the end code; that frame is not part of the output.
Upstream's ``ensure_non_empty`` (regenerate when the first step ends at once) samples the
first frame from the same distribution as blocking the end code at step 0, which is what
``min_new_frames=1`` does here.

Greedy (``temperature == 0``, not an upstream mode: its ``logits / 0`` gives no distribution) is
what upstream's steps leave as the most probable token: the argmax after steps 2 and 5
(:func:`greedy_tokens`); dividing by a temperature and the warpers never move the argmax, so the
repetition penalty is the one step that changes it, as it does at any temperature.

The draw is an inverse-CDF lookup of one uniform per row in the sorted probabilities, so the
uniforms can come from a ``torch.Generator`` (reference engine, vLLM plugin) or from a
counter-based hash inside a CUDA graph (graph engine): the distribution is the same, the
random stream is not upstream's (``torch.multinomial`` reseeded with ``manual_seed`` every step).

Everything in :func:`token_probs` and :func:`draw` is fixed-shape tensor arithmetic without
host synchronisation, so the graph engine captures it as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

MIN_TOKENS_TO_KEEP = 3  # upstream's min_tokens_to_keep for both warpers
UPSTREAM_REPETITION_WINDOW = 16  # upstream's past_window


@dataclass(frozen=True)
class SamplingParams:
    """Sampling of one request. ``temperature == 0`` means greedy (deterministic).

    ``temperature`` is one value or one per codebook (upstream accepts a list of ``num_vq``).
    ``top_k == 0`` turns top-k off; ``top_p == 1`` turns top-p off.
    """

    temperature: float | tuple[float, ...] = 0.3
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.05
    repetition_window: int = UPSTREAM_REPETITION_WINDOW
    max_new_frames: int = 2048
    min_new_frames: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.temperature, list):  # from JSON/msgpack
            object.__setattr__(self, "temperature", tuple(self.temperature))
        temps = self.temperature if isinstance(self.temperature, tuple) else (self.temperature,)
        if not temps or any(t < 0 for t in temps):
            raise ValueError("temperature must be >= 0")
        if len(temps) > 1 and 0 in temps and any(t > 0 for t in temps):
            raise ValueError("per-codebook temperatures must be all 0 (greedy) or all > 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.repetition_window < 1:
            raise ValueError("repetition_window must be >= 1")
        if self.max_new_frames < 1:
            raise ValueError("max_new_frames must be >= 1")
        if not 0 <= self.min_new_frames <= self.max_new_frames:
            raise ValueError("min_new_frames must be in [0, max_new_frames]")

    @property
    def greedy(self) -> bool:
        temps = self.temperature if isinstance(self.temperature, tuple) else (self.temperature,)
        return all(t == 0 for t in temps)

    def temperatures(self, heads: int) -> tuple[float, ...]:
        """One temperature per head (codebook); a single value applies to all."""
        if not isinstance(self.temperature, tuple):
            return (float(self.temperature),) * heads
        if len(self.temperature) == 1:
            return (float(self.temperature[0]),) * heads
        if len(self.temperature) != heads:
            raise ValueError(f"{len(self.temperature)} temperatures given for {heads} codebooks")
        return tuple(float(t) for t in self.temperature)

    @property
    def uniform_temperature(self) -> float | None:
        """The one temperature of every codebook, or None when they differ."""
        temps = set(self.temperature) if isinstance(self.temperature, tuple) else {self.temperature}
        return float(temps.pop()) if len(temps) == 1 else None


def effective_top_k(top_k: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[B]`` requested top-k (0 = off) -> the number upstream keeps: ``max(k, 3)``, at most ``vocab``."""
    return torch.where(top_k > 0, top_k.clamp(min=MIN_TOKENS_TO_KEEP), vocab).clamp(max=vocab)


def repetition_counts(recent: torch.Tensor, vocab: int) -> torch.Tensor:
    """``recent [B, W, Q]`` token ids (``vocab`` = empty slot) -> counts ``[B, Q, vocab]``."""
    b, w, q = recent.shape
    counts = torch.zeros(b, q, vocab + 1, device=recent.device)
    counts.scatter_add_(2, recent.transpose(1, 2), torch.ones(b, q, w, device=recent.device))
    return counts[:, :, :vocab]


def block_end(logits: torch.Tensor, blocked: torch.Tensor, end: int) -> torch.Tensor:
    """``logits [B, Q, V]`` with the end token at ``-inf`` in the rows where ``blocked [B]``."""
    column = torch.arange(logits.shape[-1], device=logits.device) == end
    return logits.masked_fill(blocked[:, None, None] & column, -torch.inf)


def penalize(scores: torch.Tensor, penalty: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Upstream's repetition penalty: ``alpha = penalty ** count``; negative scores times ``alpha``, others over it.

    scores, counts ``[B, Q, V]``; penalty ``[B]``."""
    alpha = torch.pow(penalty[:, None, None], counts)
    return torch.where(scores < 0, scores * alpha, scores / alpha)


def greedy_tokens(logits: torch.Tensor, penalty: torch.Tensor, counts: torch.Tensor, blocked: torch.Tensor,
                  end: int) -> torch.Tensor:
    """``temperature == 0``: the argmax of the penalized scores (end token blocked where ``blocked``) -> ``[B, Q]``.

    Arguments as :func:`token_probs`'. Fixed-shape, no host synchronisation (the graph engine captures it)."""
    return block_end(penalize(logits, penalty, counts), blocked, end).argmax(dim=-1)


def token_probs(logits: torch.Tensor, temperature: torch.Tensor, penalty: torch.Tensor,
                counts: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor, blocked: torch.Tensor,
                end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's steps 1-6 before the draw (see the module docstring).

    logits ``[B, Q, V]`` float32; temperature ``[B, Q]`` (> 0); penalty, top_p ``[B]`` float;
    counts ``[B, Q, V]`` (the window's occurrences of each token); top_k ``[B]`` long (0 = off);
    blocked ``[B]`` bool (end token forbidden). Returns the probabilities in ascending score
    order and that order, both ``[B, Q, V]``.
    """
    b, q, v = logits.shape
    scores = penalize(logits / temperature[:, :, None], penalty, counts)
    ascending, order = torch.sort(scores, dim=-1)
    position = torch.arange(v, device=logits.device)
    # top-p: drop the low tail holding at most 1 - top_p of the mass; the best 3 always stay.
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop = (cumulative <= (1 - top_p)[:, None, None]) & (position < v - MIN_TOKENS_TO_KEEP)
    ascending = ascending.masked_fill(drop, -torch.inf)
    # top-k over what top-p left: below the k-th best goes (ties with it stay).
    kth = ascending.gather(2, (v - effective_top_k(top_k, v))[:, None, None].expand(b, q, 1))
    ascending = ascending.masked_fill(ascending < kth, -torch.inf)
    ascending = ascending.masked_fill(blocked[:, None, None] & (order == end), -torch.inf)
    return ascending.softmax(dim=-1), order


def draw(probs: torch.Tensor, order: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: ``uniforms [B, Q]`` (or ``[B, Q, N]``: N draws each) in [0, 1) -> tokens of that shape.

    ``right=True`` never lands on a zero-probability token; a uniform above the float sum
    falls on the last (most probable) one.
    """
    many = uniforms.dim() == 3
    cdf = probs.cumsum(dim=-1)
    values = (uniforms if many else uniforms[:, :, None]).to(cdf.dtype).contiguous()
    tokens = order.gather(2, torch.searchsorted(cdf, values, right=True).clamp_(max=probs.shape[-1] - 1))
    return tokens if many else tokens.squeeze(-1)


class SamplingRow(Protocol):
    """What :func:`sample_tokens` reads of a request: its params, its tokens so far, its generator."""

    @property
    def params(self) -> SamplingParams: ...

    frames: list  # generated tokens so far, each ``[Q]`` ints
    generator: torch.Generator | None


def sample_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow], end: int) -> torch.Tensor:
    """``logits [B, Q, V]`` float32 -> tokens ``[B, Q]``, each row with its own params.

    Row-wise operations only, so a row's result does not depend on the batch. Greedy rows take
    :func:`greedy_tokens` (repetition penalty included); sampled rows draw their uniforms from
    their own generator (seeded requests reproduce).
    """
    params = [r.params for r in rows]
    dev = logits.device
    b, q, v = logits.shape
    blocked = torch.tensor([len(r.frames) < p.min_new_frames for r, p in zip(rows, params)], device=dev)
    window = max(p.repetition_window for p in params)
    recent = torch.full((b, window, q), v, dtype=torch.long)  # v = "no token"
    for i, (row, p) in enumerate(zip(rows, params)):
        frames = row.frames[-p.repetition_window:] if p.repetition_penalty != 1.0 else ()
        if len(frames):
            recent[i, window - len(frames):] = torch.from_numpy(np.asarray(np.stack(frames), np.int64).reshape(-1, q))
    counts = repetition_counts(recent.to(dev), v)
    penalty = torch.tensor([p.repetition_penalty for p in params], device=dev)
    out = greedy_tokens(logits, penalty, counts, blocked, end)
    picked = [i for i, p in enumerate(params) if not p.greedy]
    if not picked:
        return out
    ps = [params[i] for i in picked]
    probs, order = token_probs(
        logits[picked], torch.tensor([p.temperatures(q) for p in ps], device=dev), penalty[picked], counts[picked],
        torch.tensor([p.top_p for p in ps], device=dev), torch.tensor([p.top_k for p in ps], device=dev),
        blocked[picked], end)
    uniforms = torch.stack([torch.rand(q, generator=rows[i].generator) for i in picked]).to(dev)
    out[picked] = draw(probs, order, uniforms)
    return out


def new_generator(params: SamplingParams) -> torch.Generator | None:
    """A CPU generator for a sampled request: seeded by ``params.seed``, else from the OS."""
    if params.greedy:
        return None
    generator = torch.Generator(device="cpu")
    generator.manual_seed(params.seed if params.seed is not None
                          else int(np.random.SeedSequence().entropy % (2**63)))
    return generator
