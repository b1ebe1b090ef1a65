"""The upstream-faithful pipeline on the vllm engine, against the reference engine on the same weights:
refine-text tokens (a second generation with the text head), the Decoder path's hidden states (carried
in raw-logit logprobs), and the speech service's audio for a long input that is split into sentences,
with refine-text and the Decoder path on (greedy: token for token, float32).

One vLLM engine for the module (module-scoped fixture on a module-scoped event loop).
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio

from chattts_runtime.engines.base import SamplingParams, SynthesisRequest
from chattts_runtime.engines.reference import ReferenceEngine
from chattts_runtime.engines.refine import TextRefiner
from chattts_runtime.engines.vllm_engine import VLLMEngine
from chattts_runtime.metrics import RuntimeMetrics
from chattts_runtime.model.refine import RefineParams, upstream_refine_sampling
from chattts_runtime.service import SpeechRequest, SpeechService

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_MODEL_LEN = 1024
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "你好世界", "what, where; why?",
         "testing one two three", "ok"]
# Several sentences: the front-end cuts it into pieces, each its own refine and audio request.
LONG_INPUT = ("The first one is here. A second follows it. Then a third! Does it go on? "
              "The fifth ends it. 这是第六句。")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_engine(tiny_checkpoint, tiny_model, vllm_runtime_config):
    engine = VLLMEngine(tiny_model, vllm_runtime_config(tiny_checkpoint, max_model_len=MAX_MODEL_LEN))
    await engine.start()
    yield engine
    await engine.stop()


def refine_params(i: int, *, greedy: bool) -> RefineParams:
    sampling = upstream_refine_sampling(max_new_frames=12 + 5 * i, temperature=0 if greedy else None,
                                        seed=None if greedy else 77 + i)
    return RefineParams(oral=i % 10 if i % 2 else None, laugh=i % 3, break_=None, sampling=sampling)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "seeded"])
async def test_refine_tokens_equal_the_reference_refiner(vllm_engine, tiny_model, greedy):
    refiner = TextRefiner(tiny_model, max_model_len=MAX_MODEL_LEN)
    prompts = [(refiner.prompt_ids(text, refine_params(i, greedy=greedy)), refine_params(i, greedy=greedy))
               for i, text in enumerate(TEXTS)]
    expected = [refiner.generate(prompt, params.sampling) for prompt, params in prompts]
    got = await asyncio.gather(*(vllm_engine.refine_text(f"refine-{greedy}-{i}", prompt, params.sampling)
                                 for i, (prompt, params) in enumerate(prompts)))
    for i, (have, want) in enumerate(zip(got, expected)):
        assert have == want, f"text {i}"
    assert all(t < tiny_model.sizes.gpt.num_text_tokens for ids in got for t in ids)
    assert len({len(ids) for ids in got}) >= 3, "lengths should differ"
    assert vllm_engine.refining == 0


async def test_top_k_1_still_keeps_three_candidates_on_both_heads_as_upstream(vllm_engine, tiny_model):
    """top_k=1 and a tiny top_p would leave one candidate; upstream keeps 3 (min_tokens_to_keep): seeded
    draws then leave the argmax sometimes, equally on both engines, on the text head and the code heads."""
    refiner = TextRefiner(tiny_model, max_model_len=MAX_MODEL_LEN)
    narrow = dict(temperature=1.5, top_k=1, top_p=0.01, max_new_frames=40)
    prompt = refiner.prompt_ids("keep three", RefineParams())
    sampled = upstream_refine_sampling(seed=5, **narrow)
    want = refiner.generate(prompt, sampled)
    assert await vllm_engine.refine_text("keep3-text", prompt, sampled) == want
    assert want != refiner.generate(prompt, upstream_refine_sampling(temperature=0, max_new_frames=40))

    def codes(prefix: str, **params):
        audio = tiny_model.tokenizer.build("keep three", with_speaker=False)
        return [SynthesisRequest(f"{prefix}-{i}", audio.input_ids, None, SamplingParams(
            min_new_frames=30, max_new_frames=30, **params)) for i in range(3)]

    sampled_codes = dict(temperature=1.5, top_k=1, top_p=0.01, seed=9)
    reference = ReferenceEngine(tiny_model, max_num_seqs=16, max_model_len=MAX_MODEL_LEN)
    await reference.start()
    try:
        expected = await collect(reference, codes("ref-keep3", **sampled_codes))
        greedy = await collect(reference, codes("ref-greedy", temperature=0))
    finally:
        await reference.stop()
    got = await collect(vllm_engine, codes("vllm-keep3", **sampled_codes))
    for (have, _, _), (want_codes, _, _) in zip(got, expected):
        np.testing.assert_array_equal(have, want_codes)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(got, greedy))


async def test_refine_with_no_room_left_generates_nothing(vllm_engine, tiny_model):
    refiner = TextRefiner(tiny_model, max_model_len=MAX_MODEL_LEN)
    prompt = refiner.prompt_ids("no room", RefineParams())
    long_prompt = (prompt * (MAX_MODEL_LEN // len(prompt) + 1))[:MAX_MODEL_LEN]
    got = await vllm_engine.refine_text("refine-room", long_prompt, upstream_refine_sampling(temperature=0))
    assert got == []  # the reference refiner's loop does not start either (position == max_model_len)


def audio_requests(model, prefix: str) -> list[SynthesisRequest]:
    out = []
    for i, text in enumerate(TEXTS):
        voice = ["alloy", None, "nova"][i % 3]
        prompt = model.tokenizer.build(text, with_speaker=voice is not None)
        out.append(SynthesisRequest(f"{prefix}-{i}", prompt.input_ids,
                                    model.speaker_for(voice).numpy() if voice else None,
                                    SamplingParams(temperature=0, min_new_frames=4 * i, max_new_frames=20 + 3 * i),
                                    want_hidden=True))
    return out


async def collect(engine, reqs):
    async def one(req):
        chunks = [chunk async for chunk in engine.submit(req)]
        codes = np.concatenate([c.codes for c in chunks])
        parts = [c.hidden for c in chunks if c.hidden is not None]
        hidden = np.concatenate(parts) if parts else None
        return codes, hidden, chunks[-1].finish_reason

    return await asyncio.gather(*(one(r) for r in reqs))


async def test_voice_sample_codes_after_the_prompt_equal_the_reference(vllm_engine, tiny_model):
    """A voice sample (upstream's spk_smp; a long input's first piece for the pieces after it): codebook 0
    rides in the prompt's token ids, every codebook in the payload; greedy codes equal the reference's."""
    rng = np.random.default_rng(5)
    num_vq, codes = tiny_model.sizes.gpt.num_vq, tiny_model.sizes.gpt.num_audio_tokens - 1

    def with_samples(prefix: str) -> list[SynthesisRequest]:
        reqs = audio_requests(tiny_model, prefix)
        for i, req in enumerate(reqs):
            if i % 2 == 0:
                req.prompt_codes = np.random.default_rng(i).integers(0, codes, size=(8 + 3 * i, num_vq))
        return reqs

    reference = ReferenceEngine(tiny_model, max_num_seqs=16, max_model_len=MAX_MODEL_LEN)
    await reference.start()
    try:
        expected = await collect(reference, with_samples("ref-s"))
        plain = await collect(reference, audio_requests(tiny_model, "ref-p"))
    finally:
        await reference.stop()
    got = await collect(vllm_engine, with_samples("vllm-s"))
    for i, ((codes_got, _, reason), (want, _, want_reason)) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(codes_got, want, err_msg=f"request {i}")
        assert reason == want_reason
    assert all(not np.array_equal(expected[i][0], plain[i][0]) for i in range(0, len(TEXTS), 2))
    # The same text and codebook 0 with other codebooks 1..3 is another prompt (the prefix cache's salt).
    twin = with_samples("vllm-t")[0]
    twin.prompt_codes = twin.prompt_codes.copy()
    twin.prompt_codes[:, 1:] = rng.integers(0, codes, size=(len(twin.prompt_codes), num_vq - 1))
    [(twin_codes, _, _)] = await collect(vllm_engine, [twin])
    reference = ReferenceEngine(tiny_model, max_num_seqs=16, max_model_len=MAX_MODEL_LEN)
    await reference.start()
    try:
        [(want_twin, _, _)] = await collect(reference, [twin])
    finally:
        await reference.stop()
    np.testing.assert_array_equal(twin_codes, want_twin)


async def test_decoder_path_hidden_states_and_audio_equal_the_reference(vllm_engine, tiny_model):
    reference = ReferenceEngine(tiny_model, max_num_seqs=16, max_model_len=MAX_MODEL_LEN)
    await reference.start()
    try:
        expected = await collect(reference, audio_requests(tiny_model, "ref"))
    finally:
        await reference.stop()
    got = await collect(vllm_engine, audio_requests(tiny_model, "vllm"))
    hidden_size = tiny_model.sizes.gpt.hidden_size
    for i, ((codes, hidden, reason), (want_codes, want_hidden, want_reason)) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(codes, want_codes, err_msg=f"request {i}")
        assert reason == want_reason
        assert hidden.shape == (len(codes), hidden_size) and hidden.dtype == np.float32
        # vLLM's fused kernels and the reference's differ in rounding only.
        np.testing.assert_allclose(hidden, want_hidden, rtol=1e-4, atol=1e-4, err_msg=f"request {i}")
        import torch

        audio = tiny_model.hidden_to_audio(torch.from_numpy(hidden)[None]).numpy()[0]
        want_audio = tiny_model.hidden_to_audio(torch.from_numpy(want_hidden)[None]).numpy()[0]
        assert np.abs(audio).max() > 0
        np.testing.assert_allclose(audio, want_audio, rtol=1e-3, atol=1e-4, err_msg=f"request {i}")


def make_service(model, engine, engine_kind: str) -> SpeechService:
    from chattts_runtime.config import RuntimeConfig

    # The upstream pipeline: refine-text on and the Decoder path are these engines' defaults.
    config = RuntimeConfig.model_validate({
        "engine_kind": engine_kind, "device": "cpu",
        "generation": {"temperature": 0, "max_new_frames": 60},
        "engine": {"max_model_len": MAX_MODEL_LEN, "max_num_seqs": 16, "dtype": "float32", "enforce_eager": True}})
    assert config.refine_text and config.audio_decoder == "decoder"
    return SpeechService(config, model, engine, RuntimeMetrics())


async def speak(service: SpeechService, **fields):
    req = SpeechRequest(model="chattts", voice="echo", response_format="pcm", stream=False,
                        refine_temperature=0, **fields)
    synthesis = service.prepare(req)
    await service.refine(synthesis, req)
    await service.voice_from_first_piece(synthesis, req)
    audio = await service.synthesize(synthesis, service.submit(synthesis))
    return synthesis, audio


async def test_speech_service_long_input_refined_on_the_decoder_path_equals_the_reference(vllm_engine, tiny_model):
    reference = ReferenceEngine(tiny_model, max_num_seqs=16, max_model_len=MAX_MODEL_LEN)
    await reference.start()
    try:
        want, want_audio = await speak(make_service(tiny_model, reference, "reference"), input=LONG_INPUT)
    finally:
        await reference.stop()
    have, have_audio = await speak(make_service(tiny_model, vllm_engine, "vllm"), input=LONG_INPUT)
    assert len(have.texts) >= 2, "the long input should be split into pieces"
    assert have.texts == want.texts and have.refined_text == want.refined_text
    assert [r.prompt_ids for r in (have.request, *have.more)] == [r.prompt_ids for r in (want.request, *want.more)]
    # Every piece took the first piece's voice (upstream's long input), from the same sample codes.
    assert all(r.prompt_codes is not None for r in (have.request, *have.more))
    np.testing.assert_array_equal(have.request.prompt_codes, want.request.prompt_codes)
    assert have_audio.shape == want_audio.shape and np.abs(have_audio).max() > 0
    np.testing.assert_allclose(have_audio, want_audio, rtol=1e-3, atol=1e-4)
