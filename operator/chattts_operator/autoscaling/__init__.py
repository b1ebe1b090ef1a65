"""Autoscaling on scheduler_deadline_wait, read top-down: decision.py (pure), signals.py (the
metric readers), status.py, tuning.py, then controller.py (the loop and its I/O).

``decide`` is pure (no I/O, time passed in); the readers in ``signals`` do the I/O and
``controller.Autoscaler`` wires them together.
"""
from chattts_operator.autoscaling.forecast import DemandHistory
from chattts_operator.autoscaling.decision import (
    Decision,
    FleetSample,
    History,
    decide,
    per_replica_load_limit,
    raw_recommendation,
)

__all__ = ["DemandHistory", "Decision", "FleetSample", "History", "decide", "per_replica_load_limit", "raw_recommendation"]
