"""Parse a Python script without running it (h200.sh --smoke: steps that need CUDA are only parsed on the CPU).

    python3 bench/runtime/parse_only.py FILE [FILE...]

A file that is absent (the anchor's scripts live in ../shared/anchors, copied into the ignored .anchor
only for a GPU call) is reported and skipped; a syntax error exits 1.
"""

import ast
import sys
from pathlib import Path


def main(paths: list[str]) -> int:
    failed = 0
    for name in paths:
        path = Path(name)
        if not path.is_file():
            print(f"parse_only: {name} is not here (skipped: it travels only to the GPU machine)")
            continue
        try:
            ast.parse(path.read_text(encoding="utf-8"), filename=name)
        except SyntaxError as err:
            print(f"parse_only: {name}: {err}", file=sys.stderr)
            failed = 1
        else:
            print(f"parse_only: {name} parses")
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
