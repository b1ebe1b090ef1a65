"""On PYTHONPATH for a GPU-profiled benchmark step only (``h200.sh --gpu-profile STEP``): the engine process
records short profiler windows of the GPU's work (``bench.runtime.gpu_profile``)."""
try:
    from bench.runtime.gpu_profile import start_from_env

    start_from_env()
except Exception as err:  # a profiling aid must never stop the program it watches
    import sys

    print(f"gpu profile not started: {err!r}", file=sys.stderr)
