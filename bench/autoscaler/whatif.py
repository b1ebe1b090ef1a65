"""What-ifs behind the fourth round's rules (`python -m bench.autoscaler.whatif`): figures for
the results' analysis, not the bar. Each swaps one part of the operator's decision for the run
(restored after) and runs the operator alone on the traces and calibrations of the benchmark.

- ``detection``: the operator without the growth room (``GROWTH_SIGMAS`` 0, the third round's
  growth), told of the 10x crowd at a given scrape and asking maxReplicas at once with no rate
  policy: the best any detection rule could do without a spare.
- ``matched-step``: the step time learned from matched windows (the newest frame rate over the
  window, the running gauges averaged over the same window, the same Ready replicas) instead of
  running / the mean of the window's frame rates.
- ``rules``: the fifth round's three rules, each reverted alone (the cold-start sizing by the
  arrivals, the one-spare cap on the growth room, 3.5 sigma kept by a scale-down), crowd and bursts.
"""
from __future__ import annotations

import argparse
import contextlib

import numpy as np

from bench.autoscaler import traces as trace_lib
from bench.autoscaler.simulate import CALIBRATIONS, initial_replicas, operator_spec
from bench.autoscaler.fleet import flaps, minute_quantiles, simulate
from bench.autoscaler.policies import Operator
from chattts_operator.autoscaling import decision


def matched_step_seconds(previous, samples, limit):
    """step = time-averaged running / the newest frame rate, over the same window and replicas."""
    usable = [s for s in samples if s.requests_running is not None and s.ready_replicas > 0]
    latest = samples[-1] if samples else None
    if (len(usable) < 2 or usable[-1] is not latest or not latest.frames_per_second
            or len({s.ready_replicas for s in usable}) > 1
            or any(s.requests_running / s.ready_replicas < 0.75 * limit for s in usable)):
        return previous
    span = usable[-1].time - usable[0].time
    running = sum((a.requests_running + b.requests_running) / 2.0 * (b.time - a.time)
                  for a, b in zip(usable, usable[1:])) / span
    observed = running / latest.frames_per_second
    return observed if previous is None else 0.8 * previous + 0.2 * observed


@contextlib.contextmanager
def swapped(name: str, value):
    saved = getattr(decision, name)
    setattr(decision, name, value)
    try:
        yield
    finally:
        setattr(decision, name, saved)


class ToldAt(Operator):
    """The operator, but from ``told`` on (for 10 minutes) it asks maxReplicas at once."""

    def __init__(self, spec, told: float):
        super().__init__(spec, name=f"told at {told:g} s")
        self.told = told

    def evaluate(self, now, current_replicas, sample):
        desired = super().evaluate(now, current_replicas, sample)
        return self.spec.max_replicas if self.told <= now < self.told + 600 else desired


def run(calibration_name: str, trace_name: str, make) -> str:
    calibration = CALIBRATIONS[calibration_name]()
    maker = next(m for m in trace_lib.ALL if m.__name__ == trace_name)
    trace = maker(rate_scale=calibration.rate_scale)
    spec = operator_spec(calibration.target)
    contender = make(spec)
    result = simulate(calibration.model, trace.arrivals, trace.frames, contender,
                      initial_replicas(trace, calibration.model), trace.duration, 7, outages=trace.outages,
                      wait_outages=trace.wait_outages)
    per_minute = minute_quantiles(trace.arrivals, result.waits, trace.duration, calibration.model.quantile)
    return (f"{calibration_name:9s} {trace_name:7s} {contender.name:16s} "
            f"violation min {int(np.sum(per_minute > spec.target_seconds)):3d}  "
            f"replica-h {result.replica_seconds / 3600:6.2f}  within 10 min {flaps(result.changes)}  "
            f"step {contender.history.step_seconds}")


def no_rate_policy(spec):
    up = spec.behavior.scale_up.model_copy(update={"policies": []})
    return spec.model_copy(update={"behavior": spec.behavior.model_copy(update={"scale_up": up})})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscaler.whatif", description=__doc__)
    parser.add_argument("what", choices=("detection", "matched-step", "rules"))
    args = parser.parse_args(argv)
    if args.what == "detection":
        with swapped("GROWTH_SIGMAS", 0.0):
            for calibration in ("anchor", "reference"):
                for told in (2400.0, 2415.0, 2430.0):  # the crowd starts rising at 2400 s
                    print(run(calibration, "crowd", lambda spec, t=told: ToldAt(no_rate_policy(spec), t)), flush=True)
    elif args.what == "rules":
        reverts = (("as built", None, None), ("backlog sizing while starting", "arrivals_in_flight", lambda *a: None),
                   ("room unbounded", "ROOM_SPARES", 10 ** 6), ("3 sigma kept", "SHRINK_SIGMAS", 3.0))
        for label, name, value in reverts:
            with swapped(name, value) if name else contextlib.nullcontext():
                for calibration in CALIBRATIONS:
                    for trace in ("crowd", "bursts"):
                        print(label + ": " + run(calibration, trace, lambda spec: Operator(spec)), flush=True)
    else:
        for label, learner in (("as built", decision.learn_step_seconds), ("matched windows", matched_step_seconds)):
            with swapped("learn_step_seconds", learner):
                for calibration in CALIBRATIONS:
                    for trace in ("crowd", "bursts"):
                        print(label + ": " + run(calibration, trace, lambda spec: Operator(spec)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
