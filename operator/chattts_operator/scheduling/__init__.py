"""Pure scheduling logic for GPUSharePolicy: windows (time -> shares) and the planner
(policy, members, nodes, now -> caps, suspends, resumes). No I/O here; the kopf handler
in ``chattts_operator.handlers.sharepolicy`` reads the cluster and applies plans."""
from chattts_operator.scheduling.planner import (  # noqa: F401
    Action,
    OfflineMember,
    OnlineMember,
    Plan,
    PoolNode,
    plan,
)
from chattts_operator.scheduling.windows import Resolution, resolve  # noqa: F401
