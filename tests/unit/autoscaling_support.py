"""What the autoscaling unit tests share: a fixed clock, a replica's slots and load limit, and
an enabled AutoscalingSpec with the given ``maxReplicas`` (each file picks its own)."""
from __future__ import annotations

from chattts_operator.api.autoscaling import AutoscalingSpec
from chattts_operator.autoscaling import per_replica_load_limit

NOW = 1_000_000.0
SLOTS = 16.0
LIMIT = per_replica_load_limit(SLOTS, 0.99)  # ~8.18 requests in flight per replica


def autoscaling_spec(max_replicas: int, **overrides) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate({"enabled": True, "minReplicas": 1, "maxReplicas": max_replicas,
                                           **overrides})
