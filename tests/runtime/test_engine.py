"""The reference engine: batching does not change greedy output, streaming, queue bound, aborts."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from chattts_runtime.engines.base import EngineError, QueueFull, SamplingParams, SynthesisRequest
from chattts_runtime.engines.reference import ReferenceEngine
from rt_helpers import TEXTS, Recorder, request

async def run_all(model, texts, params, *, concurrent, **engine_kw):
    rec = Recorder()
    engine = ReferenceEngine(model, observer=rec, **engine_kw)
    await engine.start()

    async def one(i, text):
        frames, chunks, reason = [], 0, None
        async for chunk in engine.submit(request(model, i, text, params)):
            chunks += 1
            frames.extend(chunk.codes.tolist())
            reason = chunk.finish_reason
        return frames, chunks, reason

    try:
        if concurrent:
            results = await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
        else:
            results = [await one(i, t) for i, t in enumerate(texts)]
    finally:
        await engine.stop()
    return results, rec


def test_greedy_codes_are_the_same_with_and_without_batching(tiny_model):
    params = SamplingParams(temperature=0, max_new_frames=40)
    alone, rec_alone = asyncio.run(run_all(tiny_model, TEXTS, params, concurrent=False))
    batched, rec_batched = asyncio.run(run_all(tiny_model, TEXTS, params, concurrent=True))
    assert max(rec_alone.batches) == 1
    assert max(rec_batched.batches) >= 4  # the 8 requests really shared steps
    assert len(rec_batched.waits) == len(TEXTS)  # scheduled exactly once each
    for (codes_a, _, reason_a), (codes_b, _, reason_b) in zip(alone, batched):
        assert codes_a == codes_b
        assert reason_a == reason_b
    assert any(len(c) > 1 for c, _, _ in alone)


def test_frames_stream_one_by_one_and_respect_max_new_frames(tiny_model):
    params = SamplingParams(temperature=0.5, seed=3, max_new_frames=12, min_new_frames=12)
    [(frames, chunks, reason)], _ = asyncio.run(run_all(tiny_model, ["streaming test"], params, concurrent=True))
    assert len(frames) == 12 and chunks == 12 and reason == "length"
    assert all(len(f) == 4 and all(0 <= c < 625 for c in f) for f in frames)


def test_seeded_sampling_is_reproducible_across_batches(tiny_model):
    params = SamplingParams(temperature=0.7, seed=11, max_new_frames=20)
    a, _ = asyncio.run(run_all(tiny_model, TEXTS[:3], params, concurrent=True))
    b, _ = asyncio.run(run_all(tiny_model, TEXTS[:3], params, concurrent=False))
    assert [x[0] for x in a] == [x[0] for x in b]


def test_queue_bound_and_max_model_len(tiny_model):
    async def scenario():
        engine = ReferenceEngine(tiny_model, max_num_seqs=1, max_waiting=1, max_model_len=64)
        await engine.start()
        try:
            params = SamplingParams(temperature=0, max_new_frames=30, min_new_frames=30)
            running = engine.submit(request(tiny_model, 0, "running", params))
            first = await running.__anext__()  # admitted: the one batch slot is taken
            waiting = engine.submit(request(tiny_model, 1, "waiting", params))
            assert engine.num_waiting == 1
            with pytest.raises(QueueFull):
                engine.submit(request(tiny_model, 9, "one too many", params))
            with pytest.raises(EngineError, match="max_model_len"):
                engine.submit(request(tiny_model, 10, "x " * 100, params))
            results = [[first] + [c async for c in running], [c async for c in waiting]]
        finally:
            await engine.stop()
        return results

    results = asyncio.run(scenario())
    assert all(r[-1].finished and r[-1].finish_reason == "length" for r in results)
    assert [sum(len(c.codes) for c in r) for r in results] == [30, 30]


def test_abandoned_stream_is_aborted_and_engine_keeps_serving(tiny_model):
    async def scenario():
        engine = ReferenceEngine(tiny_model, max_num_seqs=4)
        await engine.start()
        params = SamplingParams(temperature=0, max_new_frames=200, min_new_frames=200)
        stream = engine.submit(request(tiny_model, 0, "abandon me", params))
        async for _ in stream:
            break
        await stream.aclose()  # client went away
        for _ in range(200):
            if engine.num_running == 0:
                break
            await asyncio.sleep(0.01)
        running_after_abort = engine.num_running
        frames = [c async for c in engine.submit(request(tiny_model, 1, "next", SamplingParams(
            temperature=0, max_new_frames=5)))]
        await engine.stop()
        return running_after_abort, frames

    running, frames = asyncio.run(scenario())
    assert running == 0
    assert frames[-1].finished and sum(len(f.codes) for f in frames) >= 1
    assert np.all(np.concatenate([f.codes for f in frames]) < 625)


def test_sampling_filters():
    """Upstream's order: temperature, penalty, top-p then top-k keeping at least 3, end code blocked last."""
    import torch

    from chattts_runtime.engines.reference import _Sequence
    from chattts_runtime.model.sampling import sample_tokens

    torch.manual_seed(0)
    logits = torch.randn(3, 4, 626)
    eos = 625
    logits[:, :, eos] = 100.0  # the end code dominates

    def seq(**p):
        s = _Sequence(SynthesisRequest("x", (1,), None, SamplingParams(**p)))
        s.generator = torch.Generator().manual_seed(1)
        return s

    # min_new_frames forbids the end code; greedy then takes the best other code
    greedy_blocked = sample_tokens(logits.clone(), [seq(temperature=0, min_new_frames=1)] * 3, eos)
    expected = logits[:, :, :eos].argmax(-1)
    assert torch.equal(greedy_blocked, expected)
    # top_k=1 and a tiny top_p still keep 3 candidates; with the end code among them and blocked
    # after the warpers, the draws fall on the 2 best other codes
    best2 = logits[:, :, :eos].topk(2, dim=-1).indices
    for p in (dict(top_k=1), dict(top_p=1e-6, top_k=0)):
        draws = torch.stack([sample_tokens(logits.clone(), [seq(temperature=1.0, min_new_frames=1, **p)
                                                             for _ in range(3)], eos) for _ in range(20)])
        assert bool((best2 == draws[..., None]).any(-1).all())
    # top_k=20: every sampled code is among each codebook's 20 best
    wide = sample_tokens(logits.clone(), [seq(temperature=1.0, top_k=20, top_p=1.0, min_new_frames=1)
                                          for _ in range(3)], eos)
    best20 = logits[:, :, :eos].topk(20, dim=-1).indices
    assert bool((best20 == wide[..., None]).any(-1).all())


