"""`spec.quantization` of a ChatTTSDeployment: the models (AWQ quantization as an offline
Job). The Job builder and the planner that decides which weights the serving pods mount
are in ``quantization/`` (plan.py, controller.py)."""
from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .common import SpecModel, StatusModel


_SUB_PATH_PATTERN = r"^[^/].*$"
_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


def _no_parent_dirs(value: str | None, field_name: str) -> str | None:
    if value is not None and ".." in value.split("/"):
        raise ValueError(f"{field_name} may not contain '..'")
    return value


class PvcDirectory(SpecModel):
    """A directory on a PersistentVolumeClaim in the CTD's namespace."""

    claim_name: str = Field(min_length=1, max_length=253, pattern=_NAME, description="The PVC's name.")
    sub_path: str | None = Field(
        None, max_length=512, pattern=_SUB_PATH_PATTERN, description="Directory inside the volume (relative)."
    )

    @field_validator("sub_path")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        return _no_parent_dirs(value, "subPath")


class PvcFile(SpecModel):
    claim_name: str = Field(min_length=1, max_length=253, pattern=_NAME, description="The PVC's name.")
    path: str = Field(min_length=1, max_length=512, pattern=_SUB_PATH_PATTERN, description="File inside the volume (relative).")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return _no_parent_dirs(value, "path") or value


class ConfigMapFile(SpecModel):
    name: str = Field(min_length=1, max_length=253, pattern=_NAME, description="The ConfigMap's name.")
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="Its key holding the JSONL.")


class CalibrationSource(SpecModel):
    """The calibration texts: a JSONL file (one {"text": ...} per line). Exactly one source."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.pvc) ? 1 : 0) + (has(self.configMap) ? 1 : 0) == 1",
                    "message": "quantization.calibration needs exactly one of pvc or configMap",
                }
            ]
        }
    )

    pvc: PvcFile | None = Field(None, description="A JSONL file on a PVC.")
    config_map: ConfigMapFile | None = Field(None, description="A JSONL file in a ConfigMap key (small sets).")

    @model_validator(mode="after")
    def _exactly_one(self) -> "CalibrationSource":
        if (self.pvc is None) == (self.config_map is None):
            raise ValueError("quantization.calibration needs exactly one of pvc or configMap")
        return self


class QuantizationSpec(SpecModel):
    """AWQ-quantize the fp16 weights in an offline Job and serve the result read-only."""

    method: Literal["awq"] = Field(
        "awq", description="awq: AutoAWQ GEMM, written as quant_method awq (vLLM loads it)."
    )
    source: PvcDirectory | None = Field(
        None, description="The fp16 checkpoint to quantize; unset: spec.model's PVC (its format must be fp16)."
    )
    calibration: CalibrationSource = Field(description="Calibration texts (JSONL).")
    output: PvcDirectory = Field(
        description="A writable PVC; each quantization writes into its own <subPath>/<hash> directory."
    )
    w_bit: Literal[4] = Field(4, description="Weight bits (AWQ GEMM kernels are 4-bit).")
    group_size: Literal[32, 64, 128] = Field(128, description="Weights sharing one scale and zero point.")
    n_samples: int = Field(512, ge=1, le=100_000, description="Calibration texts used.")
    gpu_memory: str | None = Field(
        None, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$",
        description="GPU memory for the Job's pod (a quantity such as 16Gi); unset: spec.gpu.memory.",
    )
    share_policy: str | None = Field(
        None, max_length=253, pattern=_NAME,
        description="Run under this GPUSharePolicy as offline work: created suspended, resumed when its share has room.",
    )
    priority: int = Field(0, ge=-1000, le=1000, description="Priority among the policy's offline Jobs (higher first).")
    backoff_limit: int = Field(1, ge=0, le=10, description="Retries before the Job counts as failed.")
    active_deadline_seconds: int | None = Field(
        None, ge=60, description="Fail the Job if it runs longer than this."
    )


class QuantizationStatus(StatusModel):
    """Written into the CTD's status.quantization by the reconcile."""

    hash: str = Field("", description="Content hash of the quantization spec this refers to.")
    state: str = Field("", description="Pending, Suspended, Running, Succeeded or Failed.")
    job_name: str = ""
    output: str = Field("", description="claim/subPath of the quantized weights.")
    message: str = ""
    serving: bool = Field(False, description="True when the serving pods mount quantized weights.")
    serving_pvc: dict[str, str] | None = Field(
        None, description="claimName/subPath of the quantized weights the pods mount (kept while a newer one runs or fails)."
    )
