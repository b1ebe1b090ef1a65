"""Refine-text: the runtime's text-head pass against upstream's ``GPT.generate(infer_text=True)``.

Upstream side as ``Chat._refine_text`` runs it: ``decorate_text_prompts`` (``[Sbreak]text[Pbreak]prompt``),
its tokenizer and ``Embed``, the ``[Ebreak]`` end token, then the ``< [break_0]`` filter and
``Tokenizer.decode`` that ``Chat._infer`` applies before the audio pass.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_helpers import upstream_greedy

CASES = [("hello world", {}), ("你好世界", dict(oral=2, laugh=0, break_=6)), ("chat tts, ok?", dict(break_=4))]
TOKENS = 48


def upstream_refine(up, text: str, controls: str, tokens: int) -> list[int]:
    chat = up.chat
    prompts = chat.speaker.decorate_text_prompts([text], controls)
    input_ids, attention_mask, text_mask = chat.tokenizer.encode(prompts, up.cfg.gpt.num_vq)
    emb = chat.embed(input_ids, text_mask)
    result = next(chat.gpt.generate(
        emb, input_ids, temperature=torch.tensor([1.0]), eos_token=chat.tokenizer.eos_token,
        attention_mask=attention_mask, max_new_token=tokens, min_new_token=0, logits_processors=(upstream_greedy,),
        infer_text=True, stream=False, show_tqdm=False, ensure_non_empty=False))
    return input_ids[0, :, 0].tolist(), result.ids[0].tolist()


@pytest.mark.parametrize("text,controls", CASES, ids=["en", "zh-controls", "en-break"])
def test_refine_greedy_tokens_and_text_equal(upstream, text, controls):
    from chattts_runtime.engines.refine import TextRefiner
    from chattts_runtime.model.refine import RefineParams, upstream_refine_sampling

    params = RefineParams(**controls, sampling=upstream_refine_sampling(temperature=0, max_new_frames=TOKENS,
                                                                        min_new_frames=0))
    refiner = TextRefiner(upstream.model, max_model_len=4096)
    up_prompt, up_tokens = upstream_refine(upstream, text, params.controls, TOKENS)
    assert refiner.prompt_ids(text, params) == up_prompt
    ours = refiner.refine(text, params)
    assert list(ours.token_ids) == up_tokens and len(up_tokens) > 0
    tok = upstream.chat.tokenizer
    kept = torch.tensor(up_tokens)
    assert ours.text == tok.decode([kept[kept.less(tok.break_0_ids)]])[0]


OFFICIAL_ORDER_CASES = ["hello world, ok", "[Pbreak]你好[Ebreak]世界", "[spk_emb]hi [laugh] there"]


@pytest.mark.parametrize("text", OFFICIAL_ORDER_CASES, ids=["plain", "break-tokens", "control-tokens"])
def test_refined_text_then_codes_equal_in_the_official_order(upstream_official_order, text):
    """With the official vocabulary's order refine-text's output keeps its text and control tokens such as
    ``[Stts]``/``[spk_emb]`` (ids below ``[break_0]``): refined text, then its code prompt alone and beside
    the voice sample (``txt_smp`` = the refined text, as upstream's long input) and the greedy codes of both
    (upstream's repetition penalty), against upstream."""
    from parity_helpers import run_reference, upstream_codes

    from chattts_runtime.engines.base import SynthesisRequest
    from chattts_runtime.engines.refine import TextRefiner
    from chattts_runtime.model.refine import RefineParams, upstream_refine_sampling
    from chattts_runtime.model.sampling import SamplingParams
    from chattts_runtime.model.speaker import encode_speaker

    up = upstream_official_order
    chat, model = up.chat, up.model
    params = RefineParams(sampling=upstream_refine_sampling(temperature=0, max_new_frames=TOKENS, min_new_frames=0))
    _, up_tokens = upstream_refine(up, text, "", TOKENS)
    ours = TextRefiner(model, max_model_len=4096).refine(text, params)
    assert list(ours.token_ids) == up_tokens
    kept = torch.tensor(up_tokens)
    refined = chat.tokenizer.decode([kept[kept.less(chat.tokenizer.break_0_ids)]])[0]
    assert ours.text == refined and refined.strip()
    speaker = encode_speaker(torch.randn(up.cfg.gpt.hidden_size, generator=torch.Generator().manual_seed(9)).numpy())
    frames = 24
    for sample in (None, refined):
        up_ids, up_codes, _ = upstream_codes(up, refined, speaker, frames, sample_text=sample)
        prompt = model.tokenizer.build(ours.text, with_speaker=True, sample_text=sample or "")
        assert list(prompt.input_ids) == up_ids
        [(codes, _)] = run_reference(model, [SynthesisRequest("r", prompt.input_ids, model.speaker_for(speaker).numpy(),
                                                              SamplingParams(temperature=0, max_new_frames=frames))])
        assert len(codes) > 0
        np.testing.assert_array_equal(codes, up_codes)
