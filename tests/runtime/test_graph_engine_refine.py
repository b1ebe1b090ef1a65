"""Refine-text on the graph engine (rows of its slot cache, batched), against the reference refiner.

``engines.refine.TextRefiner.generate`` runs upstream's refine pass one prompt at a time over
the reference KV cache; the graph engine runs the same prompts together in slots of its one
cache, in the same steps as audio rows, padded to the captured shapes (``pad_shapes=True``),
with the same sampling code inside the step.
"""
from __future__ import annotations

import asyncio

import pytest

from chattts_runtime.engines.base import EngineError
from chattts_runtime.engines.graph import GraphEngine
from chattts_runtime.engines.refine import TextRefiner
from chattts_runtime.model.refine import RefineParams, upstream_refine_sampling
from chattts_runtime.engines.base import SamplingParams
from chattts_runtime.engines.reference import ReferenceEngine
from rt_helpers import TEXTS, Recorder, request, run_all

GREEDY = upstream_refine_sampling(temperature=0, max_new_frames=40)


async def _engine_refine(model, prompts, params, stagger=0.0, **engine_kw):
    engine = GraphEngine(model, **{"max_num_seqs": 4, "pad_shapes": True, "prefill_rows": 4, **engine_kw})
    await engine.start()

    async def one(i, prompt):
        await asyncio.sleep(stagger * i)
        return await engine.refine_text(f"refine-{i}", prompt, params[i] if isinstance(params, list) else params)

    try:
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))), engine
    finally:
        await engine.stop()


def _prompts(model, texts, controls=RefineParams()):
    refiner = TextRefiner(model, max_model_len=2048)
    return refiner, [refiner.prompt_ids(t, controls) for t in texts]


@pytest.mark.parametrize("stagger", [0.0, 0.004])
def test_greedy_refine_tokens_equal_the_reference_refiner(tiny_model, stagger):
    """Six prompts of several lengths over 3 slots (slots reused, rows leaving at different
    steps), all at once or joining mid-run: the same ids."""
    refiner, prompts = _prompts(tiny_model, TEXTS[:6], RefineParams(oral=2, break_=4))
    params = [upstream_refine_sampling(temperature=0, max_new_frames=40 - 6 * i) for i in range(6)]
    expected = [refiner.generate(p, q) for p, q in zip(prompts, params)]
    got, engine = asyncio.run(_engine_refine(tiny_model, prompts, params, stagger=stagger, max_num_seqs=3))
    assert got == expected
    assert len({len(p) for p in prompts}) > 1 and len({len(e) for e in expected}) > 3
    assert engine.describe()["max_num_seqs"] == 3


def test_refine_jobs_beyond_refine_rows_wait_for_a_row(tiny_model):
    """At most refine_rows jobs step at once (a mixed step samples the text head for that many rows);
    the others wait, and every job still gets the reference's ids."""
    refiner, prompts = _prompts(tiny_model, TEXTS[:5])
    expected = [refiner.generate(p, GREEDY) for p in prompts]
    got, engine = asyncio.run(_engine_refine(tiny_model, prompts, GREEDY, max_num_seqs=6, refine_rows=2))
    assert got == expected and engine.describe()["refine_rows"] == 2


def test_refine_stops_at_max_model_len_as_the_reference(tiny_model):
    refiner, [prompt] = _prompts(tiny_model, ["a sentence that fills most of a short context"])
    long = upstream_refine_sampling(temperature=0, max_new_frames=384, min_new_frames=1)
    short = TextRefiner(tiny_model, max_model_len=len(prompt) + 7)
    expected = short.generate(prompt, long)
    [got], _ = asyncio.run(_engine_refine(tiny_model, [prompt], long, max_model_len=len(prompt) + 7))
    assert got == expected and len(got) <= 7


def test_sampled_refine_is_reproducible_per_seed_whatever_it_is_batched_with(tiny_model):
    _, prompts = _prompts(tiny_model, TEXTS[:4])
    seeded = upstream_refine_sampling(seed=7, max_new_frames=30)
    together, _ = asyncio.run(_engine_refine(tiny_model, prompts, seeded))
    alone = [asyncio.run(_engine_refine(tiny_model, [p], seeded))[0][0] for p in prompts[:2]]
    assert together[:2] == alone
    other, _ = asyncio.run(_engine_refine(tiny_model, prompts, upstream_refine_sampling(seed=8, max_new_frames=30)))
    assert other != together
    vocab = tiny_model.sizes.gpt.num_text_tokens
    assert all(0 <= t < vocab for ids in together for t in ids)


def test_a_refine_prompt_longer_than_the_context_is_refused(tiny_model):
    _, [prompt] = _prompts(tiny_model, ["x " * 80])

    with pytest.raises(EngineError, match="max_model_len"):
        asyncio.run(_engine_refine(tiny_model, [prompt], GREEDY, max_model_len=len(prompt)))


def test_an_abandoned_refine_frees_its_slot(tiny_model):
    _, prompts = _prompts(tiny_model, TEXTS[:2])
    endless = upstream_refine_sampling(temperature=0, max_new_frames=100_000, min_new_frames=100_000)

    async def scenario():
        engine = GraphEngine(tiny_model, max_num_seqs=1, max_model_len=4096)
        await engine.start()
        try:
            task = asyncio.ensure_future(engine.refine_text("long", prompts[0], endless))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The one slot is free again: the next prompt runs to its end.
            return await asyncio.wait_for(engine.refine_text("next", prompts[1], GREEDY), 60)
        finally:
            await engine.stop()

    refiner, _ = _prompts(tiny_model, [])
    assert asyncio.run(scenario()) == refiner.generate(prompts[1], GREEDY)


def test_refine_rows_and_audio_rows_share_steps_and_both_equal_the_reference(tiny_model):
    """Refine jobs joining while audio requests decode (and audio requests joining while refine jobs
    run): the mixed steps give each kind exactly what it gives alone, and the rows share slots."""
    refiner, prompts = _prompts(tiny_model, TEXTS[:4], RefineParams(oral=2, break_=4))
    refine_params = [upstream_refine_sampling(temperature=0, max_new_frames=30 - 5 * i) for i in range(4)]
    expected_text = [refiner.generate(p, q) for p, q in zip(prompts, refine_params)]
    audio_params = SamplingParams(temperature=0, max_new_frames=24)
    expected_audio, _ = asyncio.run(run_all(ReferenceEngine, tiny_model, TEXTS[:4], audio_params, concurrent=False))

    async def scenario():
        rec = Recorder()
        engine = GraphEngine(tiny_model, max_num_seqs=6, pad_shapes=True, prefill_rows=4, observer=rec)
        await engine.start()

        async def audio(i):
            await asyncio.sleep(0.004 * i)
            frames, reason = [], None
            async for chunk in engine.submit(request(tiny_model, i, TEXTS[i], audio_params)):
                frames.extend(chunk.codes.tolist())
                reason = chunk.finish_reason
            return frames, reason

        async def text(i):
            await asyncio.sleep(0.002 + 0.004 * i)
            return await engine.refine_text(f"refine-{i}", prompts[i], refine_params[i])

        try:
            results = await asyncio.gather(*(audio(i) for i in range(4)), *(text(i) for i in range(4)))
        finally:
            await engine.stop()
        return results[:4], results[4:], rec

    audio_got, text_got, rec = asyncio.run(scenario())
    assert text_got == expected_text
    assert [(f, r) for f, r in audio_got] == [(f, r) for f, _, r in expected_audio]
    assert max(rec.batches) > 4, rec.batches  # audio and refine rows really shared steps (at most 4 of either kind)