def test_greedy_applies_the_repetition_penalty():
    """temperature 0 = the argmax of upstream's penalized scores (``alpha = penalty ** count`` over the
    last ``repetition_window`` frames), as at any temperature; a penalty of 1 leaves the raw argmax."""
    import torch

    from chattts_runtime.engines.reference import _Sequence
    from chattts_runtime.model.sampling import greedy_tokens, repetition_counts, sample_tokens

    eos = 625
    logits = torch.full((1, 4, 626), -3.0)
    logits[0, :, 7], logits[0, :, 9] = 2.0, 1.95  # 7 best, 9 close behind
    logits[0, 1, 7], logits[0, 1, 9] = -1.0, -1.02  # negative scores are multiplied, not divided

    def seq(frames, **p):
        s = _Sequence(SynthesisRequest("x", (1,), None, SamplingParams(temperature=0, **p)))
        s.frames = [np.full(4, f) for f in frames]
        return s

    assert sample_tokens(logits, [seq([], repetition_penalty=1.05)], eos).tolist() == [[7] * 4]
    # 7 generated once: 2.0 / 1.05 < 1.95 and -1.0 * 1.05 < -1.02, so 9 wins on every codebook
    assert sample_tokens(logits, [seq([7], repetition_penalty=1.05)], eos).tolist() == [[9] * 4]
    assert sample_tokens(logits, [seq([7], repetition_penalty=1.0)], eos).tolist() == [[7] * 4]
    # outside the window the repetition no longer counts
    assert sample_tokens(logits, [seq([7, 1, 1], repetition_penalty=1.05, repetition_window=2)],
                         eos).tolist() == [[7] * 4]
    # the pure helper the graph engine captures, batched: one row penalized, one not, one end-blocked
    recent = torch.tensor([[[7] * 4], [[626] * 4], [[626] * 4]])
    batch = torch.cat([logits, logits, logits.clone().index_fill_(2, torch.tensor([eos]), 5.0)])
    out = greedy_tokens(batch, torch.tensor([1.05, 1.05, 1.05]), repetition_counts(recent, 626),
                        torch.tensor([False, False, True]), eos)
    assert out.tolist() == [[9] * 4, [7] * 4, [7] * 4]
