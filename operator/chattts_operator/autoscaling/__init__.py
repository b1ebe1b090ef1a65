"""Autoscaling on scheduler_deadline_wait, read top-down: decision.py (pure: the capacity
signal, hysteresis, the reversal guard), forecast.py (pure: the per-minute demand record and
its floor), signals.py (the metric readers), status.py, tuning.py, then controller.py (the
loop and its I/O; it exports each decision through core.metrics).

``decide`` is pure (no I/O, time passed in); the readers in ``signals`` do the I/O and
``controller.Autoscaler`` wires them together.
"""
from chattts_operator.autoscaling.decision import (
    Decision,
    FleetSample,
    History,
    decide,
    per_replica_load_limit,
    raw_recommendation,
)
from chattts_operator.autoscaling.forecast import DemandHistory

__all__ = ["DemandHistory", "Decision", "FleetSample", "History", "decide", "per_replica_load_limit",
           "raw_recommendation"]
