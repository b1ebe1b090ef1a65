"""`python -m bench.runtime`: the speech API benchmark (`bench/runtime/speech_api.py`, which other benchmarks import)."""
from bench.runtime.speech_api import main

if __name__ == "__main__":  # not in a spawned child, which imports this module as __mp_main__
    raise SystemExit(main())
