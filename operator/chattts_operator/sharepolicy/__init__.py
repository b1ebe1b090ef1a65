"""Pure scheduling logic for GPUSharePolicy: windows (time -> shares) and the planner
(policy, members, nodes, now -> caps, suspends, resumes). No I/O here; the kopf handler
in ``chattts_operator.sharepolicy.controller`` reads the cluster and applies plans."""
from chattts_operator.sharepolicy.planner import (  # noqa: F401
    Action,
    OfflineMember,
    OnlineMember,
    Plan,
    PoolNode,
    plan,
)
from chattts_operator.sharepolicy.windows import Resolution, resolve  # noqa: F401
