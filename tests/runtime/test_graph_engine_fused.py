"""The graph engine's Triton kernels (engines.fused, engines.attention) against the torch they replace.

On CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, numpy). It converts float32
to bfloat16 by truncation where a GPU rounds to nearest, so these checks run in float32, where the
kernels' rounding steps are no-ops; the bf16 rounding is compared on the GPU (``bench.runtime.graph_check``).
"""
from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F

from chattts_runtime.engines import attention, fused
from chattts_runtime.engines.base import SamplingParams
from chattts_runtime.engines.graph import GraphEngine
from chattts_runtime.engines.graph_steps import SlotState, decode_step
from chattts_runtime.engines.reference import ReferenceEngine
from rt_helpers import TEXTS, run_all


@pytest.fixture
def interpreter():
    """Kernels run by Triton's interpreter (tests/conftest.py sets it before Triton is imported; Triton is a
    test requirement, so these tests never skip)."""
    import triton  # noqa: F401

    assert fused.interpreted(), "TRITON_INTERPRET=1 must be set before Triton is imported"


def _llama_layer(hidden=64, heads=2):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

    torch.manual_seed(0)
    norm = LlamaRMSNorm(hidden, eps=1e-6)
    norm.weight.data = torch.randn(hidden)
    rotary = LlamaRotaryEmbedding(LlamaConfig(hidden_size=hidden, num_attention_heads=heads,
                                              num_key_value_heads=heads))
    return norm, rotary


def test_kernels_compute_what_the_modules_compute(interpreter):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    norm, rotary = _llama_layer(hidden=96, heads=3)  # a width that is not a power of two: masked lanes
    x, delta = torch.randn(7, 96) * 3, torch.randn(7, 96)
    out, total = fused.add_rms_norm(x, delta, norm.weight, 1e-6)
    assert torch.equal(total, x + delta)
    torch.testing.assert_close(out, norm(x + delta), rtol=1e-6, atol=1e-6)
    alone, same = fused.add_rms_norm(x, None, norm.weight, 1e-6)
    assert same is x
    torch.testing.assert_close(alone, norm(x), rtol=1e-6, atol=1e-6)

    gate_up = torch.randn(5, 2 * 1500) * 3  # more than one block of the kernel per row
    torch.testing.assert_close(fused.silu_mul(gate_up), F.silu(gate_up[:, :1500]) * gate_up[:, 1500:],
                               rtol=1e-6, atol=1e-6)

    b, heads, d = 4, 3, 32
    position = torch.tensor([0, 5, 17, 63])
    cos, sin = rotary(torch.zeros(b, 1, heads * d), position[:, None])
    qkv = torch.randn(b, 3 * heads * d)
    keys, values = torch.zeros(6, heads, 64, d), torch.zeros(6, heads, 64, d)
    q = fused.rotary_kv(qkv, cos[:, 0], sin[:, 0], position, keys, values, heads, heads)
    split = [t.view(b, 1, heads, d).transpose(1, 2) for t in qkv.split(heads * d, dim=1)]
    q_ref, k_ref = apply_rotary_pos_emb(split[0], split[1], cos, sin)
    assert torch.equal(q, q_ref)
    rows = torch.arange(b)
    assert torch.equal(keys[rows, :, position], k_ref[:, :, 0])
    assert torch.equal(values[rows, :, position], split[2][:, :, 0])
    written = torch.zeros(6, heads, 64, dtype=torch.bool)
    written[rows, :, position] = True
    assert not keys[~written].any() and not values[~written].any()  # nothing else in the cache moved


def test_ragged_attention_equals_masked_sdpa(interpreter):
    b, heads, length, d = 5, 2, 192, 32
    q = torch.randn(b, heads, 1, d)
    keys, values = torch.randn(b + 1, heads, 256, d), torch.randn(b + 1, heads, 256, d)
    lengths = torch.tensor([1, 64, 65, 150, 192])  # one column, block edges, the bucket's end
    out = attention.ragged_decode_attention(q, keys[:b, :, :length], values[:b, :, :length], lengths, length)
    mask = (torch.arange(length)[None, :] < lengths[:, None])[:, None, None, :]
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, keys[:b, :, :length], values[:b, :, :length],
                                                                   attn_mask=mask), rtol=1e-5, atol=1e-5)


def _slot_states(model, fuse: bool):
    gpt = model.gpt
    state = SlotState(gpt, 8, 64, torch.device("cpu"), 4, 4, text_rows=4)
    generator = torch.Generator().manual_seed(1)
    state.position.copy_(torch.tensor([3, 5, 0, 7, 2, 9, 1, 4, 0]))
    state.codes.copy_(torch.randint(0, model.sizes.gpt.num_audio_tokens, state.codes.shape, generator=generator))
    for cache in (*state.keys, *state.values):
        cache.copy_(torch.randn(cache.shape, generator=generator))
    state.is_text[[1, 4]] = True  # two refine rows beside the audio rows
    state.codes[[1, 4], 0] = torch.tensor([7, 11])
    state.text_index[:2] = torch.tensor([1, 4])
    state.temperature.zero_()
    if fuse:
        state.trunk = fused.fuse_trunk(gpt)
    return state


