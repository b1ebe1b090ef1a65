"""GPU check of the graph engine: graph replay equals eager steps, and raw step times per bucket.

``python -m bench.runtime.graph_check --size full`` (needs CUDA). Prints and writes JSON
(``--out``): whether greedy codes from replayed graphs equal the same engine's eager
steps and how many frames agree with the reference engine (bf16 on GPU: kernels differ,
so agreement is reported, not asserted), graph capture time, and the median time of one
replayed decode step at batch 1/16/64/256 (length buckets 256 and 1024, audio rows only and mixed
with refine-text rows, ragged kernel against padded SDPA, the fused trunk against the Llama modules),
the engine-level counterpart of ``shared/anchors/chattts_gpt_anchor.py``'s ``cudagraph-static`` rows;
with the fused trunk (``engine.decode_kernels``), how its codes and each kernel's bf16 outputs compare
with the modules'; and the
GPU time of a captured prefill (1/8/32 newcomers, 64-token bucket) and of an audio window
batch (1/8/64 windows of the steady window length), each against the same code run eagerly.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

import numpy as np

from bench.runtime.speech_api import RESULTS, make_checkpoint
from bench.runtime.gpu_timing import event_median_ms


async def generate(engine_cls, model, texts, params, samples=True, **kw):
    """Greedy codes of ``texts`` and, on an engine that refines, its refine-text ids of them."""
    from chattts_runtime.engines.base import SynthesisRequest

    engine = engine_cls(model, **kw)
    await engine.start()

    def one(i, text):
        prompt = model.tokenizer.build(text, with_speaker=True)
        # Every other request carries 24 frames of voice-sample codes after its text (upstream's spk_smp,
        # what a long input's pieces take from its first): the prefill that embeds them is checked too.
        sample = None if i % 2 == 0 or not samples else np.random.default_rng(i).integers(
            0, model.sizes.gpt.num_audio_tokens - 1, size=(24, model.sizes.gpt.num_vq))
        req = SynthesisRequest(f"c{i}", prompt.input_ids, model.speaker_for("alloy").numpy(), params,
                               prompt_codes=sample)
        return engine.submit(req)

    async def frames(stream):
        return [f for c in [c async for c in stream] for f in c.codes.tolist()]

    try:
        # Every request queued before the worker may look (its lock is re-entrant): each run then prefills
        # them in the same groups, so the runs compare the same shapes (bf16 rounds per shape).
        with engine.requests.cond:
            streams = [one(i, t) for i, t in enumerate(texts)]
        codes = await asyncio.gather(*(frames(s) for s in streams))
        engine.refined = await refine_all(engine, model, texts) if engine.refines_text else None
        return codes, engine
    finally:
        await engine.stop()


async def refine_all(engine, model, texts):
    """Greedy refine-text ids of ``texts``: on an engine that refines (batched), else the reference refiner."""
    from chattts_runtime.engines.refine import TextRefiner
    from chattts_runtime.model.refine import RefineParams, upstream_refine_sampling

    refiner = TextRefiner(model, max_model_len=1024)
    params = upstream_refine_sampling(temperature=0, max_new_frames=48)
    prompts = [refiner.prompt_ids(t, RefineParams()) for t in texts]
    if engine is None:
        return [refiner.generate(p, params) for p in prompts]
    return await asyncio.gather(*(engine.refine_text(f"r{i}", p, params) for i, p in enumerate(prompts)))


def main() -> int:
    import torch

    from chattts_runtime.engines.base import SamplingParams
    from chattts_runtime.engines.graph import GraphEngine
    from chattts_runtime.engines.graph_steps import decode_step, decode_windows, prefill_step
    from chattts_runtime.engines.reference import ReferenceEngine
    from chattts_runtime.model import load_chattts

    p = argparse.ArgumentParser()
    p.add_argument("--size", default="full")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--out", default=None)
    p.add_argument("--repeat", action="store_true",
                   help="run the graph and the eager engine twice each: is each run-to-run deterministic?")
    p.add_argument("--no-samples", action="store_true", help="no request carries voice-sample codes")
    p.add_argument("--equality-only", action="store_true", help="skip the step, prefill and window timings")
    p.add_argument("--decode-attention", default="auto", choices=["auto", "ragged", "padded"],
                   help="the graph engines' engine.decode_attention")
    p.add_argument("--decode-kernels", default="auto", choices=["auto", "fused", "modules"],
                   help="the graph engines' engine.decode_kernels (the fused-against-modules run needs fused)")
    args = p.parse_args()
    ckpt = make_checkpoint(args.size, RESULTS / "tmp" / f"bench-{args.size}")
    model = load_chattts(ckpt, device="cuda", dtype=torch.bfloat16)
    texts = [f"check sentence {i}: the quick brown fox jumps over the lazy dog." for i in range(16)]
    params = SamplingParams(temperature=0, max_new_frames=64, min_new_frames=64)
    report: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args)}

    samples = not args.no_samples
    engine_kw = {"max_num_seqs": 256, "max_model_len": args.max_model_len, "decode_attention": args.decode_attention,
                 "decode_kernels": args.decode_kernels}
    report["voice_sample_rows"] = samples
    graphed, engine = asyncio.run(generate(GraphEngine, model, texts, params, samples, **engine_kw))
    report["capture_seconds"] = engine.capture_seconds
    report["graphs"] = len(engine._graphs)
    # The eager run pads prefills and windows like the graphs do: bf16 kernels round differently
    # for other shapes, so only the same shapes can be compared for equality.
    eager, eager_engine = asyncio.run(generate(GraphEngine, model, texts, params, samples, **engine_kw,
                                               use_graphs=False, pad_shapes=True))
    reference, _ = asyncio.run(generate(ReferenceEngine, model, texts, params, samples, max_num_seqs=256,
                                        max_model_len=args.max_model_len))
    report["graph_equals_eager"] = graphed == eager
    report["first_frame_graph_differs_from_eager"] = [
        next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), None) for g, e in zip(graphed, eager)]
    # Refine-text rows: replayed graphs against eager padded steps and the reference refiner.
    refine_graphed, refine_eager = engine.refined, eager_engine.refined
    refine_reference = asyncio.run(refine_all(None, model, texts))
    report["refine_graph_equals_eager"] = refine_graphed == refine_eager
    report["refine_tokens_equal_to_reference"] = (
        f"{sum(a == b for g, r in zip(refine_graphed, refine_reference) for a, b in zip(g, r))}"
        f"/{sum(len(r) for r in refine_reference)}")
    same = sum(a == b for g, r in zip(graphed, reference) for a, b in zip(g, r))
    report["frames_equal_to_reference"] = f"{same}/{sum(len(r) for r in reference)}"
    first_diff = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), None) for g, r in zip(graphed, reference)]
    report["first_divergent_frame_per_request"] = first_diff
    report["decode_kernels"] = engine.describe()["decode_kernels"]
    if engine.fused_decode:  # the same graphs over the Llama modules: how far the fused trunk's codes agree
        modules, _ = asyncio.run(generate(GraphEngine, model, texts, params, samples,
                                          **{**engine_kw, "decode_kernels": "modules"}))
        report["fused_frames_equal_to_modules"] = (
            f"{sum(a == b for f, m in zip(graphed, modules) for a, b in zip(f, m))}/{sum(len(m) for m in modules)}")
        report["first_frame_fused_differs_from_modules"] = [
            next((i for i, (a, b) in enumerate(zip(f, m)) if a != b), None) for f, m in zip(graphed, modules)]
        report["fused_kernels_bf16_against_modules"] = kernel_rounding(model)
    if args.repeat:  # the same engine again: a difference here is run-to-run, not graph against eager
        for name, kw in (("graph", {}), ("eager", {"use_graphs": False, "pad_shapes": True})):
            again, _ = asyncio.run(generate(GraphEngine, model, texts, params, samples, **engine_kw, **kw))
            first = graphed if name == "graph" else eager
            report[f"{name}_run_twice_first_difference"] = [
                next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(first, again)]
    if args.equality_only:
        return write_report(report, args.out)

    # Raw step time per (batch, length bucket), CUDA events, median of replays: the engine's captured
    # steps, audio rows only and mixed with refine-text rows (text head and its sampling on every row),
    # beside a padded step (masked SDPA over the bucket) captured here, the ablation of the ragged
    # kernel. Contexts "mixed": each row's drawn from [32, bucket), one at the bucket's end (the
    # batch of long and short requests the bucket is chosen for); "full": every row at the end.
    state, eos = engine._state, engine._eos
    generator = torch.Generator().manual_seed(0)
    side, pool = torch.cuda.Stream(), torch.cuda.graph_pool_handle()
    steps = {}
    with torch.inference_mode():
        state.reset_sampling()
        state.text_index.fill_(state.scratch)  # no refine rows: the mixed graphs' text head runs on the scratch slot
        for batch in (1, 16, 64, 256):
            for length in (256, 1024):
                if (batch, length, 0) not in engine._graphs:
                    continue
                padded, _ = engine._capture(side, pool, lambda: decode_step(model.gpt, state, batch, length, eos))
                variants = {"engine": engine._graphs[(batch, length, 0)], "padded_sdpa": padded}
                if state.trunk is not None:  # the same step over the Llama modules: what the fused trunk saves
                    trunk, state.trunk = state.trunk, None
                    variants["modules"], _ = engine._capture(side, pool, lambda: decode_step(
                        model.gpt, state, batch, length, eos, None, engine._ragged(batch)))
                    state.trunk = trunk
                for width in sorted(k[2] for k in engine._graphs if k[:2] == (batch, length) and k[2]):
                    variants[f"engine_mixed_with_refine_width_{width}"] = engine._graphs[(batch, length, width)]
                for contexts in ("mixed", "full"):
                    start = torch.randint(32, length, (batch,), generator=generator)
                    if contexts == "full" or batch == 1:
                        start[:] = length - 1
                    start[0] = length - 1
                    start = start.to(state.position.device)
                    row = {}
                    for name, graph in variants.items():
                        # The step moves each row on by one: back to the drawn contexts before every replay.
                        row[name] = round(event_median_ms(graph.replay, runs=35, warmup=5,
                                                          before=lambda: state.position[:batch].copy_(start - 1)), 3)
                    steps[f"{batch}x{length}/{contexts}"] = row
                del padded, variants
    report["decode_attention"] = engine.describe()["decode_attention"]
    report["step_ms"] = steps

    def one_step_each(variants) -> dict:
        """One eager 256 x 1,024 step per variant (name -> (ragged, trunk)) from the same state: how far the
        second variant's hidden states and greedy codes are from the first's."""
        batch, length = 256, 1024
        start = torch.randint(32, length, (batch,), generator=generator).to(state.position.device)
        saved = {k: getattr(state, k).clone() for k in ("codes", "position", "generated", "history")}
        trunk, hidden = state.trunk, []
        with torch.inference_mode():
            for ragged, use in variants.values():
                for k, v in saved.items():
                    getattr(state, k).copy_(v)
                state.position[:batch] = start
                state.trunk = use
                decode_step(model.gpt, state, batch, length, eos, None, ragged)
                hidden.append(state.hidden[:batch].float().clone())
            state.trunk = trunk
            codes = [state.code_logits(h.to(model.gpt.dtype)).argmax(-1) for h in hidden]
        return {"max_abs_hidden_diff": (hidden[1] - hidden[0]).abs().max().item(),
                "max_abs_hidden": hidden[0].abs().max().item(),
                "greedy_codes_equal": f"{int((codes[0] == codes[1]).sum())}/{codes[0].numel()}"}

    # The ragged kernel against masked SDPA, and the fused trunk against the modules, on the same inputs.
    if engine.ragged_from is not None:
        report["ragged_vs_sdpa_256x1024"] = one_step_each({"sdpa": (False, state.trunk), "ragged": (True, state.trunk)})
    if state.trunk is not None:
        report["fused_vs_modules_256x1024"] = one_step_each({"modules": (engine._ragged(256), None),
                                                             "fused": (engine._ragged(256), state.trunk)})

    def median_ms(fn, stream=None, runs=30) -> float:
        stream = stream or torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
            times = []
            for _ in range(runs):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(stream)
                fn()
                b.record(stream)
                b.synchronize()
                times.append(a.elapsed_time(b))
        return statistics.median(times)

    # Prefill of newcomers (captured per (rows, prompt-length) bucket) and audio windows
    # (DVAE + Vocos per (rows, window length), on the engine's audio stream).
    with torch.inference_mode():
        state.prefill_long[:, 1] = state.scratch  # every row on the scratch slot: touches no real slot
        state.prefill_long[:, 0] = 48
        report["prefill_ms_length_bucket_64"] = {
            rows: {"graph_ms": median_ms(engine._prefill_graphs[(rows, 64, False)].replay),
                   "eager_ms": median_ms(lambda: prefill_step(model.gpt, state, rows, 64, eos,
                                                              engine._speaker_token), runs=5)}
            for rows in (1, 8, 32) if (rows, 64, False) in engine._prefill_graphs}
        frames = engine.windows.window_frames
        state.audio_windows[:, 0] = 0
        state.audio_windows[:, 1] = 0
        for hidden in engine.audio_paths:  # DVAE (codes) and Decoder (hidden states)
            path = "decoder" if hidden else "dvae"
            report[f"audio_window_ms_{frames}_frames_{path}"] = {
                rows: {"graph_ms": median_ms(engine._audio_graphs[(hidden, rows, frames)][0].replay,
                                             engine._audio_stream),
                       "eager_ms": median_ms(lambda: decode_windows(model, state, rows, frames, hidden),
                                             engine._audio_stream, runs=5)}
                for rows in (1, 8, 64) if (hidden, rows, frames) in engine._audio_graphs}
        report["graphs_by_kind"] = {
            "decode": sum(not k[2] for k in engine._graphs), "decode_mixed_with_refine": sum(k[2] > 0 for k in engine._graphs),
            "prefill": sum(not k[2] for k in engine._prefill_graphs),
            "refine_prefill": sum(k[2] for k in engine._prefill_graphs), "audio": len(engine._audio_graphs)}
    return write_report(report, args.out)


def kernel_rounding(model) -> dict:
    """engines.fused's kernels against the modules they replace, in bf16 on the GPU (where Triton rounds to
    nearest, as torch does): how many outputs differ, and by how much at most."""
    import torch
    import torch.nn.functional as F
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from chattts_runtime.engines import fused

    layer, llama = model.gpt.llama.layers[0], model.gpt.llama
    s = model.gpt.sizes
    generator = torch.Generator(device="cuda").manual_seed(0)
    b, d, heads = 256, s.head_dim, s.num_attention_heads
    dtype = model.gpt.dtype

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=generator) * scale).to(dtype)

    def differ(got, want):
        return {"differ": f"{int((got != want).sum())}/{want.numel()}",
                "max_abs": float((got.float() - want.float()).abs().max())}

    out = {}
    with torch.inference_mode():
        x, delta = randn(b, s.hidden_size, scale=3.0), randn(b, s.hidden_size)
        normed, total = fused.add_rms_norm(x, delta, layer.input_layernorm.weight, llama.norm.variance_epsilon)
        out["add"] = differ(total, x + delta)
        out["rms_norm"] = differ(normed, layer.input_layernorm(x + delta))
        gate_up = randn(b, 2 * s.intermediate_size, scale=3.0)
        out["silu_mul"] = differ(fused.silu_mul(gate_up), F.silu(gate_up[:, :s.intermediate_size])
                                 * gate_up[:, s.intermediate_size:])
        position = torch.randint(0, 1024, (b,), device="cuda", generator=generator)
        cos, sin = llama.rotary_emb(x[:, None, :], position[:, None])
        qkv = randn(b, 3 * heads * d)
        keys = torch.zeros(b, heads, 1024, d, dtype=dtype, device="cuda")
        values = torch.zeros_like(keys)
        q = fused.rotary_kv(qkv, cos[:, 0], sin[:, 0], position, keys, values, heads, heads)
        split = [t.view(b, 1, heads, d).transpose(1, 2) for t in qkv.split(heads * d, dim=1)]
        q_ref, k_ref = apply_rotary_pos_emb(split[0], split[1], cos, sin)
        rows = torch.arange(b, device="cuda")
        out["rotary_q"] = differ(q, q_ref)
        out["rotary_k"] = differ(keys[rows, :, position], k_ref[:, :, 0])
        out["v_write"] = differ(values[rows, :, position], split[2][:, :, 0])
    return out


def write_report(report: dict, out: str | None) -> int:
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
