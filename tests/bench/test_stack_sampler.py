"""bench/runtime/stack_sampler.py (the GPU runs' profiler) and vllm_check's variant expansion, on the CPU."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from bench.runtime.vllm_check import parse_variant, variant_name, with_16bit_bases

REPO = Path(__file__).resolve().parents[2]


def test_the_hook_samples_every_process_a_program_starts_and_names_where_it_spins(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text(textwrap.dedent("""
        import multiprocessing, time

        def spin_in_the_child():
            end = time.time() + 0.6
            while time.time() < end:
                sum(range(500))

        if __name__ == "__main__":
            child = multiprocessing.get_context("spawn").Process(target=spin_in_the_child)
            child.start()
            child.join()
    """))
    env = {**os.environ, "STACK_SAMPLES_DIR": str(tmp_path / "stacks"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "bench" / "runtime" / "stack_hook"), str(REPO)])}
    subprocess.run([sys.executable, str(program)], env=env, check=True, timeout=60)
    files = sorted((tmp_path / "stacks").glob("stacks-*.txt"))
    assert len(files) >= 2  # the parent and the spawned child, each its own file
    child = [f.read_text() for f in files if "spin_in_the_child" in f.read_text()]
    assert child, [f.read_text()[:300] for f in files]
    summary = child[0].split("# folded")[0]
    assert "## thread MainThread" in summary and "prog.py:spin_in_the_child" in summary


def test_without_the_variable_nothing_is_sampled(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "bench" / "runtime" / "stack_hook"), str(REPO)])}
    env.pop("STACK_SAMPLES_DIR", None)
    out = subprocess.run([sys.executable, "-c", "from bench.runtime import stack_sampler as s; "
                          "import threading; print(s._SAMPLER, [t.name for t in threading.enumerate()])"],
                         env=env, capture_output=True, text=True, check=True, timeout=60, cwd=tmp_path)
    assert out.stdout.strip() == "None ['MainThread']"  # the hook ran, and started no sampler


def test_8bit_checks_get_their_16bit_base_once():
    fp8, awq, base = parse_variant("bfloat16:graphs:fp8"), parse_variant("bfloat16:graphs:awq"), parse_variant("bfloat16:graphs")
    assert with_16bit_bases([fp8, awq], set()) == [base, fp8, awq]
    assert with_16bit_bases([fp8], {variant_name(*base)}) == [fp8]  # an earlier call of this lease kept it
    assert with_16bit_bases([parse_variant("graph"), parse_variant("reference-math")], set()) == [
        parse_variant("graph"), parse_variant("reference-math")]
