"""bfloat16 (and float16) against float32 for the GPT, on the same prompts: how much of the output changes?

    python -m bench.runtime.dtype_agreement --out DIR                  # CUDA: full size; CPU: tiny
    python -m bench.runtime.dtype_agreement --out DIR --engine reference

The same random checkpoint is loaded once per dtype, the GPT body in float32 and in each ``--dtypes``
(embeddings, heads, DVAE and Vocos stay float32 either way, as ``load_chattts`` keeps them), and
one engine per dtype runs the same ``PROMPTS`` (mixed: English and Chinese, a few words to a
paragraph) all at once, greedy and then sampled with a fixed seed per prompt. Per prompt and mode:

- code agreement: share of frames whose 4 codes are all equal, and the first frame that differs;
- mel distance: mean absolute difference of the natural-log mel spectrograms (100 bins) of the
  two outputs' audio, both decoded by the same float32 DVAE + Vocos (so only the GPT's dtype differs);
- audio SNR (dB): float32 audio as the signal, the difference as the noise.

Random weights make the GPT's logits nearly flat, the hardest case for precision: a trained
checkpoint's peaked distributions should agree more, never less. Writes
``dtype-agreement-<device>-<date>.json`` and ``.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.runtime.speech_api import RESULTS, make_checkpoint

# A fixed, mixed set (>= 16): short and long, English and Chinese, numbers and punctuation.
PROMPTS = [
    "Hello.",
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back at five thirty this afternoon.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Turn left at the second light, then keep going until you see the old stone bridge on your right.",
    "Our quarterly revenue grew by twelve percent, driven mostly by the new subscription plans in Europe "
    "and a strong holiday season in North America.",
    "你好。",
    "今天天气很好，我们去公园散步吧。",
    "这个模型可以把文字转换成自然流畅的语音。",
    "请在下一个路口向右转，然后沿着河边一直走，大约五分钟就能看到车站。",
    "Wait... what? No, that can't be right!",
    "One, two, three, four, five.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "我昨天买了三本书，其中一本是关于历史的，另外两本是小说。",
    "Good morning everyone, and welcome to the annual meeting. Before we begin, let me thank the team that "
    "organised today's event and everyone who travelled a long way to be here.",
    "OK.",
    "混合一点 English 和中文，看看会怎么样。",
    "The train to Zurich departs from platform nine at half past seven; passengers should board early.",
]
SEED_BASE = 1234


async def generate(engine, model, frames: int, greedy: bool) -> list[np.ndarray]:
    """Codes ``[frames, num_vq]`` of every prompt, all submitted at once."""
    from chattts_runtime.engines.base import SamplingParams, SynthesisRequest  # noqa: PLC0415

    speaker = model.speaker_for("alloy").numpy()

    async def one(i: int, text: str) -> np.ndarray:
        params = SamplingParams(temperature=0.0 if greedy else 0.3, top_p=0.7, top_k=20, repetition_penalty=1.05,
                                seed=SEED_BASE + i, max_new_frames=frames, min_new_frames=frames)
        prompt = model.tokenizer.build(text, with_speaker=True)
        chunks = [c.codes async for c in engine.submit(
            SynthesisRequest(f"{'g' if greedy else 's'}-{i}", prompt.input_ids, speaker, params))]
        return np.concatenate(chunks) if chunks else np.zeros((0, model.sizes.gpt.num_vq), np.int64)

    return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(PROMPTS))))


async def codes_for(dtype_name: str, args, checkpoint: Path, device: str):
    """(model, {mode: codes per prompt}) with the GPT in ``dtype_name``."""
    import torch  # noqa: PLC0415

    from chattts_runtime.engines.graph import GraphEngine  # noqa: PLC0415
    from chattts_runtime.engines.reference import ReferenceEngine  # noqa: PLC0415
    from chattts_runtime.model import load_chattts  # noqa: PLC0415

    model = load_chattts(checkpoint, device=device, dtype=getattr(torch, dtype_name))
    cls = GraphEngine if args.engine == "graph" else ReferenceEngine
    engine = cls(model, max_num_seqs=len(PROMPTS), max_waiting=4096, max_model_len=args.max_model_len)
    return model, await both_modes(engine, model, args.frames)


async def both_modes(engine, model, frames: int) -> dict[str, list[np.ndarray]]:
    """Every prompt's codes, greedy and seeded, from ``engine`` (started here, stopped after)."""
    await engine.start()
    try:
        return {mode: await generate(engine, model, frames, greedy=mode == "greedy") for mode in ("greedy", "seeded")}
    finally:
        await engine.stop()


