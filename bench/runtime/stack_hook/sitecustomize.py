"""On PYTHONPATH for a profiled benchmark step only: every Python process it starts samples its stacks.

``bench/runtime/vllm_h200.sh`` puts this folder first on PYTHONPATH for its ``vllm_profile`` step
(with ``STACK_SAMPLES_DIR`` set); spawned children (vLLM's engine core) inherit both.
"""
try:
    from bench.runtime.stack_sampler import start_from_env

    start_from_env()
except Exception as err:  # a profiling aid must never stop the program it watches
    import sys

    print(f"stack sampler not started: {err!r}", file=sys.stderr)
