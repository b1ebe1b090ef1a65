"""The vllm engine against the reference engine: same codes, streaming, aborts, queue bound, waits.

One vLLM engine for the module (module-scoped fixture on a module-scoped event loop).
"""
from __future__ import annotations

import asyncio
import statistics

import numpy as np
import pytest
import pytest_asyncio

from chattts_runtime.engines.base import EngineError, QueueFull, SamplingParams, SynthesisRequest
from chattts_runtime.engines.reference import ReferenceEngine
from chattts_runtime.engines.vllm_engine import VLLMEngine

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_NUM_SEQS = 16
TEXTS = ["hello world", "a", "the quick brown fox jumps over the lazy dog", "你好世界", "abc def ghi jkl mno",
         "x y z", "testing one two three four five six", "ok", "语音合成 is fun", "what, where; why?"]


class RecordingObserver:
    def __init__(self):
        self.waits: dict[str, float] = {}
        self.batches: list[int] = []

    def on_scheduled(self, request, wait_seconds):
        assert request.request_id not in self.waits, "on_scheduled called twice"
        self.waits[request.request_id] = wait_seconds

    def on_step(self, batch_size):
        self.batches.append(batch_size)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_engine(tiny_checkpoint, tiny_model, vllm_runtime_config):
    observer = RecordingObserver()
    # Prefix caching on: the speaker-salt test below needs it (the others do not care).
    engine = VLLMEngine(tiny_model, vllm_runtime_config(tiny_checkpoint, max_num_seqs=MAX_NUM_SEQS,
                                                        enable_prefix_caching=True, extra_args=["--block-size=32"]),
                        observer=observer)
    await engine.start()
    yield engine
    await engine.stop()


def requests(model, prefix: str, params_for) -> list[SynthesisRequest]:
    out = []
    voices = ["alloy", None, "nova", "echo", None]
    for i, text in enumerate(TEXTS):
        voice = voices[i % len(voices)]
        prompt = model.tokenizer.build(text, with_speaker=voice is not None, speed=1.0 + 0.1 * (i % 3))
        speaker = model.speaker_for(voice).numpy() if voice else None
        out.append(SynthesisRequest(f"{prefix}-{i}", prompt.input_ids, speaker, params_for(i)))
    return out


async def collect(engine, reqs) -> list[tuple[np.ndarray, str, int]]:
    async def one(req):
        chunks = [chunk async for chunk in engine.submit(req)]
        codes = np.concatenate([c.codes for c in chunks]) if chunks else np.zeros((0, 4), np.int64)
        return codes, chunks[-1].finish_reason, len(chunks)

    return await asyncio.gather(*(one(r) for r in reqs))


async def run_reference(model, reqs):
    engine = ReferenceEngine(model, max_num_seqs=MAX_NUM_SEQS, max_model_len=512)
    await engine.start()
    try:
        return await collect(engine, reqs)
    finally:
        await engine.stop()


def greedy(i: int) -> SamplingParams:
    # min_new_frames holds the end code back for a while, so lengths differ widely.
    return SamplingParams(temperature=0, min_new_frames=5 * i, max_new_frames=30 + 4 * i)


async def test_greedy_codes_equal_the_reference_for_a_concurrent_batch(vllm_engine, tiny_model):
    observer = vllm_engine.observer
    observer.batches.clear()
    expected = await run_reference(tiny_model, requests(tiny_model, "ref", greedy))
    got = await collect(vllm_engine, requests(tiny_model, "vllm", greedy))

    for i, ((want, want_reason, _), (have, have_reason, _)) in enumerate(zip(expected, got)):
        assert have.shape == want.shape, f"request {i}: {have.shape} frames, reference {want.shape}"
        np.testing.assert_array_equal(have, want, err_msg=f"request {i}")
        assert have_reason == want_reason
    lengths = {len(codes) for codes, _, _ in got}
    assert len(lengths) >= 6, f"lengths should differ: {sorted(lengths)}"
    assert {reason for _, reason, _ in got} == {"eos", "length"}  # both endings exercised
    assert max(observer.batches) >= 8, "the requests should have been batched together"


async def test_seeded_sampling_equals_the_reference(vllm_engine, tiny_model):
    def sampled(i: int) -> SamplingParams:
        return SamplingParams(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.1, seed=1000 + i,
                              min_new_frames=10, max_new_frames=40)

    expected = await run_reference(tiny_model, requests(tiny_model, "sref", sampled)[:6])
    got = await collect(vllm_engine, requests(tiny_model, "svllm", sampled)[:6])
    for i, ((want, _, _), (have, _, _)) in enumerate(zip(expected, got)):
        np.testing.assert_array_equal(have, want, err_msg=f"request {i}")
    # Sampling really happened: not the greedy codes.
    greedy_codes = await collect(vllm_engine, requests(tiny_model, "g", lambda i: SamplingParams(
        temperature=0, min_new_frames=10, max_new_frames=40))[:6])
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(got, greedy_codes))


