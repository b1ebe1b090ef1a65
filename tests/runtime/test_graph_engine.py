"""The graph engine (static slots, graph-replayed steps) against the reference engine.

On CPU the decode step runs eagerly, but through the same slot cache, bucketing and
in-step sampling code that is captured into CUDA graphs on a GPU.
"""
from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest

from chattts_runtime.engines.base import EngineError, SamplingParams
from chattts_runtime.engines.graph import GraphEngine
from chattts_runtime.engines.graph_steps import MAX_REPETITION_WINDOW, counter_uniforms
from chattts_runtime.engines.slots import bucket_sizes, pick_bucket
from chattts_runtime.engines.reference import ReferenceEngine
from rt_helpers import TEXTS, Recorder, request, run_all

def test_buckets():
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert bucket_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert bucket_sizes(2048, smallest=128) == [128, 256, 512, 1024, 2048]
    assert bucket_sizes(256, step=32) == [1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256]
    assert bucket_sizes(100, step=32) == [1, 2, 4, 8, 16, 32, 64, 96, 100]
    assert pick_bucket([1, 2, 4], 3) == 4 and pick_bucket([1, 2, 4], 1) == 1
    with pytest.raises(ValueError):
        pick_bucket([1, 2, 4], 5)


def test_counter_uniforms_are_uniform_and_a_function_of_seed_and_frame():
    import torch

    seeds = torch.arange(4000) * 7919 - 100
    steps = torch.arange(4000) % 37
    u = counter_uniforms(seeds, steps, 4)
    assert u.shape == (4000, 4) and float(u.min()) >= 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.02 and abs(float(u.var()) - 1 / 12) < 0.01
    assert torch.equal(u[5:9], counter_uniforms(seeds[5:9], steps[5:9], 4))  # batch-independent
    assert not torch.equal(u[:, 0], u[:, 1])  # heads draw differently
    assert not torch.equal(counter_uniforms(seeds, steps + 1, 4), u)


def test_greedy_codes_equal_the_reference_engine(tiny_model):
    """Same codes and finish reasons, token for token, alone or with requests joining mid-run."""
    params = SamplingParams(temperature=0, max_new_frames=40)
    reference, _ = asyncio.run(run_all(ReferenceEngine, tiny_model, TEXTS, params, concurrent=False))
    alone, rec_alone = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS, params, concurrent=False,
                                           max_num_seqs=8))
    joined, rec_joined = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS, params, concurrent=True,
                                             stagger=0.003, max_num_seqs=8))
    assert max(rec_alone.batches) == 1
    assert max(rec_joined.batches) >= 4  # requests really shared steps
    assert len(rec_joined.waits) == len(TEXTS)
    for (ref_codes, _, ref_reason), (a_codes, _, a_reason), (j_codes, _, j_reason) in zip(reference, alone, joined):
        assert a_codes == ref_codes and j_codes == ref_codes
        assert a_reason == ref_reason == j_reason
    assert any(len(c) > 1 for c, _, _ in reference)
    assert any(r == "eos" for _, _, r in reference)


def test_greedy_codes_with_voice_sample_codes_equal_the_reference_engine(tiny_model):
    """A voice sample's codes after the text prompt (upstream's spk_smp; what a long input's first piece
    becomes for the pieces after it) prefill as the reference engine embeds them, beside prompts without."""
    num_vq, codes = tiny_model.sizes.gpt.num_vq, tiny_model.sizes.gpt.num_audio_tokens - 1
    rng = np.random.default_rng(3)
    samples = {i: rng.integers(0, codes, size=(int(rng.integers(5, 40)), num_vq)) for i in (0, 2, 3)}

    def with_sample(model, i, text, params):
        made = request(model, i, text, params)
        made.prompt_codes = samples.get(i)
        return made

    params = SamplingParams(temperature=0, max_new_frames=30)
    reference, _ = asyncio.run(run_all(ReferenceEngine, tiny_model, TEXTS, params, concurrent=False,
                                       make_request=with_sample))
    joined, rec = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS, params, concurrent=True,
                                      make_request=with_sample, max_num_seqs=8, pad_shapes=True))
    assert max(rec.batches) >= 2
    plain, _ = asyncio.run(run_all(ReferenceEngine, tiny_model, TEXTS, params, concurrent=False))
    for i, ((ref, _, ref_reason), (got, _, reason)) in enumerate(zip(reference, joined)):
        assert got == ref and reason == ref_reason, i
    assert all(reference[i][0] != plain[i][0] for i in samples)  # the codes really conditioned them


