"""`python -m bench.autoscaler`: the autoscaler's simulated fleet benchmark (`bench/autoscaler/simulate.py`, which other benchmarks import)."""
from bench.autoscaler.simulate import main

if __name__ == "__main__":  # not in a spawned child, which imports this module as __mp_main__
    raise SystemExit(main())