def log_mel(audio, sample_rate: int = 24_000, n_fft: int = 1024, hop: int = 256, n_mels: int = 100):
    import torch  # noqa: PLC0415

    from chattts_runtime.testing import htk_mel_filterbank  # noqa: PLC0415

    wave = torch.as_tensor(audio, dtype=torch.float32)
    spec = torch.stft(wave, n_fft, hop, window=torch.hann_window(n_fft), return_complex=True).abs()
    fb = torch.as_tensor(htk_mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate), dtype=torch.float32)
    fb = fb if fb.shape[0] == n_mels else fb.T  # [n_mels, n_freqs]
    return torch.log(torch.clamp(fb @ spec, min=1e-5)).numpy()


def snr_db(ref_audio: np.ndarray, test_audio: np.ndarray) -> float:
    """SNR (dB) of ``test_audio`` against ``ref_audio`` (the signal) over their common length."""
    m = min(len(ref_audio), len(test_audio))
    noise = float(np.sum((ref_audio[:m] - test_audio[:m]) ** 2))
    signal = float(np.sum(ref_audio[:m] ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(max(signal, 1e-20) / noise))


def audio_distance(ref_audio: np.ndarray, test_audio: np.ndarray) -> dict:
    """Log-mel L1 and SNR (the reference as the signal) over the two waveforms' common length."""
    m = min(len(ref_audio), len(test_audio))
    mel_a, mel_b = log_mel(ref_audio[:m]), log_mel(test_audio[:m])
    return {"finite": bool(np.isfinite(test_audio).all()),  # a 16-bit overflow shows as inf/NaN audio
            "mel_l1": float(np.mean(np.abs(mel_a - mel_b))),
            "snr_db": snr_db(ref_audio, test_audio)}


def compare(reference: np.ndarray, test: np.ndarray, ref_audio: np.ndarray, test_audio: np.ndarray) -> dict:
    n = min(len(reference), len(test))
    same = (reference[:n] == test[:n]).all(axis=1) if n else np.zeros(0, bool)
    first_diff = int(np.argmin(same)) if n and not same.all() else n
    return {"frames": n, "frames_equal": int(same.sum()), "agreement": float(same.mean()) if n else 1.0,
            "first_difference": first_diff, "length_equal": len(reference) == len(test),
            **audio_distance(ref_audio, test_audio)}


def audio_tf32_rows(model, outputs: list[np.ndarray]) -> list[dict]:
    """The audio decoders with TF32 products (``engine.audio_precision: tf32``) against float32 on the same
    inputs: each float32 output's codes through the DVAE + Vocos, and seeded random hidden states of its
    length through the Decoder + Vocos. On a CPU there is no TF32: the two are the same."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(0)
    rows = []
    for i, codes in enumerate(outputs):
        if not len(codes):
            continue
        inputs = {"dvae": (model.codes_to_audio, torch.as_tensor(codes)[None])}
        if model.decoder is not None:
            hidden = torch.randn(1, len(codes), model.sizes.gpt.hidden_size, generator=generator)
            inputs["decoder"] = (model.hidden_to_audio, hidden)
        row: dict = {"prompt": i}
        for path, (decode, x) in inputs.items():
            float32 = decode(x).cpu().numpy()[0]
            model.audio_tf32 = True
            try:
                tf32 = decode(x).cpu().numpy()[0]
            finally:
                model.audio_tf32 = False
            row[path] = audio_distance(float32, tf32)
        rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    frames = sum(r["frames"] for r in rows)
    differing = [r["snr_db"] for r in rows if r["frames_equal"] != r["frames"]]
    return {"prompts": len(rows), "frame_agreement": sum(r["frames_equal"] for r in rows) / max(frames, 1),
            "identical_outputs": sum(r["frames_equal"] == r["frames"] for r in rows),
            "non_finite_outputs": sum(not r["finite"] for r in rows),
            "first_difference_median": statistics.median(r["first_difference"] for r in rows),
            "mel_l1_mean": statistics.fmean(r["mel_l1"] for r in rows),
            # Identical outputs have infinite SNR; the median of the others says how far the rest moved.
            "snr_db_median_differing": statistics.median(differing) if differing else float("inf")}


async def main_async(args) -> dict:
    import torch  # noqa: PLC0415

    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    checkpoint = make_checkpoint(args.size, RESULTS / "tmp" / f"bench-{args.size}")
    began = time.monotonic()
    reference_model, f32 = await codes_for("float32", args, checkpoint, device)
    report = {"engine": args.engine, "size": args.size, "device": device, "frames": args.frames,
              "max_model_len": args.max_model_len, "prompts": PROMPTS, "against_float32": {}}

    def audio_of(codes: np.ndarray) -> np.ndarray:
        if not len(codes):
            return np.zeros(0, np.float32)
        return reference_model.codes_to_audio(torch.as_tensor(codes)[None]).cpu().numpy()[0]

    for dtype_name in args.dtypes.split(","):
        model, out = await codes_for(dtype_name, args, checkpoint, device)
        del model
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        modes = report["against_float32"][dtype_name] = {}
        for mode in ("greedy", "seeded"):
            rows = [{"prompt": i, **compare(a, b, audio_of(a), audio_of(b))}
                    for i, (a, b) in enumerate(zip(f32[mode], out[mode]))]
            modes[mode] = {"summary": summarize(rows), "rows": rows}
    rows = audio_tf32_rows(reference_model, f32["seeded"])
    report["audio_tf32_vs_float32"] = {
        "rows": rows,
        "summary": {path: {"outputs": len(got), "mel_l1_mean": statistics.fmean(r["mel_l1"] for r in got),
                           "snr_db_median": statistics.median(r["snr_db"] for r in got),
                           "non_finite": sum(not r["finite"] for r in got)}
                    for path in ("dvae", "decoder") if (got := [r[path] for r in rows if path in r])}}
    report["seconds"] = round(time.monotonic() - began, 1)
    report["device_name"] = torch.cuda.get_device_name(0) if device == "cuda" else platform.machine()
    report["torch"] = torch.__version__
    return report


def markdown(report: dict, command: str) -> str:
    out = [f"# The GPT in 16 bits vs float32 on the same prompts ({report['date']})", "",
           f"Engine `{report['engine']}`, model size `{report['size']}` (random weights), {report['device_name']}, "
           f"torch {report['torch']}; {len(report['prompts'])} prompts x {report['frames']} frames; "
           f"command: `{command}`; {report['seconds']} s.", "",
           "| GPT dtype vs float32 | mode | frames with all 4 codes equal | identical outputs "
           "| first difference (median frame) | log-mel L1 (mean) | audio SNR of the differing (median dB) | non-finite audio |",
           "|---|---|---|---|---|---|---|---|"]
    for dtype_name, modes in report["against_float32"].items():
        for mode, data in modes.items():
            s = data["summary"]
            out.append(f"| {dtype_name} | {mode} | {s['frame_agreement']:.1%} | {s['identical_outputs']} / "
                       f"{s['prompts']} | {s['first_difference_median']} | {s['mel_l1_mean']:.3f} | "
                       f"{s['snr_db_median_differing']:.1f} | {s['non_finite_outputs']} |")
    out += ["", "Audio of both outputs decoded by the same float32 DVAE + Vocos. Random weights: nearly flat "
            "logits, the hardest case for precision (see the module docstring).", "",
            "| audio decoders with TF32 products vs float32 (same inputs) | outputs | log-mel L1 (mean) "
            "| audio SNR (median dB) | non-finite audio |", "|---|---|---|---|---|"]
    for path, s in report.get("audio_tf32_vs_float32", {}).get("summary", {}).items():
        name = "DVAE + Vocos (the codes above)" if path == "dvae" else "Decoder + Vocos (seeded random hidden states)"
        out.append(f"| {name} | {s['outputs']} | {s['mel_l1_mean']:.4f} | {s['snr_db_median']:.1f} | {s['non_finite']} |")
    out += ["", "`engine.audio_precision: tf32` on CUDA; on a CPU both are float32 (infinite SNR)."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RESULTS), help="folder for the JSON and MD results")
    p.add_argument("--engine", default="graph", choices=("graph", "reference"), help="default: graph (the default engine)")
    p.add_argument("--size", default=None, help="checkpoint size: full (default on CUDA), small, tiny (default on CPU)")
    p.add_argument("--frames", type=int, default=None, help="frames per prompt (default 128 on CUDA, 32 on CPU)")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--dtypes", default="bfloat16,float16", help="GPT dtypes compared with float32")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = p.parse_args(argv)
    import torch  # noqa: PLC0415

    cuda = torch.cuda.is_available() and args.device != "cpu"
    args.size = args.size or ("full" if cuda else "tiny")
    args.frames = args.frames or (128 if cuda else 32)
    report = asyncio.run(main_async(args))
    report["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    command = "python -m bench.runtime.dtype_agreement " + " ".join(argv if argv is not None else sys.argv[1:])
    report["command"] = command
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"dtype-agreement-{report['device']}-{report['date']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    stem.with_suffix(".md").write_text(markdown(report, command))
    for dtype_name, modes in report["against_float32"].items():
        for mode, data in modes.items():
            print(dtype_name, mode, json.dumps(data["summary"]), flush=True)
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
