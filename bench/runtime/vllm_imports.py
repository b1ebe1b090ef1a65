"""Does every module a vllm engine start imports load here? One line per module, missing names first.

    python -m bench.runtime.vllm_imports [--out FILE.json]

The modules are those ``engines/vllm_engine.py`` and ``vllm_plugin`` import, and those vLLM's engine
core, GPU worker, model runner, Llama body, attention backend, sampler, compiler and quantization
methods import when an engine starts (traced on vLLM 0.26.0: ``bench/runtime/VLLM_H200.md``). All are
imported in one interpreter, in order; each that fails is imported again in a fresh one, so a module
left half-initialised does not hide what the next one needs. A missing module is printed as
``MISSING <module>: <name it lacked>`` (the name to carry a wheel for). Exits 1 if anything fails.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

MODULES = [
    "vllm", "vllm.platforms.cuda", "vllm._custom_ops", "vllm.vllm_flash_attn",
    "vllm.config", "vllm.engine.arg_utils", "vllm.utils.argparse_utils", "vllm.sampling_params", "vllm.inputs",
    "vllm.v1.engine.async_llm", "vllm.v1.engine.core", "vllm.v1.engine.core_client", "vllm.v1.engine.exceptions",
    "vllm.v1.executor.multiproc_executor", "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.v1.structured_output",
    "vllm.model_executor.models.llama", "vllm.model_executor.models.utils", "vllm.model_executor.model_loader",
    "vllm.model_executor.layers.quantization", "vllm.model_executor.layers.quantization.auto_awq",
    "vllm.model_executor.layers.quantization.fp8", "vllm.model_executor.layers.quantization.kv_cache",
    "vllm.v1.attention.selector", "vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.sample.sampler", "vllm.v1.sample.logits_processor", "vllm.v1.metrics.loggers",
    "vllm.compilation.backends", "vllm.compilation.cuda_graph", "vllm.distributed", "vllm.forward_context",
    "vllm.entrypoints.llm",
    # The project's side.
    "chattts_runtime.engines.vllm_engine", "chattts_runtime.vllm_plugin.logits", "chattts_runtime.vllm_plugin.model",
    "chattts_runtime.server",
    # Imported lazily on some engine paths (compile debugging, process titles, hashing).
    "depyf", "setproctitle", "blake3",
]

_PROBE = """
import importlib, json, sys, time, traceback
for name in sys.argv[1:]:
    t0 = time.monotonic()
    try:
        importlib.import_module(name)
        row = {"ok": True}
    except ModuleNotFoundError as err:
        row = {"ok": False, "missing": err.name, "error": str(err)}
    except BaseException as err:
        row = {"ok": False, "error": f"{type(err).__name__}: {err}"[:600],
               "where": traceback.format_exc().splitlines()[-3:]}
    print("ROW " + json.dumps({"module": name, "seconds": round(time.monotonic() - t0, 1), **row}), flush=True)
"""


def probe(names: list[str], timeout: float) -> list[dict]:
    """Import ``names`` in order in one fresh interpreter: a row per module (a crash or timeout: the rest fail)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, *names], capture_output=True, text=True, timeout=timeout)
        stdout, tail = proc.stdout, f"exit {proc.returncode}: {proc.stderr[-600:]}"
    except subprocess.TimeoutExpired as err:
        stdout, tail = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or ""), \
            f"timed out after {timeout:.0f} s"
    rows = {r["module"]: r for r in (json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ROW "))}
    return [rows.get(name, {"module": name, "ok": False, "error": tail}) for name in names]


def versions() -> dict:
    import importlib.metadata as md  # noqa: PLC0415

    out = {}
    for name in ("vllm", "torch", "triton", "transformers", "pydantic", "msgspec", "pyzmq", "fastapi", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    p.add_argument("--modules", default=None, help="comma-separated modules (default: the engine start's)")
    p.add_argument("--timeout", type=float, default=60, help="seconds for one module alone (all: 4x)")
    args = p.parse_args(argv)
    modules = args.modules.split(",") if args.modules else MODULES
    print("versions:", json.dumps(versions()), flush=True)
    rows = probe(modules, args.timeout * 4)
    retried = [i for i, r in enumerate(rows) if not r["ok"]][:12]
    for i in retried:  # alone, in a fresh interpreter: its own first missing name
        rows[i] = {**probe([modules[i]], args.timeout)[0], "retried_alone": True}
    for row in rows:
        name = row["module"]
        if row["ok"]:
            print(f"ok       {name} ({row.get('seconds')} s)", flush=True)
        elif row.get("missing"):
            print(f"MISSING  {name}: {row['missing']}", flush=True)
        else:
            print(f"FAILED   {name}: {row['error']} {row.get('where', '')}", flush=True)
    missing = sorted({r["missing"].split(".")[0] for r in rows if r.get("missing")})
    failed = [r["module"] for r in rows if not r["ok"]]
    print(f"missing top-level names: {' '.join(missing) or 'none'}; failed modules: {len(failed)} of {len(rows)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"versions": versions(), "rows": rows, "missing": missing}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
