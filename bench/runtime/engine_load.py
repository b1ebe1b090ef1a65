"""Engine alone under load: concurrent requests straight into an engine, no HTTP.

``python -m bench.runtime.engine_load --engine graph --size full --concurrency 1,16,64,256 [--audio]``:
with ``--audio`` the graph engine also decodes each stream's audio windows (``want_audio``), as it
does behind the speech API, and "first" is the first audio chunk; without it, frames only.
per level, frames per second (and audio seconds per second), time to first frame p50/p99 and
per-stream generation RTF. Compared with ``python -m bench.runtime`` (the same load through the
speech API) it says how much of the end-to-end gap is the engine and how much the server around it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.runtime.speech_api import RESULTS, make_checkpoint, percentile

FRAME_S = 512 / 24_000


async def level(engine, model, concurrency: int, rounds: int, frames: int, audio: bool = False) -> dict:
    from chattts_runtime.engines.base import SamplingParams, SynthesisRequest

    params = SamplingParams(temperature=0.3, top_p=0.7, top_k=20, repetition_penalty=1.05, seed=0,
                            max_new_frames=frames, min_new_frames=frames)
    speaker = model.speaker_for("alloy").numpy()
    firsts, rtfs, total = [], [], 0

    async def worker(w: int) -> None:
        nonlocal total
        for r in range(rounds):
            prompt = model.tokenizer.build(f"benchmark sentence {w}-{r}: the quick brown fox.", with_speaker=True)
            start = time.perf_counter()
            first, n = None, 0
            async for chunk in engine.submit(SynthesisRequest(f"l{concurrency}-{w}-{r}", prompt.input_ids, speaker,
                                                              params, want_audio=audio)):
                out = chunk.audio if audio else chunk.codes
                if out is not None and len(out) and first is None:
                    first = time.perf_counter() - start
                n += len(chunk.codes)
            total += n
            firsts.append(first)
            rtfs.append((time.perf_counter() - start) / (n * FRAME_S))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "frames_per_s": total / wall, "audio_s_per_s": total * FRAME_S / wall,
            "first_frame_p50_s": percentile(firsts, 0.5), "first_frame_p99_s": percentile(firsts, 0.99),
            "rtf_p50": percentile(rtfs, 0.5), "rtf_p99": percentile(rtfs, 0.99)}


async def main_async(args) -> list[dict]:
    import torch

    from chattts_runtime.engines.graph import GraphEngine
    from chattts_runtime.engines.reference import ReferenceEngine
    from chattts_runtime.model import load_chattts

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_chattts(make_checkpoint(args.size, RESULTS / "tmp" / f"bench-{args.size}"), device=device,
                         dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    levels = [int(c) for c in args.concurrency.split(",")]
    cls = GraphEngine if args.engine == "graph" else ReferenceEngine
    engine = cls(model, max_num_seqs=max(levels), max_waiting=4096, max_model_len=args.max_model_len)
    await engine.start()
    rows = []
    try:
        await level(engine, model, 1, 1, 8, args.audio)  # warm-up
        intervals = [float(x) for x in args.admit_intervals.split(",")] if args.admit_intervals else [None]
        for c in levels:
            for interval in intervals:
                if interval is not None:
                    engine.admit_interval = interval  # read by the worker at every admission
                rows.append({**await level(engine, model, c, args.rounds, args.frames, args.audio),
                             "admit_interval_s": getattr(engine, "admit_interval", None)})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        await engine.stop()
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", default="graph", choices=("graph", "reference"))
    p.add_argument("--size", default="full")
    p.add_argument("--frames", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="1,16,64,256")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--audio", action="store_true", help="decode audio windows in the engine (graph engine)")
    p.add_argument("--admit-intervals", default=None,
                   help="graph engine: comma-separated admission intervals (s) to run at each level")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.audio and args.engine != "graph":
        p.error("--audio needs --engine graph")
    rows = asyncio.run(main_async(args))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"engine": args.engine, "size": args.size, "frames": args.frames, "audio": args.audio,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
