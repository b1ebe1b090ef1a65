"""Sampling equal to upstream's: the same probabilities, and draws equal in distribution.

Upstream side: ``ChatTTS.model.processors.gen_logits`` (repetition penalty, then transformers'
top-p and top-k warpers, each keeping 3) applied as ``GPT.generate`` applies them (logits over
temperature first; the end token blocked after the warpers while ``i < min_new_token``).

Bound on the draws: with ``N`` draws from a distribution on ``K`` tokens, the expected total-
variation distance between the empirical and the true distribution is at most ``sqrt(K / (2 pi N))``
(half the sum of mean absolute deviations ``sqrt(2 p (1-p) / (pi N))``, Cauchy-Schwarz over K), and
TV moves by at most ``1/N`` per draw, so McDiarmid's inequality puts it above that mean plus
``sqrt(ln(1e6) / (2N))`` with probability below 1e-6. At N = 50,000 and K <= 20 the bound is 0.020;
the runtime's sampler before this issue (top-k before top-p, keeping one) was 0.06-0.18 away.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

VOCAB, EOS, NUM_VQ = 626, 625, 4
DRAWS = 50_000  # inverse-CDF draws from the computed probabilities
ENGINE_DRAWS = 2_000  # through sample_tokens, one generator per row (the engines' entry point)

CASES = {
    # name: (SamplingParams kwargs, generated frames so far, codebook heads)
    "code-defaults": (dict(temperature=0.3, top_p=0.7, top_k=20, repetition_penalty=1.05), 12, NUM_VQ),
    "code-hot-wide": (dict(temperature=1.0, top_p=0.95, top_k=50, repetition_penalty=1.3), 30, NUM_VQ),
    "code-per-codebook-temperature": (dict(temperature=(0.2, 0.5, 0.8, 1.1), top_p=0.8, top_k=10,
                                           repetition_penalty=1.05, min_new_frames=40), 5, NUM_VQ),
    "code-top-k-1-keeps-3": (dict(temperature=0.7, top_p=1.0, top_k=1, repetition_penalty=1.0), 0, NUM_VQ),
    "refine-text-defaults": (dict(temperature=0.7, top_p=0.7, top_k=20, repetition_penalty=1.0), 8, 1),
}


def fixed_logits(heads: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(1, heads, VOCAB, generator=g)
    logits[:, :, EOS] = logits.max() + 0.5  # the end token is a strong candidate (min_new_frames matters)
    return logits


def history(frames: int, heads: int, logits: torch.Tensor, seed: int) -> np.ndarray:
    """Frames drawn among each head's best codes, so the penalty hits candidates."""
    rng = np.random.default_rng(seed)
    best = logits[0, :, :EOS].topk(6, dim=-1).indices.numpy()
    return np.stack([best[np.arange(heads), rng.integers(0, 6, heads)] for _ in range(frames)]) \
        if frames else np.zeros((0, heads), np.int64)


def upstream_probs(logits: torch.Tensor, params, hist: np.ndarray) -> torch.Tensor:
    """``[heads, V]`` probabilities as upstream's ``GPT.generate`` computes ``scores``."""
    from ChatTTS.model.processors import gen_logits

    heads = logits.shape[1]
    warpers, processors = gen_logits(num_code=EOS, top_P=params.top_p, top_K=params.top_k or None,
                                     repetition_penalty=params.repetition_penalty)
    rows = logits[0].clone()  # (b n) rows, as generate reshapes them
    tokens = torch.from_numpy(hist.T.copy()).long()  # [heads, generated]: logits_token
    rows /= torch.tensor(params.temperatures(heads))[:, None]
    for proc in (*processors, *warpers):
        rows = proc(tokens, rows)
    if len(hist) < params.min_new_frames:
        rows[:, EOS] = -torch.inf
    return torch.softmax(rows, dim=-1)


@dataclass
class Row:
    params: object
    frames: list
    generator: torch.Generator = field(default_factory=torch.Generator)


def total_variation(draws: np.ndarray, probs: np.ndarray) -> float:
    return 0.5 * float(np.abs(np.bincount(draws, minlength=probs.size) / len(draws) - probs).sum())


def bound(support: int, n: int) -> float:
    return math.sqrt(support / (2 * math.pi * n)) + math.sqrt(math.log(1e6) / (2 * n))


@pytest.mark.parametrize("case", sorted(CASES))
def test_probabilities_and_draws_match_upstream(upstream, case):
    from chattts_runtime.model.sampling import SamplingParams, draw, repetition_counts, sample_tokens, token_probs

    kwargs, generated, heads = CASES[case]
    params = SamplingParams(**kwargs)
    seed = sorted(CASES).index(case)
    logits = fixed_logits(heads, seed)
    hist = history(generated, heads, logits, seed)
    expected = upstream_probs(logits, params, hist)

    # The probabilities themselves (deterministic).
    recent = torch.full((1, params.repetition_window, heads), VOCAB, dtype=torch.long)
    tail = hist[-params.repetition_window:]
    if len(tail) and params.repetition_penalty != 1.0:
        recent[0, -len(tail):] = torch.from_numpy(tail)
    sorted_probs, order = token_probs(
        logits, torch.tensor([params.temperatures(heads)]), torch.tensor([params.repetition_penalty]),
        repetition_counts(recent, VOCAB), torch.tensor([params.top_p]), torch.tensor([params.top_k]),
        torch.tensor([len(hist) < params.min_new_frames]), EOS)
    ours = torch.zeros_like(sorted_probs).scatter_(2, order, sorted_probs)[0]
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)
    assert int((expected > 0).sum(-1).min()) >= 2  # at least 3 kept (2 when the end token is blocked)

    # Draws: many uniforms through the engines' draw, and upstream's multinomial, against the truth.
    uniforms = torch.rand(1, heads, DRAWS, generator=torch.Generator().manual_seed(seed))
    draws = draw(sorted_probs, order, uniforms)[0].numpy()
    upstream_draws = torch.multinomial(expected, DRAWS, replacement=True,
                                       generator=torch.Generator().manual_seed(seed)).numpy()
    # And through sample_tokens (what the engines call), one seeded generator per row.
    rows = [Row(params, list(hist), torch.Generator().manual_seed(10_000 * seed + i)) for i in range(ENGINE_DRAWS)]
    engine_draws = sample_tokens(logits.expand(ENGINE_DRAWS, -1, -1), rows, EOS).numpy()
    for head in range(heads):
        probs = expected[head].numpy().astype(np.float64)
        support = int((probs > 0).sum())
        assert total_variation(draws[head], probs) < bound(support, DRAWS), (case, head)
        assert total_variation(upstream_draws[head], probs) < bound(support, DRAWS), (case, head)  # upstream too
        assert total_variation(engine_draws[:, head], probs) < bound(support, ENGINE_DRAWS), (case, head)
        for sample in (draws[head], engine_draws[:, head]):
            assert set(np.unique(sample)) <= set(np.flatnonzero(probs))  # never a filtered token
