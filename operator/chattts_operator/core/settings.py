"""Operator-wide settings, read once from the environment (the Helm chart sets them) by
``app.build`` and handed to every controller: nothing else reads the environment.

Grouped by prefix; every field is ``<PREFIX><FIELD IN UPPER CASE>``, lists comma-separated:

    CHATTTS_OPERATOR_GPU_PROFILE=hami                    (OperatorSettings)
    CHATTTS_OPERATOR_WATCH_NAMESPACES=tts,tts-staging
    CHATTTS_OPERATOR_MIG_PROFILES=1g.18gb,2g.35gb,3g.71gb,7g.141gb
    CHATTTS_AUTOSCALER_INTERVAL_SECONDS=15               (OperatorSettings.autoscaler)
    CHATTTS_SHAREPOLICY_RESYNC_SECONDS=30                (OperatorSettings.sharepolicy)

A wrong or unknown variable under one of the prefixes stops the operator at start-up with
the variable's name in the message.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from chattts_operator.api.chattts import GpuProfile

ENV_PREFIX = "CHATTTS_OPERATOR_"
AUTOSCALER_ENV_PREFIX = "CHATTTS_AUTOSCALER_"
SHAREPOLICY_ENV_PREFIX = "CHATTTS_SHAREPOLICY_"
MIG_PROFILE_PATTERN = re.compile(r"^(?P<slices>[1-9])g\.(?P<gb>[0-9]+)gb(\+me)?$")
# NVIDIA's profiles for the H100 80GB; H200 clusters set 1g.18gb,1g.35gb,2g.35gb,3g.71gb,4g.71gb,7g.141gb.
DEFAULT_MIG_PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


class SettingsError(ValueError):
    """A setting from the environment is invalid."""


class AutoscalerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_seconds: float = Field(15.0, gt=0, description="One autoscaler pass this often (the HPA's sync period).")
    metrics_url_annotation: bool = Field(
        False, description="Honour the tts.chattts.io/metrics-url pod annotation: tests and development only "
                           "(anyone who may annotate pods could point the operator at any URL).")
    concurrency: int = Field(16, ge=1, le=256, description="Objects evaluated at once.")


class SharePolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    resync_seconds: float = Field(30.0, gt=0, description="Re-plan at least this often (window changes need no event).")
    settle_seconds: float = Field(2.0, gt=0, description="Re-plan this soon while growth waits for pods to go.")
    min_interval_seconds: float = Field(
        0.5, ge=0, description="At most one pass per policy this often (debounces watch bursts).")


def _read_group(model: type[BaseModel], prefix: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The raw values of ``model``'s fields set under ``prefix``; unknown names are an error."""
    fields = {n: info for n, info in model.model_fields.items() if not _is_group(info.annotation)}
    values: dict[str, Any] = {}
    for name, info in fields.items():
        raw = env.get(prefix + name.upper(), "").strip()
        if not raw:
            continue  # unset or empty: the default
        if info.annotation == tuple[str, ...]:
            values[name] = tuple(part.strip() for part in raw.split(",") if part.strip())
        else:
            values[name] = raw
    known = {prefix + n.upper() for n in fields}
    unknown = sorted(k for k in env if k.startswith(prefix) and k not in known)
    if unknown:
        raise SettingsError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return values


def _is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


class OperatorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_profile: GpuProfile = Field(GpuProfile.GPU_MEMORY, description="Default GPU sharing profile.")
    gpu_memory_resource: str = Field("nvidia.com/gpu.memory", description="MiB resource of the gpu-memory profile.")
    gpu_resource: str = Field("nvidia.com/gpu", description="Whole-GPU resource (whole-gpu; HAMi's device count).")
    hami_memory_resource: str = Field("nvidia.com/gpumem", description="HAMi's per-GPU memory resource, MiB.")
    mig_resource_prefix: str = Field("nvidia.com/mig-", description="Prefix of MIG resources.")
    mig_profiles: tuple[str, ...] = Field(DEFAULT_MIG_PROFILES, description="MIG profiles the cluster offers.")
    dra_device_class: str = Field(
        "gpu.nvidia.com", min_length=1, description="dra profile: the DeviceClass claims request (NVIDIA's driver).")
    dra_driver: str = Field(
        "gpu.nvidia.com", min_length=1, description="dra profile: the driver whose attributes selectors read.")
    dra_consumable_capacity: bool = Field(
        True, description="dra profile: request GPU memory as consumable capacity (KEP-5075, beta in 1.36); off: "
        "one whole device per rank, chosen by its memory.")
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
    status_coalesce_seconds: float = Field(
        0.5, ge=0, le=10, description="A ChatTTSDeployment's changed status waits this long (then for a free "
        "request slot) and the newest is written: the quick steps of a rollout become one write.")
    event_loop: str = Field(
        "uvloop", pattern=r"^(uvloop|asyncio)$", description="The operator's event loop: uvloop (libuv: cheaper per "
        "watch event and request than asyncio's own; asyncio's when uvloop is not installed) or asyncio.")
    gc_freeze_survivors: bool = Field(
        True, description="Freeze what survives a full garbage collection, so the next one walks only what came "
        "since: pauses in proportion to recent churn, not to the whole cache (core/heap.py). Off: Python's default.")
    gc_thaw_seconds: float = Field(
        3600.0, gt=0, description="With gc_freeze_survivors: unfreeze everything this often, so one full "
        "collection frees reference cycles that became garbage while frozen.")
    upstream_data_interval_seconds: float = Field(
        60.0, ge=0, description="Ask one Ready serving pod per ChatTTSDeployment this often (and when a pod "
        "becomes Ready) which upstream data it found (its /health): the UpstreamData condition. 0: never ask "
        "(the condition stays Unknown/NotChecked).")
    upstream_data_timeout_seconds: float = Field(2.0, gt=0, le=30, description="That question's HTTP timeout.")
    utilization_warning: float = Field(0.9, gt=0, le=1, description="Warn above this gpuMemoryUtilization.")
    api_key_secret_check: bool = Field(
        False, description="Get spec.auth's Secret (its metadata only) so status can say SecretNotFound; needs "
        "RBAC get on secrets (the chart's rbac.apiKeySecretCheck). Off: the APIKeys condition is Unknown.")

    @field_validator("mig_profiles")
    @classmethod
    def _mig_profiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for profile in value:
            if not MIG_PROFILE_PATTERN.match(profile):
                raise ValueError(f"MIG profile {profile!r} must look like 1g.10gb or 3g.40gb")
        return value

    autoscaler: AutoscalerSettings = Field(default_factory=AutoscalerSettings)
    sharepolicy: SharePolicySettings = Field(default_factory=SharePolicySettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "OperatorSettings":
        env = os.environ if environ is None else environ
        groups = {"autoscaler": (AutoscalerSettings, AUTOSCALER_ENV_PREFIX),
                  "sharepolicy": (SharePolicySettings, SHAREPOLICY_ENV_PREFIX)}
        values = _read_group(cls, ENV_PREFIX, env)
        for field_name, (model, prefix) in groups.items():
            values[field_name] = _read_group(model, prefix, env)
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            problems = "; ".join(_variable(e["loc"], groups) + e["msg"] for e in err.errors())
            raise SettingsError(f"invalid operator settings: {problems}") from None


def _variable(loc: tuple[Any, ...], groups: dict[str, tuple[type[BaseModel], str]]) -> str:
    """The environment variable a validation error's location names, with ': '."""
    if not loc:
        return ""
    if loc[0] in groups and len(loc) > 1:
        return f"{groups[loc[0]][1]}{str(loc[1]).upper()}: "
    return f"{ENV_PREFIX}{str(loc[0]).upper()}: "