def test_slots_are_reused_when_requests_outnumber_them(tiny_model):
    params = SamplingParams(temperature=0, max_new_frames=12)
    reference, _ = asyncio.run(run_all(ReferenceEngine, tiny_model, TEXTS, params, concurrent=False))
    few_slots, rec = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS, params, concurrent=True, max_num_seqs=3))
    assert max(rec.batches) <= 3
    assert [r[0] for r in few_slots] == [r[0] for r in reference]


def test_frames_come_in_chunks_and_respect_max_new_frames(tiny_model):
    params = SamplingParams(temperature=0.5, seed=3, max_new_frames=10, min_new_frames=10)
    [(frames, chunks, reason)], _ = asyncio.run(run_all(GraphEngine, tiny_model, ["streaming test"], params,
                                                        concurrent=True, emit_frames=4))
    assert len(frames) == 10 and reason == "length"
    assert chunks == [4, 4, 2]
    assert all(len(f) == 4 and all(0 <= c < 625 for c in f) for f in frames)


def test_seeded_sampling_is_reproducible_across_batches(tiny_model):
    params = SamplingParams(temperature=0.7, seed=11, max_new_frames=20)
    a, _ = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS[:3], params, concurrent=True))
    b, _ = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS[:3], params, concurrent=False))
    assert [x[0] for x in a] == [x[0] for x in b]
    other = SamplingParams(temperature=0.7, seed=12, max_new_frames=20)
    c, _ = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS[:3], other, concurrent=True))
    assert [x[0] for x in c] != [x[0] for x in a]


@pytest.mark.parametrize("penalty", [1.0, 1.05, 1.5])
def test_a_tiny_temperature_is_greedy_with_the_same_penalty(tiny_model, penalty):
    # Greedy is the argmax of what upstream's steps leave, the repetition penalty applied (sample_slots'
    # greedy_tokens); a tiny temperature draws that argmax too. (top_k=1 is not greedy: upstream's
    # warpers keep at least 3 candidates.)
    greedy = SamplingParams(temperature=0, repetition_penalty=penalty, max_new_frames=15)
    top1 = SamplingParams(temperature=1e-4, repetition_penalty=penalty, seed=5, max_new_frames=15)
    a, _ = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS[:4], greedy, concurrent=True))
    b, _ = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS[:4], top1, concurrent=True))
    assert [x[0] for x in a] == [x[0] for x in b]


def test_min_new_frames_blocks_the_end_code(tiny_model):
    params = SamplingParams(temperature=0, max_new_frames=30, min_new_frames=30)
    results, _ = asyncio.run(run_all(GraphEngine, tiny_model, TEXTS, params, concurrent=True))
    assert all(len(f) == 30 and r == "length" for f, _, r in results)


def test_max_model_len_ends_with_length_and_long_windows_are_refused(tiny_model):
    async def reference_frames(params):
        engine = ReferenceEngine(tiny_model, max_num_seqs=2, max_model_len=64)
        await engine.start()
        try:
            return [c async for c in engine.submit(request(tiny_model, 2, "hi", params))]
        finally:
            await engine.stop()

    async def scenario():
        engine = GraphEngine(tiny_model, max_num_seqs=2, max_model_len=64)
        await engine.start()
        try:
            with pytest.raises(EngineError, match="max_model_len"):
                engine.submit(request(tiny_model, 0, "x " * 100, SamplingParams(temperature=0)))
            with pytest.raises(EngineError, match="repetition_window"):
                engine.submit(request(tiny_model, 1, "hi", SamplingParams(
                    repetition_window=MAX_REPETITION_WINDOW + 1)))
            prompt_len = len(tiny_model.tokenizer.build("hi", with_speaker=True).input_ids)
            params = SamplingParams(temperature=0, max_new_frames=500, min_new_frames=500)
            chunks = [c async for c in engine.submit(request(tiny_model, 2, "hi", params))]
        finally:
            await engine.stop()
        return prompt_len, chunks, await reference_frames(params)

    prompt_len, chunks, reference = asyncio.run(scenario())
    assert chunks[-1].finish_reason == reference[-1].finish_reason == "length"
    # The cache holds max_model_len positions: the prompt, then one per frame fed back (the last is not).
    assert sum(len(c.codes) for c in chunks) == sum(len(c.codes) for c in reference) == 64 - prompt_len + 1
    assert np.array_equal(np.concatenate([c.codes for c in chunks]), np.concatenate([c.codes for c in reference]))


