"""GPU memory of each runtime engine, measured, next to what the operator's planner predicts.

    python -m bench.runtime.memory_probe --out DIR                       # on the GPU: full size, 64/128/256
    python -m bench.runtime.memory_probe --out DIR --size tiny --seqs 2,4  # on CPU (a smoke run; no CUDA figures)

For each engine that runs on the GPU machine (graph, reference; vLLM has no CUDA build there) and
each ``--seqs`` level, one child process (so every figure starts from zero and owns its CUDA
context): load the random checkpoint, start the engine (the graph engine captures its graphs),
run ``seqs`` concurrent requests (graph: with audio windows decoded in the engine, as behind the
speech API; reference: long enough to grow its KV cache to ``--reference-max-model-len``), then
record ``torch.cuda`` allocated/reserved after load, after start and at peak, the device's used
memory (``cudaMemGetInfo``, the CUDA context included) and nvidia-smi's figure for the process
when it shows one.

The prediction is ``chattts_operator.deployment.memory.plan_memory`` for the same engine, shape
(counted from the loaded model), dtype, ``maxNumSeqs`` and ``maxModelLen``, restricted to what
one engine process holds (the graph plan's second weight copy, second CUDA context and the speech
API's decode belong to the speech API's process, not run here). ``predicted_allocator_mib`` leaves
the CUDA context out and compares with torch's peak reserved; ``predicted_process_mib`` keeps it and
compares with the device's used memory.

Writes ``memory-probe-<device>-<date>.json`` and ``.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench.runtime.speech_api import REPO, RESULTS, make_checkpoint

MIB = 1 << 20
TEXT = "memory probe sentence {i}: the quick brown fox jumps over the lazy dog."
# Parts of a plan held by the speech API's process, not by the engine's (graph engine, engine.process auto).
SPEECH_API_PARTS = ("speechApiDecode",)


def _operator_on_path() -> None:
    """The planner is the operator's (pure: pydantic only); bench/runtime/h200.sh puts only the runtime on the path."""
    if str(REPO / "operator") not in sys.path:
        sys.path.insert(0, str(REPO / "operator"))


def model_shape(model):
    """The planner's ModelShape counted from a loaded model (exact for any checkpoint size)."""
    _operator_on_path()
    from chattts_operator.api.chattts import ModelShape  # noqa: PLC0415

    g = model.sizes.gpt
    linear = sum(m.weight.numel() for m in model.gpt.llama.modules() if type(m).__name__ == "Linear")
    gpt_total = sum(p.numel() for p in model.gpt.parameters())
    auxiliary = sum(p.numel() for m in (model.dvae, model.decoder, model.vocos, model.encoder) if m is not None
                    for p in m.parameters())
    return ModelShape(num_layers=g.num_hidden_layers, num_kv_heads=g.num_key_value_heads, head_dim=g.head_dim,
                      hidden_size=g.hidden_size, linear_params=linear, other_params=gpt_total - linear,
                      auxiliary_params=auxiliary)