async def test_frames_stream_before_the_request_ends(vllm_engine, tiny_model):
    prompt = tiny_model.tokenizer.build("streaming please", with_speaker=False)
    req = SynthesisRequest("stream-1", prompt.input_ids, None,
                           SamplingParams(temperature=0, min_new_frames=120, max_new_frames=120))
    chunks = [chunk async for chunk in vllm_engine.submit(req)]
    assert sum(len(c.codes) for c in chunks) == 120
    assert len([c for c in chunks if len(c.codes) and not c.finished]) >= 3
    assert chunks[-1].finished and chunks[-1].finish_reason == "length"


async def test_abort_ends_one_stream_and_the_engine_keeps_serving(vllm_engine, tiny_model):
    prompt = tiny_model.tokenizer.build("abort me", with_speaker=False)
    req = SynthesisRequest("abort-1", prompt.input_ids, None,
                           SamplingParams(temperature=0, min_new_frames=400, max_new_frames=400))
    stream = vllm_engine.submit(req)
    first = await stream.__anext__()
    assert not first.finished
    vllm_engine.abort("abort-1")
    rest = [chunk async for chunk in stream]
    assert rest[-1].finish_reason == "aborted"
    assert sum(len(c.codes) for c in [first, *rest]) < 400
    after = await collect(vllm_engine, requests(tiny_model, "after-abort", greedy)[:2])
    assert all(reason in ("eos", "length") for _, reason, _ in after)
    assert vllm_engine.num_running == 0 and vllm_engine.num_waiting == 0


async def test_queue_bound_and_bad_requests_fail_at_submit(vllm_engine, tiny_model):
    prompt = tiny_model.tokenizer.build("queue", with_speaker=False)
    params = SamplingParams(temperature=0, max_new_frames=4)
    saved, vllm_engine.max_waiting = vllm_engine.max_waiting, 2
    try:
        streams = [vllm_engine.submit(SynthesisRequest(f"q-{i}", prompt.input_ids, None, params)) for i in range(2)]
        with pytest.raises(QueueFull):
            vllm_engine.submit(SynthesisRequest("q-2", prompt.input_ids, None, params))
    finally:
        vllm_engine.max_waiting = saved
    for stream in streams:
        assert [c async for c in stream][-1].finished
    with pytest.raises(EngineError, match="max_model_len"):
        vllm_engine.submit(SynthesisRequest("long", tuple(prompt.input_ids) * 200, None, params))


async def test_deadline_wait_grows_for_requests_beyond_max_num_seqs(vllm_engine, tiny_model):
    observer = vllm_engine.observer
    prompt = tiny_model.tokenizer.build("load", with_speaker=False)
    params = SamplingParams(temperature=0, min_new_frames=60, max_new_frames=60)
    reqs = [SynthesisRequest(f"load-{i}", prompt.input_ids, None, params) for i in range(3 * MAX_NUM_SEQS)]
    results = await collect(vllm_engine, reqs)
    assert all(len(codes) == 60 for codes, _, _ in results)
    waits = [observer.waits[r.request_id] for r in reqs]
    assert all(w >= 0 for w in waits)
    first_wave = statistics.median(sorted(waits)[:MAX_NUM_SEQS])
    last_wave = statistics.median(sorted(waits)[-MAX_NUM_SEQS:])
    # The last third can only start once earlier requests finished 60 frames each.
    assert last_wave > first_wave + 0.05, (first_wave, last_wave)
    assert max(observer.batches) <= MAX_NUM_SEQS


async def test_prefix_cache_does_not_mix_speakers(vllm_engine, tiny_model):
    """Same prompt ids, other speaker vector: the cached prefix must not be reused (cache_salt)."""
    assert vllm_engine._llm.vllm_config.cache_config.enable_prefix_caching
    text = "a long prompt that fills several kv cache blocks, shared by two different voices."
    params = SamplingParams(temperature=0, min_new_frames=20, max_new_frames=20)
    reqs = []
    for i, voice in enumerate(["alloy", "onyx", "alloy"]):
        prompt = tiny_model.tokenizer.build(text, with_speaker=True)
        assert len(prompt.input_ids) > 64  # two full 32-token blocks
        reqs.append(SynthesisRequest(f"salt-{i}", prompt.input_ids, tiny_model.speaker_for(voice).numpy(), params))
    got, cached = [], []
    for req in reqs:  # one after another, so later requests can find earlier prefixes
        before = vllm_engine.cached_prompt_tokens
        got.append((await collect(vllm_engine, [req]))[0][0])
        cached.append(vllm_engine.cached_prompt_tokens - before)
    assert cached[1] == 0, "another speaker must not reuse the first speaker's prompt KV"
    assert cached[2] > 0, "the same speaker and prompt should hit the prefix cache"
    expected = await run_reference(tiny_model, reqs)
    for i, (have, (want, _, _)) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(have, want, err_msg=f"request {i}")
