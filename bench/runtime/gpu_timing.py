"""Timing of GPU work between two CUDA events: the one way the GPU checks of this folder time a replay."""
from __future__ import annotations

import statistics
from typing import Callable


def event_median_ms(run: Callable[[], None], runs: int, warmup: int = 0,
                    before: Callable[[], None] | None = None) -> float:
    """Median milliseconds of ``run()`` over ``runs`` timed calls after ``warmup`` untimed ones;
    ``before()`` (untimed) resets whatever ``run`` moves on, ahead of every call."""
    import torch  # noqa: PLC0415  (CUDA machines only)

    times = []
    for i in range(warmup + runs):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)
