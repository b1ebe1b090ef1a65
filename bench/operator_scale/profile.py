"""Summarise a py-spy ``--format raw`` profile: where the operator's CPU goes (pure parsing).

    python -m bench.operator_scale.profile PROFILE.txt [--top 25]
"""
from __future__ import annotations

import argparse
import re
from collections import Counter

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]+)(?::\d+)?\)$")


def parse(lines) -> list[tuple[list[tuple[str, str]], int]]:
    """[(frames as (function, file), samples)] from collapsed stacks 'f (file:line);g (...) N'."""
    stacks = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue  # a line cut short when the profiler was stopped
        frames = []
        for part in stack.split(";"):
            match = _FRAME.match(part)
            frames.append((match["func"], match["file"]) if match else (part, ""))
        stacks.append((frames, int(count)))
    return stacks


# Buckets by the first frame (from the leaf up) that matches: what the time is spent *for*.
BUCKETS = (
    ("logging", lambda f, p: p.startswith("logging/")),
    ("JSON encode/decode", lambda f, p: p.startswith("json/")),
    ("deep copies", lambda f, p: p == "copy.py" or p.endswith("/copy.py")),
    ("pydantic", lambda f, p: "pydantic" in p),
    ("yaml", lambda f, p: p.startswith("yaml/")),
    ("TLS / sockets", lambda f, p: p.startswith("ssl.py") or p.startswith("asyncio/selector_events")
     or p.startswith("asyncio/sslproto")),
    ("aiohttp", lambda f, p: p.startswith("aiohttp/")),
    ("kubernetes_asyncio (de)serialisation", lambda f, p: p.startswith("kubernetes_asyncio/")),
    ("chattts_operator", lambda f, p: p.startswith("chattts_operator/")),
    ("kopf", lambda f, p: p.startswith("kopf/")),
)


def summarise(stacks, top: int = 25) -> str:
    total = sum(n for _, n in stacks) or 1
    buckets: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, n in stacks:
        for func, path in reversed(frames):
            label = next((name for name, test in BUCKETS if test(func, path)), None)
            if label:
                buckets[label] += n
                break
        else:
            buckets["other"] += n
        for key in {f"{func} ({path})" for func, path in frames}:
            inclusive[key] += n
    lines = [f"{total} samples", "", "by what the leaf is doing:"]
    lines += [f"  {v / total:6.1%}  {k}" for k, v in buckets.most_common()]
    lines += ["", f"inclusive, top {top} project/kopf frames:"]
    shown = [(k, v) for k, v in inclusive.most_common() if "chattts_operator/" in k or "kopf/" in k]
    lines += [f"  {v / total:6.1%}  {k}" for k, v in shown[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    with open(args.profile) as handle:
        print(summarise(parse(handle), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
