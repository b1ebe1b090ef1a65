"""What the faithful pipeline costs on the vllm engine: the Decoder path's hidden-state channel and
refine-text, measured in one run against the codes-only path (the baseline).

    .venv-vllm/bin/python -m bench.vllm_hidden_channel                       # CPU, tiny model
    .venv-vllm/bin/python -m bench.vllm_hidden_channel --size small --concurrency 1,8,32

One ``VLLMEngine`` in this process (no HTTP: the engine's own cost), a random ``endless``
checkpoint (every request yields exactly ``--frames`` frames). At each concurrency level,
rounds alternate the three modes so drift hits all alike:

* ``codes``: audio frames, codebook carriers only (``num_vq`` logprobs per frame): the baseline;
* ``hidden``: the Decoder path, ``num_vq + hidden_size`` raw logits per frame (the hidden state);
* ``refine``: refine-text generations of the same number of text tokens (greedy, end held back).

Reported: median steps per second (frames or text tokens, summed over requests) and the ratio
to ``codes``. Writes ``bench/results/vllm-hidden-channel-<device>-<size>-<date>.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.runtime.speech_api import RESULTS, bench_checkpoint, environment

MODES = ("codes", "hidden", "refine")


async def one_round(engine, model, mode: str, concurrency: int, frames: int, tag: str) -> float:
    from chattts_runtime.engines.base import SynthesisRequest
    from chattts_runtime.engines.refine import TextRefiner
    from chattts_runtime.model.refine import RefineParams
    from chattts_runtime.model.sampling import SamplingParams

    params = SamplingParams(temperature=0, min_new_frames=frames, max_new_frames=frames)
    if mode == "refine":
        refiner = TextRefiner(model, max_model_len=engine.max_model_len)
        prompts = [refiner.prompt_ids(f"benchmark sentence {i}: the quick brown fox.", RefineParams())
                   for i in range(concurrency)]

        async def run(i):
            tokens = await engine.refine_text(f"{tag}-{i}", prompts[i], params)
            assert len(tokens) == frames, len(tokens)
    else:
        async def run(i):
            prompt = model.tokenizer.build(f"benchmark sentence {i}: the quick brown fox.", with_speaker=False)
            req = SynthesisRequest(f"{tag}-{i}", prompt.input_ids, None, params, want_hidden=mode == "hidden")
            got = 0
            async for chunk in engine.submit(req):
                got += len(chunk.codes)
                if mode == "hidden" and len(chunk.codes):
                    assert chunk.hidden is not None and len(chunk.hidden) == len(chunk.codes)
            assert got == frames, got

    t0 = time.perf_counter()
    await asyncio.gather(*(run(i) for i in range(concurrency)))
    return concurrency * frames / (time.perf_counter() - t0)


async def bench(args) -> dict:
    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.engines.vllm_engine import VLLMEngine
    from chattts_runtime.model import load_chattts

    checkpoint, sizes = bench_checkpoint(args.size)
    levels = [int(c) for c in args.concurrency.split(",")]
    model = load_chattts(checkpoint)
    config = RuntimeConfig.model_validate({
        "model": {"path": str(checkpoint)}, "engine_kind": "vllm", "device": "cpu",
        "engine": {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "max_num_seqs": max(levels)}})
    engine = VLLMEngine(model, config)
    await engine.start()
    rows = []
    try:
        await one_round(engine, model, "hidden", 2, 8, "warm")
        await one_round(engine, model, "refine", 2, 8, "warm-r")
        for c in levels:
            samples = {m: [] for m in MODES}
            for r in range(args.rounds):
                for m in MODES:
                    samples[m].append(await one_round(engine, model, m, c, args.frames, f"{m}-{c}-{r}"))
            medians = {m: statistics.median(v) for m, v in samples.items()}
            row = {"concurrency": c, "steps_per_s_median": medians, "samples": samples,
                   "ratio_to_codes": {m: medians[m] / medians["codes"] for m in MODES}}
            rows.append(row)
            print(f"concurrency {c}: " + ", ".join(f"{m} {medians[m]:.1f}/s ({row['ratio_to_codes'][m]:.2f}x)"
                                                   for m in MODES), flush=True)
    finally:
        await engine.stop()
    import vllm

    env = environment("cpu", "in-process")
    env["vllm"] = vllm.__version__
    return {"date": dt.date.today().isoformat(), "command": " ".join([Path(sys.executable).name, "-m",
                                                                      "bench.vllm_hidden_channel", *sys.argv[1:]]),
            "params": {"size": args.size, "hidden_size": sizes.hidden_size, "layers": sizes.num_hidden_layers,
                       "frames": args.frames, "rounds": args.rounds, "levels": levels},
            "environment": env, "levels": rows}


def write_report(report: dict) -> Path:
    p = report["params"]
    stem = f"vllm-hidden-channel-cpu-{p['size']}-{report['date']}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2))
    lines = [f"# vllm engine: the Decoder path's hidden-state channel and refine-text ({report['date']})", "",
             f"Command: `{report['command']}`", "",
             f"Model: `{p['size']}` random weights (hidden {p['hidden_size']}, {p['layers']} layers), float32, "
             f"in-process `VLLMEngine`, {p['frames']} steps per request, greedy, median of {p['rounds']} rounds "
             f"(modes interleaved). Environment: {json.dumps(report['environment'])}.", "",
             "Steps per second summed over requests (frames for codes/hidden, text tokens for refine); "
             "ratio to `codes` (carriers only) measured in the same run.", "",
             "| concurrency | codes (/s) | hidden (/s) | hidden / codes | refine (/s) | refine / codes |",
             "|---|---|---|---|---|---|"]
    for row in report["levels"]:
        m, r = row["steps_per_s_median"], row["ratio_to_codes"]
        lines.append(f"| {row['concurrency']} | {m['codes']:.1f} | {m['hidden']:.1f} | {r['hidden']:.2f}x "
                     f"| {m['refine']:.1f} | {r['refine']:.2f}x |")
    path = RESULTS / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=("tiny", "small"))
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "chattts-operator" / "vllm"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    print(write_report(asyncio.run(bench(args))))


if __name__ == "__main__":
    main()