@pytest.mark.parametrize("ragged", [False, True])
def test_a_fused_decode_step_equals_the_modules_step(interpreter, tiny_model, ragged):
    """Three mixed steps (audio and refine rows, padded or ragged attention) from the same slots: the same
    hidden states to float32 rounding, the same greedy codes and text tokens, the same KV written."""
    eos, text_end = tiny_model.sizes.gpt.audio_eos, 3
    states = [_slot_states(tiny_model, fuse) for fuse in (False, True)]
    with torch.inference_mode():
        for _ in range(3):
            for state in states:
                decode_step(tiny_model.gpt, state, 8, 32, eos, text_end, ragged, 4)
            plain, fast = states
            torch.testing.assert_close(fast.hidden, plain.hidden, rtol=1e-5, atol=1e-5)
            assert torch.equal(fast.codes, plain.codes) and torch.equal(fast.position, plain.position)
    for k_plain, k_fast in zip(plain.keys, fast.keys):
        torch.testing.assert_close(k_fast, k_plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("ragged", [False, True])
def test_a_gathered_step_steps_its_slots_as_a_full_step_does_and_leaves_the_others(interpreter, tiny_model,
                                                                                    fuse, ragged):
    """A first-audio substep over slots 1, 4 (the refine rows) and 6, gathered into a batch of 4 (the scratch
    slot pads it): those slots get the full step's hidden states, codes, text tokens, positions and KV; every
    other slot is as it was, cache included."""
    eos, text_end = tiny_model.sizes.gpt.audio_eos, 3
    full, gathered = _slot_states(tiny_model, fuse), _slot_states(tiny_model, fuse)
    before = _slot_states(tiny_model, fuse)
    picked, others = [1, 4, 6], [0, 2, 3, 5, 7]
    gathered.gather[:4] = torch.tensor([*picked, gathered.scratch])
    with torch.inference_mode():
        for _ in range(2):  # the second step reads the KV the first one wrote
            decode_step(tiny_model.gpt, full, 8, 32, eos, text_end, ragged, 4)
            decode_step(tiny_model.gpt, gathered, 4, 32, eos, text_end, ragged, 4, gathered=True)
    torch.testing.assert_close(gathered.hidden[picked], full.hidden[picked], rtol=1e-5, atol=1e-5)
    for name in ("codes", "position", "generated", "history", "text_history"):
        assert torch.equal(getattr(gathered, name)[picked], getattr(full, name)[picked]), name
        assert torch.equal(getattr(gathered, name)[others], getattr(before, name)[others]), name
    for cache, ref, old in ((gathered.keys, full.keys, before.keys), (gathered.values, full.values, before.values)):
        for layer, ref_layer, old_layer in zip(cache, ref, old):
            torch.testing.assert_close(layer[picked], ref_layer[picked], rtol=1e-5, atol=1e-5)
            assert torch.equal(layer[others], old_layer[others])


def test_the_graph_engine_with_fused_kernels_speaks_as_with_the_modules(interpreter, tiny_model):
    """Greedy: as the reference engine. Sampled (seeded): as the same engine on the modules; sampling turns
    any error in the logits into other codes, where the tiny model's greedy codes barely depend on them."""
    texts = TEXTS[:4]
    greedy = SamplingParams(temperature=0, max_new_frames=16)
    reference, _ = asyncio.run(run_all(ReferenceEngine, tiny_model, texts, greedy, concurrent=False))
    got, rec = asyncio.run(run_all(GraphEngine, tiny_model, texts, greedy, concurrent=True, max_num_seqs=4,
                                   decode_kernels="fused"))
    assert max(rec.batches) >= 2
    for (ref_codes, _, ref_reason), (codes, _, reason) in zip(reference, got):
        assert codes == ref_codes and reason == ref_reason
    sampled = SamplingParams(temperature=0.7, seed=11, max_new_frames=16)
    runs = [asyncio.run(run_all(GraphEngine, tiny_model, texts, sampled, concurrent=True, max_num_seqs=4,
                                decode_kernels=kernels))[0] for kernels in ("modules", "fused")]
    assert [r[0] for r in runs[0]] == [r[0] for r in runs[1]]


def test_decode_kernels_choice(tiny_model, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert GraphEngine(tiny_model).describe()["decode_kernels"] == "modules"  # auto on CPU
    with pytest.raises(ValueError, match="needs a CUDA device and Triton"):
        GraphEngine(tiny_model, decode_kernels="fused")
    with pytest.raises(ValueError, match="auto, fused or modules"):
        GraphEngine(tiny_model, decode_kernels="fast")


def test_fusable_names_what_the_kernels_cannot_compute(tiny_model):
    import copy

    assert fused.fusable(tiny_model.gpt.llama) is None
    llama = copy.deepcopy(tiny_model.gpt.llama)
    llama.config.hidden_act = "gelu"
    assert "gelu" in fused.fusable(llama)
    llama.config.hidden_act = "silu"
    proj = llama.layers[0].self_attn.q_proj
    llama.layers[0].self_attn.q_proj = torch.nn.Linear(proj.in_features, proj.out_features, bias=True)
    assert "bias-free" in fused.fusable(llama)


def test_kernels_that_fail_to_run_leave_the_modules_under_auto_only(interpreter, tiny_model, monkeypatch, caplog):
    from chattts_runtime.engines.base import EngineError

    def broken(gpt):
        raise RuntimeError("no kernel for you")

    monkeypatch.setattr(fused, "fuse_trunk", broken)
    engine = GraphEngine(tiny_model, max_num_seqs=2, decode_kernels="fused")
    engine.decode_kernels = "auto"  # what auto chose on a GPU whose Triton then fails

    async def serve():
        await engine.start()
        await engine.stop()

    asyncio.run(serve())
    assert engine.describe()["decode_kernels"] == "modules"
    assert "fused decode kernels failed" in caplog.text
    with pytest.raises(EngineError, match="no kernel for you"):
        asyncio.run(GraphEngine(tiny_model, max_num_seqs=2, decode_kernels="fused").start())
