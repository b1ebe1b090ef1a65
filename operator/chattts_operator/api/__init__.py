"""The API of chattts-operator: pydantic models, the single source of truth for the CRDs.

``CRD_KINDS`` lists the top-level kinds; ``python -m chattts_operator.crdgen`` writes one
CRD per entry into deploy/crds/. A new kind: a module here defining GROUP, VERSION, KIND,
PLURAL, SINGULAR, SCOPE (optionally SHORT_NAMES, PRINTER_COLUMNS, SCALE_SUBRESOURCE) and a
whole-object model with `spec` and `status`, plus one line below.
"""
from __future__ import annotations

from . import chattts, sharepolicy
from .chattts import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    ChatTTSDeployment,
    ChatTTSDeploymentSpec,
    ChatTTSDeploymentStatus,
    EngineSpec,
    GpuProfile,
    GpuSpec,
    MemoryPlan,
    ModelShape,
    ModelSpec,
    ResolvedGpu,
    parse_quantity,
    quantity_to_mib,
    validate_name,
)
from .common import Condition, CrdKind

CHATTTS_DEPLOYMENT = CrdKind.from_module(chattts, ChatTTSDeployment)
GPU_SHARE_POLICY = CrdKind.from_module(sharepolicy, sharepolicy.GPUSharePolicy)

CRD_KINDS: list[CrdKind] = [CHATTTS_DEPLOYMENT, GPU_SHARE_POLICY]

__all__ = [
    "API_VERSION", "CHATTTS_DEPLOYMENT", "CRD_KINDS", "GPU_SHARE_POLICY", "GROUP", "KIND", "PLURAL", "VERSION",
    "ChatTTSDeployment", "ChatTTSDeploymentSpec", "ChatTTSDeploymentStatus", "Condition", "CrdKind",
    "EngineSpec", "GpuProfile", "GpuSpec", "MemoryPlan", "ModelShape", "ModelSpec", "ResolvedGpu",
    "parse_quantity", "quantity_to_mib", "validate_name",
]