def test_abandoned_stream_frees_its_slot(tiny_model):
    async def scenario():
        engine = GraphEngine(tiny_model, max_num_seqs=1)
        await engine.start()
        params = SamplingParams(temperature=0, max_new_frames=200, min_new_frames=200)
        stream = engine.submit(request(tiny_model, 0, "abandon me", params))
        async for _ in stream:
            break
        await stream.aclose()
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


def test_newcomers_are_gathered_for_admit_interval_while_others_decode(tiny_model):
    async def scenario():
        rec = Recorder()
        engine = GraphEngine(tiny_model, max_num_seqs=4, admit_interval=0.3, observer=rec)
        await engine.start()
        try:
            long = SamplingParams(temperature=0, max_new_frames=400, min_new_frames=400)
            first = engine.submit(request(tiny_model, 0, "running", long))
            await first.__anext__()  # admitted at once: the engine was idle
            second = engine.submit(request(tiny_model, 1, "newcomer", SamplingParams(temperature=0,
                                                                                    max_new_frames=3)))
            frames = [c async for c in second]
            await first.aclose()
        finally:
            await engine.stop()
        return rec.waits, frames

    waits, frames = asyncio.run(scenario())
    assert waits[0] < 0.3 <= waits[1]
    assert frames[-1].finished


def test_the_loop_reports_its_steps_rows_by_stage_and_gpu_wait(tiny_model, caplog):
    params = SamplingParams(temperature=0, max_new_frames=12)

    async def go():
        engine = GraphEngine(tiny_model, max_num_seqs=4, stats_interval=0.0)
        await engine.start()
        try:
            with caplog.at_level(logging.INFO, logger="chattts_runtime.engines.graph"):
                await asyncio.gather(*(collect(engine.submit(request(tiny_model, i, t, params)))
                                       for i, t in enumerate(TEXTS[:3])))
        finally:
            await engine.stop()

    async def collect(stream):
        return [chunk async for chunk in stream]

    asyncio.run(go())
    reports = [json.loads(r.getMessage().split("engine loop: ", 1)[1]) for r in caplog.records
               if r.getMessage().startswith("engine loop: ")]
    assert reports, "no loop report was logged"
    assert sum(r["rows_per_step"]["first"] * r["steps_per_s"] * r["wall_s"] for r in reports) > 0
    assert all(r["rows_per_step"]["refine"] == 0 and 0 <= r["gpu_wait_share"] <= 1 for r in reports)


def test_first_audio_substeps_step_voice_passes_and_refine_rows_more_often_and_change_no_code(tiny_model):
    """Voice-pass requests and refine-text jobs beside first pieces, with substeps on every full step (a pace
    any full step keeps): the voice passes sit between the others' slots, are gathered into substeps and step
    more often than the others, and every code and refine token is the reference's."""
    from chattts_runtime.engines.refine import TextRefiner
    from chattts_runtime.engines.schedule import Stage
    from chattts_runtime.model.refine import RefineParams, upstream_refine_sampling

    def staged(model, i, text, params):
        made = request(model, i, text, params)
        made.stage = Stage.VOICE if i % 2 else Stage.FIRST
        return made

    # Long enough that contexts cross the first KV length bucket: a substep that lost count of its rows'
    # positions would attend over too few columns.
    params = SamplingParams(temperature=0, max_new_frames=120, min_new_frames=120)
    refine = upstream_refine_sampling(temperature=0, max_new_frames=12)
    refiner = TextRefiner(tiny_model, max_model_len=2048)
    prompts = [refiner.prompt_ids(t, RefineParams()) for t in TEXTS[:3]]
    reference, _ = asyncio.run(run_all(ReferenceEngine, tiny_model, TEXTS, params, concurrent=False))
    refined = [refiner.generate(p, refine) for p in prompts]
    engine = GraphEngine(tiny_model, max_num_seqs=16, pad_shapes=True, first_audio_substeps=2,
                         playing_realtime=1e-9)
    gathers = []

    async def run():
        plan_step = engine._slots.next_step

        def recorded(*args, **kwargs):
            plan = plan_step(*args, **kwargs)
            if plan.gather is not None:
                gathers.append(plan.slots.tolist())
            return plan

        engine._slots.next_step = recorded
        await engine.start()
        try:
            async def collect(stream):
                return [frame async for chunk in stream for frame in chunk.codes.tolist()]

            # All queued before the worker looks, so they share steps from the start (the lock is re-entrant:
            # submit queues at once; the refine jobs' tasks queue at their first step, on the sleep below).
            with engine.requests.cond:
                streams = [engine.submit(staged(tiny_model, i, t, params)) for i, t in enumerate(TEXTS)]
                texts = [asyncio.ensure_future(engine.refine_text(f"t{i}", p, refine)) for i, p in enumerate(prompts)]
                await asyncio.sleep(0)
                assert engine.num_waiting == len(TEXTS) and len(engine._refine.waiting) == len(prompts)
            return await asyncio.gather(*map(collect, streams)), await asyncio.gather(*texts)
        finally:
            await engine.stop()

    codes, tokens = asyncio.run(run())
    assert engine.substeps > 20 and engine.steps > engine.substeps
    assert len(gathers) == engine.substeps
    # The voice passes sit between first pieces: substeps gathered slots that are not the lowest ones.
    assert any(slots != list(range(len(slots))) for slots in gathers)
    assert [c for c, _, _ in reference] == codes
    assert tokens == refined


