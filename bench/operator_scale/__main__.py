"""`python -m bench.operator_scale`: the operator-at-scale benchmark (`bench/operator_scale/scale.py`, which other benchmarks import)."""
from bench.operator_scale.scale import main

if __name__ == "__main__":  # not in a spawned child, which imports this module as __mp_main__
    raise SystemExit(main())
