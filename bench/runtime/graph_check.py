"""GPU check of the graph engine: graph replay equals eager steps, and raw step times per bucket.

``python -m bench.runtime.graph_check --size full`` (needs CUDA). Prints and writes JSON
(``--out``): whether greedy codes from replayed graphs equal the same engine's eager
steps and how many frames agree with the reference engine (bf16 on GPU: kernels differ,
so agreement is reported, not asserted), graph capture time, and the median time of one
replayed decode step at batch 1/16/64/256 (length bucket 256), the engine-level
counterpart of ``shared/anchors/chattts_gpt_anchor.py``'s ``cudagraph-static`` rows; and the
GPU time of a captured prefill (1/8/32 newcomers, 64-token bucket) and of an audio window
batch (1/8/64 windows of the steady window length), each against the same code run eagerly.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from bench.runtime.__main__ import RESULTS, make_checkpoint


async def generate(engine_cls, model, texts, params, **kw):
    """Greedy codes of ``texts`` and, on an engine that refines, its refine-text ids of them."""
    from chattts_runtime.engines.base import SynthesisRequest

    engine = engine_cls(model, **kw)
    await engine.start()

    async def one(i, text):
        prompt = model.tokenizer.build(text, with_speaker=True)
        req = SynthesisRequest(f"c{i}", prompt.input_ids, model.speaker_for("alloy").numpy(), params)
        return [f for c in [c async for c in engine.submit(req)] for f in c.codes.tolist()]

    try:
        codes = await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
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
    from chattts_runtime.engines.graph import GraphEngine, decode_step, decode_windows, prefill_step
    from chattts_runtime.engines.reference import ReferenceEngine
    from chattts_runtime.model import load_chattts

    p = argparse.ArgumentParser()
    p.add_argument("--size", default="full")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    ckpt = make_checkpoint(args.size, RESULTS / "tmp" / f"bench-{args.size}")
    model = load_chattts(ckpt, device="cuda", dtype=torch.bfloat16)
    texts = [f"check sentence {i}: the quick brown fox jumps over the lazy dog." for i in range(16)]
    params = SamplingParams(temperature=0, max_new_frames=64, min_new_frames=64)
    report: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

    graphed, engine = asyncio.run(generate(GraphEngine, model, texts, params, max_num_seqs=256,
                                           max_model_len=args.max_model_len))
    report["capture_seconds"] = engine.capture_seconds
    report["graphs"] = len(engine._graphs)
    # The eager run pads prefills and windows like the graphs do: bf16 kernels round differently
    # for other shapes, so only the same shapes can be compared for equality.
    eager, eager_engine = asyncio.run(generate(GraphEngine, model, texts, params, max_num_seqs=256,
                                    max_model_len=args.max_model_len, use_graphs=False, pad_shapes=True))
    reference, _ = asyncio.run(generate(ReferenceEngine, model, texts, params, max_num_seqs=256,
                                        max_model_len=args.max_model_len))
    report["graph_equals_eager"] = graphed == eager
    # Refine-text on the text slots: replayed graphs against eager padded steps and the reference refiner.
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

    # Raw step time: replay each (batch, 256) graph many times, CUDA events, median.
    state, eos = engine._state, engine._eos
    steps = {}
    with torch.inference_mode():
        state.reset_sampling()
        state.position.fill_(100)
        for batch in (1, 16, 64, 256):
            graph = engine._graphs[(batch, 256)]
            for _ in range(10):
                graph.replay()
            times = []
            for _ in range(50):
                state.position[:batch] = 100  # stay inside the length bucket
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            eager_times = []
            for _ in range(5):
                state.position[:batch] = 100
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                decode_step(model.gpt, state, batch, 256, eos)
                torch.cuda.synchronize()
                eager_times.append((time.perf_counter() - t0) * 1e3)
            steps[batch] = {"graph_ms": statistics.median(times), "eager_ms": statistics.median(eager_times)}
    report["step_ms_length_bucket_256"] = steps

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
            rows: {"graph_ms": median_ms(engine._prefill_graphs[(rows, 64)].replay),
                   "eager_ms": median_ms(lambda: prefill_step(model.gpt, state, rows, 64, eos,
                                                              engine._speaker_token), runs=5)}
            for rows in (1, 8, 32) if (rows, 64) in engine._prefill_graphs}
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
        # Refine-text: one replayed step of the text slots (21k-token head, sampling inside).
        text = engine._text
        report["refine_step_ms_length_256"] = {
            batch: median_ms(engine._text_graphs[(batch, 256)].replay)
            for batch in (1, 16, 64, 256) if (batch, 256) in engine._text_graphs}
        report["graphs_by_kind"] = {"decode": len(engine._graphs), "prefill": len(engine._prefill_graphs),
                                    "audio": len(engine._audio_graphs), "refine_decode": len(engine._text_graphs),
                                    "refine_prefill": len(engine._text_prefill_graphs)}
        del text
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
