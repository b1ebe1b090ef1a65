"""The ratios of one ``h200.sh --ab`` pair: the same step served by this tree (A) and by revision REV (B).

    python -m bench.runtime.ab_summary --results DIR --step fixed128 --rev 19b6802

Reads the two ``bench.runtime`` reports of the step from DIR (A: ``runtime-*-<tag>.json``, B: the same
with ``-ab-<REV>``) and prints, per concurrency level, throughput and time to first audio of both and
A/B's ratio (throughput above 1 and TTFA below 1 mean A is better).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# h200.sh's step -> the tag suffix its bench.runtime report carries.
STEP_TAGS = {"graph": "graph", "faithful": "faithful", "faithful_norefine": "faithful-refine-off",
             "faithful_ownvoice": "faithful-own-voice", "faithful_stream": "faithful-stream",
             "fixed128": "fixed128", "fixed128_decoder": "fixed128-decoder", "reference": "reference"}


def find_pair(results: Path, step: str, rev: str) -> tuple[Path, Path]:
    tag = STEP_TAGS[step]
    b = sorted(results.glob(f"runtime-*-{tag}-ab-{rev}.json"))
    a = sorted(p for p in results.glob(f"runtime-*-{tag}.json"))
    if not a or not b:
        raise FileNotFoundError(f"{step}: no {'A' if not a else 'B'} report in {results} "
                                f"(runtime-*-{tag}{'' if not a else f'-ab-{rev}'}.json)")
    return a[-1], b[-1]


def ratio_rows(a: dict, b: dict) -> list[dict]:
    """One row per concurrency level present in both reports (the sequential baseline as level 'seq')."""
    def levels(report: dict) -> dict:
        out = {"seq": report["sequential"]}
        out.update({row["concurrency"]: row for row in report["levels"]})
        return out

    la, lb = levels(a), levels(b)
    rows = []
    for level in la:
        if level not in lb:
            continue
        ra, rb = la[level], lb[level]
        row = {"level": level}
        for key in ("throughput_audio_s_per_s", "ttfa_p50_s", "ttfa_p99_s"):
            row[key] = (ra[key], rb[key], ra[key] / rb[key] if rb[key] else float("nan"))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.runtime.ab_summary", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--step", required=True, choices=sorted(STEP_TAGS))
    p.add_argument("--rev", required=True)
    args = p.parse_args(argv)
    try:
        a_path, b_path = find_pair(args.results, args.step, args.rev)
    except FileNotFoundError as err:
        print(f"A/B {args.step}: {err}")
        return 1
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    print(f"A/B {args.step}: A = this tree ({a_path.name}), B = {args.rev} ({b_path.name}); ratio = A/B")
    print("level | audio s/s A, B, ratio | TTFA p50 A, B, ratio | TTFA p99 A, B, ratio")
    for row in ratio_rows(a, b):
        cells = [f"{x[0]:.3f}, {x[1]:.3f}, {x[2]:.2f}x" for x in
                 (row["throughput_audio_s_per_s"], row["ttfa_p50_s"], row["ttfa_p99_s"])]
        print(f"{row['level']} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
