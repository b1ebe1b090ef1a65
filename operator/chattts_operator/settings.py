"""Operator-wide settings, read once from the environment (the Helm chart sets them).

Every field is ``CHATTTS_OPERATOR_<FIELD IN UPPER CASE>``; lists are comma-separated:

    CHATTTS_OPERATOR_GPU_PROFILE=hami
    CHATTTS_OPERATOR_WATCH_NAMESPACES=tts,tts-staging
    CHATTTS_OPERATOR_MIG_PROFILES=1g.18gb,2g.35gb,3g.71gb,7g.141gb

A wrong value stops the operator at start-up with the variable's name in the message.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from chattts_operator.api.chattts import GpuProfile

ENV_PREFIX = "CHATTTS_OPERATOR_"
MIG_PROFILE_PATTERN = re.compile(r"^(?P<slices>[1-9])g\.(?P<gb>[0-9]+)gb(\+me)?$")
# NVIDIA's profiles for the H100 80GB; H200 clusters set 1g.18gb,1g.35gb,2g.35gb,3g.71gb,4g.71gb,7g.141gb.
DEFAULT_MIG_PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


class SettingsError(ValueError):
    """A setting from the environment is invalid."""


class OperatorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_profile: GpuProfile = Field(GpuProfile.GPU_MEMORY, description="Default GPU sharing profile.")
    gpu_memory_resource: str = Field("nvidia.com/gpu.memory", description="MiB resource of the gpu-memory profile.")
    gpu_resource: str = Field("nvidia.com/gpu", description="Whole-GPU resource (whole-gpu; HAMi's device count).")
    hami_memory_resource: str = Field("nvidia.com/gpumem", description="HAMi's per-GPU memory resource, MiB.")
    mig_resource_prefix: str = Field("nvidia.com/mig-", description="Prefix of MIG resources.")
    mig_profiles: tuple[str, ...] = Field(DEFAULT_MIG_PROFILES, description="MIG profiles the cluster offers.")
    node_memory_label: str = Field(
        "nvidia.com/gpu.memory", description="GFD node label: MiB per GPU. Empty: no node affinity on it."
    )
    node_product_label: str = Field("nvidia.com/gpu.product", description="GFD node label: GPU product name.")
    gpu_toleration_key: str = Field(
        "nvidia.com/gpu", description="Serving pods tolerate this NoSchedule taint key. Empty: none."
    )
    runtime_image: str = Field("chattts-runtime:0.1.0", min_length=1, description="Default runtime image.")
    runtime_image_pull_policy: str = Field("IfNotPresent", pattern=r"^(Always|IfNotPresent|Never)$")
    watch_namespaces: tuple[str, ...] = Field((), description="Namespaces to watch; empty: the whole cluster.")
    metrics_port: int = Field(9090, ge=0, le=65535, description="Operator /metrics port (0: pick a free one).")
    health_port: int = Field(8080, ge=0, le=65535, description="kopf liveness endpoint /healthz port (0: off).")
    resync_interval_seconds: float = Field(300.0, gt=0, description="Every object is reconciled at least this often.")
    resync_concurrency: int = Field(8, ge=1, le=256, description="Objects reconciled at once by the resync loop.")
    utilization_warning: float = Field(0.9, gt=0, le=1, description="Warn above this gpuMemoryUtilization.")

    @field_validator("mig_profiles")
    @classmethod
    def _mig_profiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for profile in value:
            if not MIG_PROFILE_PATTERN.match(profile):
                raise ValueError(f"MIG profile {profile!r} must look like 1g.10gb or 3g.40gb")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "OperatorSettings":
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            key = ENV_PREFIX + name.upper()
            if key not in env:
                continue
            raw = env[key].strip()
            if info.annotation == tuple[str, ...]:
                values[name] = tuple(part.strip() for part in raw.split(",") if part.strip())
            else:
                values[name] = raw
        known = {ENV_PREFIX + n.upper() for n in cls.model_fields}
        unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known)
        if unknown:
            raise SettingsError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            problems = "; ".join(
                f"{ENV_PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}" if e["loc"] else e["msg"] for e in err.errors()
            )
            raise SettingsError(f"invalid operator settings: {problems}") from None