def test_an_engine_whose_gathered_step_fails_serves_without_substeps(tiny_model, monkeypatch, caplog):
    """The gathered step is probed once at set-up; if it cannot run (a kernel that will not build), the engine
    still serves every request, with substeps off, the error logged and describe() saying so."""
    from chattts_runtime.engines import graph
    from chattts_runtime.engines.schedule import Stage

    plain = graph.decode_step

    def no_gather(*args, gathered=False, **kwargs):
        if gathered:
            raise RuntimeError("no gathered kernel here")
        return plain(*args, **kwargs)

    monkeypatch.setattr(graph, "decode_step", no_gather)
    params = SamplingParams(temperature=0, max_new_frames=20, min_new_frames=20)
    engine = GraphEngine(tiny_model, max_num_seqs=16, pad_shapes=True, first_audio_substeps=2, playing_realtime=1e-9)

    def voice(i, text):
        made = request(tiny_model, i, text, params)
        made.stage = Stage.VOICE if i % 2 else Stage.FIRST
        return made

    async def run():
        with caplog.at_level(logging.ERROR, logger="chattts_runtime.engines.graph"):
            await engine.start()
        try:
            async def frames(stream):
                return sum([len(chunk.codes) async for chunk in stream])

            return await asyncio.gather(*(frames(engine.submit(voice(i, t))) for i, t in enumerate(TEXTS[:4])))
        finally:
            await engine.stop()

    assert asyncio.run(run()) == [20] * 4
    assert engine.substeps == 0 and engine.describe()["first_audio_substeps"] == 0
    assert any("first-audio substeps are off" in r.getMessage() for r in caplog.records)


def test_substeps_too_wide_are_counted_with_what_made_them_too_wide(tiny_model):
    """Only voice passes in the engine: the first-audio rows fill the whole step, so no substep can be narrower
    than half of it. Every full step says so, with the rows, the substep's bucket they would take and the
    step's bucket."""
    from chattts_runtime.engines.schedule import Stage

    def voice(i, text):
        made = request(tiny_model, i, text, SamplingParams(temperature=0, max_new_frames=30, min_new_frames=30))
        made.stage = Stage.VOICE
        return made

    engine = GraphEngine(tiny_model, max_num_seqs=16, pad_shapes=True, first_audio_substeps=2, playing_realtime=1e-9,
                         stats_interval=None)
    assert engine.substep_buckets == [1, 2, 4, 8]

    async def run():
        await engine.start()
        try:
            with engine.requests.cond:  # all eight admitted together, before the worker looks
                streams = [engine.submit(voice(i, TEXTS[i % len(TEXTS)])) for i in range(8)]
            for stream in streams:
                async for _ in stream:
                    pass
        finally:
            await engine.stop()

    asyncio.run(run())
    report = engine._stats.report()
    assert engine.substeps == 0 and report["substeps_too_wide_per_s"] > 0
    assert report["too_wide"] == {"urgent_rows": 8.0, "substep_batch": 8.0, "full_batch": 8.0}