def predicted(kind: str, shape, seqs: int, max_model_len: int, dtype: str) -> dict:
    """What the planner says one engine process holds (MiB), part by part."""
    _operator_on_path()
    from chattts_runtime.config import WeightFormat  # noqa: PLC0415

    from chattts_operator.api.chattts import EngineSpec  # noqa: PLC0415
    from chattts_operator.deployment.memory import plan_memory  # noqa: PLC0415

    engine = EngineSpec(kind=kind, max_num_seqs=seqs, max_model_len=max_model_len, dtype=dtype)
    plan = plan_memory(shape=shape, weight_format=WeightFormat.FP16, engine=engine, gpu_memory_mib=1 << 24)
    parts = {k: v for k, v in plan.parts.items() if k not in SPEECH_API_PARTS}
    copies = plan.weight_copies
    parts["weights"] = -(-parts["weights"] // copies)  # one process, one copy
    parts["cudaContexts"] = parts["cudaContexts"] // copies
    allocator = sum(v for k, v in parts.items() if k != "cudaContexts")
    return {"parts": parts, "predicted_allocator_mib": allocator,
            "predicted_process_mib": allocator + parts["cudaContexts"], "plan_message": plan.message}


def nvidia_smi_process_mib(pid: int) -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return int(fields[1])
    return None


async def run_requests(engine, model, seqs: int, frames: int, want_audio: bool) -> int:
    """``seqs`` concurrent requests of exactly ``frames`` frames; returns the frames generated."""
    from chattts_runtime.engines.base import SamplingParams, SynthesisRequest  # noqa: PLC0415

    params = SamplingParams(temperature=0.3, top_p=0.7, top_k=20, repetition_penalty=1.05, seed=0,
                            max_new_frames=frames, min_new_frames=frames)
    speaker = model.speaker_for("alloy").numpy()

    async def one(i: int) -> int:
        prompt = model.tokenizer.build(TEXT.format(i=i), with_speaker=True)
        n = 0
        async for chunk in engine.submit(SynthesisRequest(f"probe-{i}", prompt.input_ids, speaker, params,
                                                          want_audio=want_audio)):
            n += len(chunk.codes)
        return n

    return sum(await asyncio.gather(*(one(i) for i in range(seqs))))


async def child(args) -> dict:
    """One (engine, seqs) measurement in this process."""
    import torch  # noqa: PLC0415

    from chattts_runtime.engines.graph import GraphEngine  # noqa: PLC0415
    from chattts_runtime.engines.reference import ReferenceEngine  # noqa: PLC0415
    from chattts_runtime.model import load_chattts  # noqa: PLC0415

    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = "cuda" if cuda else "cpu"
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype if cuda else "float32"]
    checkpoint = make_checkpoint(args.size, RESULTS / "tmp" / f"bench-{args.size}")

    def allocator() -> dict:
        if not cuda:
            return {}
        torch.cuda.synchronize()
        return {"allocated_mib": round(torch.cuda.memory_allocated() / MIB, 1),
                "reserved_mib": round(torch.cuda.memory_reserved() / MIB, 1)}

    began = time.monotonic()
    model = load_chattts(checkpoint, device=device, dtype=dtype)
    loaded = allocator()
    kind = args.child_engine
    max_len = args.max_model_len if kind == "graph" else args.reference_max_model_len
    cls = GraphEngine if kind == "graph" else ReferenceEngine
    engine = cls(model, max_num_seqs=args.child_seqs, max_waiting=4096, max_model_len=max_len)
    await engine.start()
    started = allocator()
    prompt_len = len(model.tokenizer.build(TEXT.format(i=args.child_seqs), with_speaker=True).input_ids)
    frames = args.frames if kind == "graph" else max_len - prompt_len - 1
    try:
        generated = await run_requests(engine, model, args.child_seqs, frames, want_audio=kind == "graph")
    finally:
        await engine.stop()
    row = {"engine": kind, "seqs": args.child_seqs, "max_model_len": max_len, "frames_per_request": frames,
           "frames_generated": generated, "device": device, "dtype": str(dtype).removeprefix("torch."),
           "seconds": round(time.monotonic() - began, 1), "weights": loaded, "after_start": started,
           "rss_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if cuda:
        free, total = torch.cuda.mem_get_info()
        row.update(peak_allocated_mib=round(torch.cuda.max_memory_allocated() / MIB, 1),
                   peak_reserved_mib=round(torch.cuda.max_memory_reserved() / MIB, 1),
                   device_used_mib=round((total - free) / MIB, 1),
                   nvidia_smi_process_mib=nvidia_smi_process_mib(os.getpid()),
                   device_name=torch.cuda.get_device_name(0))
    row.update(predicted(kind, model_shape(model), args.child_seqs, max_len, row["dtype"]))
    if cuda:
        row["reserved_over_predicted"] = round(row["peak_reserved_mib"] / row["predicted_allocator_mib"], 3)
        row["device_over_predicted"] = round(row["device_used_mib"] / row["predicted_process_mib"], 3)
    return row


def run_child(args, engine: str, seqs: int) -> dict:
    cmd = [sys.executable, "-m", "bench.runtime.memory_probe", "--child-engine", engine, "--child-seqs", str(seqs),
           "--size", args.size, "--frames", str(args.frames), "--max-model-len", str(args.max_model_len),
           "--reference-max-model-len", str(args.reference_max_model_len), "--dtype", args.dtype,
           "--device", args.device]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=args.child_timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"engine": engine, "seqs": seqs, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    return json.loads(lines[-1])


def markdown(report: dict) -> str:
    out = [f"# Runtime engines' GPU memory vs the planner ({report['date']})", "",
           f"Device: {report['device_name']}; torch {report['torch']}; model size `{report['size']}`; "
           f"command: `{report['command']}`.", "",
           "Measured in one process per row (engine alone, no speech API). Predicted = the operator's planner "
           "for one engine process (`bench/runtime/memory_probe.py` says which parts).", "",
           "| engine | seqs | maxModelLen | weights alloc | after start alloc / reserved | peak alloc / reserved "
           "| device used | nvidia-smi | predicted (allocator / +context) | reserved / predicted |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        if "error" in r:
            out.append(f"| {r['engine']} | {r['seqs']} | - | error: {r['error'][:120]!r} |  |  |  |  |  |  |")
            continue
        w, s = r.get("weights", {}), r.get("after_start", {})
        out.append(
            f"| {r['engine']} | {r['seqs']} | {r['max_model_len']} | {w.get('allocated_mib', '-')} | "
            f"{s.get('allocated_mib', '-')} / {s.get('reserved_mib', '-')} | "
            f"{r.get('peak_allocated_mib', '-')} / {r.get('peak_reserved_mib', '-')} | {r.get('device_used_mib', '-')} | "
            f"{r.get('nvidia_smi_process_mib') or '-'} | {r['predicted_allocator_mib']} / {r['predicted_process_mib']} | "
            f"{r.get('reserved_over_predicted', '-')} |")
    out += ["", "MiB throughout. Predicted parts per row are in the JSON (`parts`)."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RESULTS), help="folder for the JSON and MD results")
    p.add_argument("--size", default=None, help="checkpoint size: full (default on CUDA), small, tiny (default on CPU)")
    p.add_argument("--engines", default="graph,reference")
    p.add_argument("--seqs", default=None, help="maxNumSeqs levels (default 64,128,256 on CUDA, 2,4 on CPU)")
    p.add_argument("--max-model-len", type=int, default=1024, help="graph engine (its cache is allocated up front)")
    p.add_argument("--reference-max-model-len", type=int, default=128,
                   help="reference engine: its requests run to this length, so its cache grows to its worst")
    p.add_argument("--frames", type=int, default=64, help="graph engine: frames per request")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="on CUDA (CPU: float32)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--child-timeout", type=float, default=300)
    p.add_argument("--child-engine", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-seqs", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch  # noqa: PLC0415

    cuda = torch.cuda.is_available() and args.device != "cpu"  # the parent never initialises CUDA
    args.size = args.size or ("full" if cuda else "tiny")
    if args.child_engine:
        print(json.dumps(asyncio.run(child(args))), flush=True)
        return 0
    make_checkpoint(args.size, RESULTS / "tmp" / f"bench-{args.size}")  # once, before the children
    levels = [int(s) for s in (args.seqs or ("64,128,256" if cuda else "2,4")).split(",")]
    rows = []
    for engine in args.engines.split(","):
        for seqs in levels:
            rows.append(run_child(args, engine, seqs))
            print(json.dumps(rows[-1]), flush=True)
    names = [r["device_name"] for r in rows if "device_name" in r]  # the parent keeps off the GPU
    device_name = names[0] if names else platform.processor() or platform.machine()
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    report = {"date": date, "device_name": device_name, "torch": torch.__version__, "size": args.size,
              "command": "python -m bench.runtime.memory_probe " + " ".join(argv if argv is not None else sys.argv[1:]),
              "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"memory-probe-{'cuda' if cuda else 'cpu'}-{date}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    stem.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {stem}.json and .md")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
