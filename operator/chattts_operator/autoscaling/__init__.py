"""Autoscaling on scheduler_deadline_wait: the pure decision and the metric readers.

``decide`` is pure (no I/O, time passed in); the readers in ``metrics`` do the I/O and
the kopf handler in ``chattts_operator.autoscaling.controller`` wires them together.
"""
from chattts_operator.autoscaling.decision import (
    Decision,
    FleetSample,
    History,
    decide,
    per_replica_load_limit,
    raw_recommendation,
)

__all__ = ["Decision", "FleetSample", "History", "decide", "per_replica_load_limit", "raw_recommendation"]
