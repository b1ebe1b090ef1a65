"""CPU cost of each pipeline stage per request, on a small random model: refine-text, audio codes, decode.

    python -m bench.stages                       # small model (256 wide, 6 layers), ~2 minutes here
    python -m bench.stages --size tiny --requests 3

One request at a time (no batching), float32, upstream's default sampling for both passes:
refine-text (text head, up to ``--refine-tokens`` tokens; temperature 0.7, top-p 0.7, top-k 20),
audio codes (``--frames`` frames; random weights never end early: the checkpoint is ``endless``),
then the Decoder path (hidden states -> Decoder -> Vocos, upstream's default) and the DVAE path
(codes -> DVAE -> Vocos). Text normalization is not measured here (issue 14, part A).
Writes ``bench/results/stages-cpu-<date>.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import time

from bench.runtime.speech_api import BENCH_TEXTS, RESULTS, bench_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=("tiny", "small"))
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--frames", type=int, default=128, help="audio frames per request (21.3 ms each)")
    ap.add_argument("--refine-tokens", type=int, default=384, help="upstream's max_new_token for refine")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    import torch

    from chattts_runtime.engines.base import SynthesisRequest
    from chattts_runtime.engines.reference import ReferenceEngine
    from chattts_runtime.engines.refine import TextRefiner
    from chattts_runtime.model import load_chattts
    from chattts_runtime.model.refine import RefineParams, upstream_refine_sampling
    from chattts_runtime.model.sampling import SamplingParams

    torch.set_num_threads(args.threads)
    checkpoint, gpt_sizes = bench_checkpoint(args.size)
    model = load_chattts(checkpoint)
    refiner = TextRefiner(model, max_model_len=4096)
    speaker = model.speaker_for("alloy").numpy()

    async def codes_of(text: str, seed: int):
        engine = ReferenceEngine(model, max_model_len=4096)
        await engine.start()
        try:
            prompt = model.tokenizer.build(text, with_speaker=True)
            req = SynthesisRequest(f"b{seed}", prompt.input_ids, speaker, SamplingParams(
                max_new_frames=args.frames, min_new_frames=1, seed=seed), want_hidden=True)
            codes, hidden = [], []
            async for chunk in engine.submit(req):
                codes.append(chunk.codes)
                if chunk.hidden is not None:
                    hidden.append(chunk.hidden)
            return np.concatenate(codes), np.concatenate(hidden)
        finally:
            await engine.stop()

    rows = []
    for i in range(args.requests + 1):  # the first one warms up and is not counted
        text = BENCH_TEXTS[i]
        t0 = time.perf_counter()
        refined = refiner.refine(text, RefineParams(sampling=upstream_refine_sampling(
            max_new_frames=args.refine_tokens, seed=i)))
        t1 = time.perf_counter()
        codes, hidden = asyncio.run(codes_of(refined.text or text, i))
        t2 = time.perf_counter()
        with torch.inference_mode():
            model.hidden_to_audio(torch.from_numpy(hidden)[None])
            t3 = time.perf_counter()
            audio = model.codes_to_audio(torch.from_numpy(codes)[None])
            t4 = time.perf_counter()
        if i:
            rows.append({"refine_s": t1 - t0, "refine_tokens": len(refined.token_ids), "codes_s": t2 - t1,
                         "frames": len(codes), "decoder_s": t3 - t2, "dvae_s": t4 - t3,
                         "audio_s": audio.shape[-1] / 24_000})

    def med(key):
        return statistics.median(r[key] for r in rows)

    summary = {
        "date": dt.date.today().isoformat(), "size": args.size, "gpt": {"hidden": gpt_sizes.hidden_size,
        "layers": gpt_sizes.num_hidden_layers, "heads": gpt_sizes.num_attention_heads}, "threads": args.threads,
        "cpu_count": os.cpu_count(), "requests": args.requests, "torch": torch.__version__,
        "median": {k: med(k) for k in rows[0]},
        "per_token_ms": {"refine": 1e3 * med("refine_s") / med("refine_tokens"),
                         "codes": 1e3 * med("codes_s") / med("frames")},
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"stages-cpu-{summary['date']}"
    stem.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    m = summary["median"]
    lines = [
        f"# Pipeline stages per request, CPU ({summary['date']})", "",
        f"`python -m bench.stages --size {args.size} --requests {args.requests} --frames {args.frames} "
        f"--refine-tokens {args.refine_tokens} --threads {args.threads}`: random `{args.size}` model (GPT "
        f"{gpt_sizes.hidden_size} wide, {gpt_sizes.num_hidden_layers} layers), float32, one request at a time, "
        f"{args.threads} threads on a shared {os.cpu_count()}-core machine; medians of {args.requests} requests "
        f"after one warm-up. Random weights rarely end early, so refine runs close to its 384-token cap; a "
        f"trained model refines a sentence in a few dozen tokens, so scale by the per-token figure.", "",
        "| stage | median s per request | per token / frame | share |", "|---|---|---|---|",
    ]
    total = m["refine_s"] + m["codes_s"] + m["decoder_s"]
    for name, key, unit in (("refine-text", "refine_s", f"{summary['per_token_ms']['refine']:.2f} ms x "
                                                      f"{m['refine_tokens']:.0f} tokens"),
                            ("audio codes", "codes_s", f"{summary['per_token_ms']['codes']:.2f} ms x "
                                                     f"{m['frames']:.0f} frames"),
                            ("decode: Decoder + Vocos (default)", "decoder_s", ""),
                            ("decode: DVAE + Vocos", "dvae_s", "")):
        share = f"{100 * m[key] / total:.0f}%" if key != "dvae_s" else "(alternative)"
        lines.append(f"| {name} | {m[key]:.3f} | {unit} | {share} |")
    lines += ["", f"Audio per request: {m['audio_s']:.2f} s. Normalization is not measured here (part A)."]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
