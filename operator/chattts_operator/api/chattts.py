"""`ChatTTSDeployment` (tts.chattts.io/v1alpha1, short name `ctd`): ChatTTS served by the
TTS runtime on GPU pods.

Every rule is stated twice on purpose: as a pydantic validator (the operator and the unit
tests) and as an OpenAPI constraint or CEL rule in the CRD (the API server rejects a bad
spec at apply time, before the operator ever sees it). ``tests/unit/test_operator_api.py``
runs the bad-input corpus through both.
"""
from __future__ import annotations

import re
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chattts_runtime.config import MANAGED_ENGINE_FLAGS, MAX_SERVED_NAME, SERVED_NAME_PATTERN, WeightFormat

from .access import AuthSpec, NetworkPolicySpec
from .autoscaling import AutoscalingSpec, AutoscalingStatus
from .common import QUANTITY_PATTERN, Condition, SpecModel, StatusModel, parse_quantity, quantity_to_mib
from .quantization import QuantizationSpec, QuantizationStatus
from .rules import Rule, cel, enforce

GROUP = "tts.chattts.io"
VERSION = "v1alpha1"
KIND = "ChatTTSDeployment"
PLURAL = "chattsdeployments"
SINGULAR = "chattsdeployment"
SHORT_NAMES = ["ctd"]
SCOPE = "Namespaced"
API_VERSION = f"{GROUP}/{VERSION}"

# Child names are "<name>" and "<name>-runtime-<config hash>"; the name is also a label value (63 max)
# and the Deployment's pods append "-<hash>-<suffix>" (up to 17 more characters).
MAX_NAME_LENGTH = 45
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"  # DNS-1035: the name is also the Service's name.

EXTRA_ARG_PATTERN = r"^--[a-z0-9][a-z0-9-]*(=.*)?$"
MANAGED_FLAGS_SORTED = sorted(MANAGED_ENGINE_FLAGS)

# --- model ----------------------------------------------------------------------------


class PvcSource(SpecModel):
    """Weights on a PersistentVolumeClaim, mounted read-only (readOnly on the volume and the mount)."""

    claim_name: str = Field(min_length=1, max_length=253, description="Name of the PVC in the same namespace.")
    sub_path: str | None = Field(
        None, max_length=1024, pattern=r"^[^/].*$",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "!self.matches('(^|/)[.][.](/|$)')", "message": "model.pvc.subPath may not contain '..'"}
            ]
        },
        description="Directory inside the volume holding the checkpoint (relative path).",
    )

    @field_validator("sub_path")
    @classmethod
    def _no_parent_dirs(cls, value: str | None) -> str | None:
        if value is not None and ".." in value.split("/"):
            raise ValueError("model.pvc.subPath may not contain '..'")
        return value


class HostPathSource(SpecModel):
    """Weights in a directory on the node, mounted read-only."""

    path: str = Field(min_length=2, max_length=1024, pattern=r"^/", description="Absolute directory path on the node.")


class ImageSource(SpecModel):
    """Weights shipped as an OCI image or artifact, mounted as an image volume (always read-only;
    needs the ImageVolume feature of Kubernetes 1.33+)."""

    reference: str = Field(min_length=1, max_length=512, description="Image reference, e.g. registry/org/chattts-awq:v1.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="When to pull it.")


class ModelShape(SpecModel):
    """The GPT's shape, for the GPU memory planner. The defaults are ChatTTS's (2noise)."""

    num_layers: int = Field(20, ge=1, le=512, description="Decoder layers.")
    num_kv_heads: int = Field(12, ge=1, le=512, description="Key/value heads (attention heads without GQA).")
    head_dim: int = Field(64, ge=1, le=1024, description="Dimension of one attention head.")
    hidden_size: int = Field(768, ge=1, le=65536, description="Hidden size (sizes activations).")
    linear_params: int = Field(
        188_743_680, ge=1, description="Parameters of the decoder layers' linear weights (what AWQ quantizes)."
    )
    other_params: int = Field(
        36_407_040, ge=0, description="Embeddings, output heads and norms of the GPT (kept 16-bit)."
    )
    auxiliary_params: int = Field(
        55_000_000, ge=0, description="Decoder, DVAE and Vocos parameters (kept in float32 on the GPU)."
    )


_EXACTLY_ONE_SOURCE = (
    "(has(self.pvc) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) + (has(self.image) ? 1 : 0) == 1"
)


class ModelSpec(SpecModel):
    """Where the weights are and how they are stored. Exactly one of pvc, hostPath, image."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": _EXACTLY_ONE_SOURCE,
                    "message": "model needs exactly one weight source: set one of model.pvc, model.hostPath or model.image",
                }
            ]
        }
    )

    pvc: PvcSource | None = Field(None, description="Weights on a PersistentVolumeClaim.")
    host_path: HostPathSource | None = Field(None, description="Weights in a node directory.")
    image: ImageSource | None = Field(None, description="Weights in an OCI image volume.")
    format: WeightFormat = Field(
        WeightFormat.FP16,
        description="How the GPT weights are stored: awq (4-bit AWQ), compressed-tensors (4-bit, llm-compressor) or fp16.",
    )
    served_name: str = Field(
        "chattts", min_length=1, max_length=MAX_SERVED_NAME, pattern=SERVED_NAME_PATTERN,
        description="Model name the speech API answers to: one name, no '/' (no path segments).",
    )
    shape: ModelShape = Field(
        default_factory=ModelShape, json_schema_extra={"default": {}},
        description="The GPT's shape for GPU memory planning (ChatTTS's defaults).",
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> "ModelSpec":
        sources = [n for n, v in (("pvc", self.pvc), ("hostPath", self.host_path), ("image", self.image)) if v]
        if len(sources) != 1:
            raise ValueError(
                "model needs exactly one weight source: set one of model.pvc, model.hostPath or model.image"
                + (f" (got {', '.join(sources)})" if sources else "")
            )
        return self

    @property
    def source_kind(self) -> str:
        return "pvc" if self.pvc else "hostPath" if self.host_path else "image"


# --- engine ---------------------------------------------------------------------------

# The runtime's vLLM engine refuses it at start-up (engines/vllm_engine.py): pods that never get ready.
SPECULATIVE_REFUSED = ("engine.speculativeConfig is not supported: ChatTTS samples every step's audio frame "
                       "from the model, so drafted tokens have no frame; leave it unset")
_MANAGED_FLAGS_CEL = "[" + ", ".join(f"'{flag}'" for flag in MANAGED_FLAGS_SORTED) + "]"
_SETS_MANAGED_FLAG = f"{_MANAGED_FLAGS_CEL}.exists(f, a == f || a.startsWith(f + '='))"


# An 8-bit KV cache exists in the vLLM engine only (the graph and reference engines keep theirs
# in the activation dtype); absent fields are defaulted by the API server before CEL runs.
_FP8_NEEDS_VLLM_CEL = "!has(self.kvCacheDtype) || !self.kvCacheDtype.startsWith('fp8') || self.kind == 'vllm'"
FP8_NEEDS_VLLM = ("engine.kvCacheDtype fp8 is honoured by the vllm engine only: use kvCacheDtype auto with the "
                  "graph and reference engines, or engine.kind vllm")
DEFAULT_ENGINE_KIND = "graph"


class EngineSpec(SpecModel):
    """The engine's knobs (names follow vLLM's engine arguments; the vLLM-only ones say so)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.maxNumBatchedTokens) || self.maxNumBatchedTokens >= self.maxNumSeqs",
                    "message": "engine.maxNumBatchedTokens must be at least engine.maxNumSeqs",
                },
                {
                    "rule": _FP8_NEEDS_VLLM_CEL,
                    "messageExpression": "'engine.kvCacheDtype ' + self.kvCacheDtype + ' is not honoured by the ' "
                    "+ self.kind + ' engine (its KV cache is kept in the activation dtype); use kvCacheDtype auto, "
                    "or engine.kind vllm for an 8-bit KV cache'",
                    "message": FP8_NEEDS_VLLM,
                },
                {"rule": "!has(self.speculativeConfig)", "message": SPECULATIVE_REFUSED},
            ]
        }
    )

    kind: Literal["vllm", "graph", "reference"] = Field(
        DEFAULT_ENGINE_KIND,
        description="graph (the default): the runtime's CUDA-graph engine (static slot KV cache, graphs per "
        "batch bucket), the faster one measured on an H200 (832 audio s/s at 256 streams, p99 first audio "
        "0.13 s, against vllm's 153 and 2.2 s in the same lease; bench/results/vllm-h200-2026-12-03-summary.md); "
        "vllm: the vLLM engine (0.26 on CUDA) with the out-of-tree ChatTTS model, set it for tensor "
        "parallel, AWQ kernels or an fp8 KV cache (twice the KV tokens); reference: the plain PyTorch "
        "engine (baseline).",
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, le=1_048_576, description="Tokens per engine step (vLLM --max-num-batched-tokens); unset: vLLM's default."
    )
    max_num_seqs: int = Field(64, ge=1, le=4096, description="Sequences run concurrently (--max-num-seqs).")
    gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=1.0,
        description="Share of the GPU memory the engine may use (--gpu-memory-utilization); above 0.9 risks OOM.",
    )
    max_model_len: int = Field(2048, ge=16, le=131_072, description="Longest sequence in tokens (--max-model-len).")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="KV cache element type (--kv-cache-dtype); fp8 halves the KV cache (vllm engine "
        "only: refused for graph and reference)."
    )
    enable_prefix_caching: bool = Field(False, description="Reuse KV of shared prompt prefixes.")
    speculative_config: dict[str, Any] | None = Field(
        None, description="Not supported (refused): ChatTTS's multi-codebook frames cannot be drafted. Kept so "
        "objects stored before the refusal still read."
    )
    rope_theta: float | None = Field(None, gt=0, description="RoPE base, passed through --hf-overrides.")
    disable_log_stats: bool = Field(False, description="Keep false when autoscaling on engine metrics.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="Activation dtype.")
    enforce_eager: bool = Field(False, description="Disable CUDA graphs (debugging only: much slower).")
    extra_args: list[str] = Field(
        default_factory=list, max_length=64,
        json_schema_extra={
            "items": {"type": "string", "maxLength": 256, "pattern": EXTRA_ARG_PATTERN},
            "x-kubernetes-validations": [
                {
                    "rule": f"!self.exists(a, {_SETS_MANAGED_FLAG})",
                    "messageExpression": (
                        f"'engine.extraArgs may not set ' + self.filter(a, {_SETS_MANAGED_FLAG})[0]"
                        " + ': the operator manages that flag; use the matching engine field'"
                    ),
                    "message": "engine.extraArgs may not set a flag the operator manages; use the matching engine field",
                }
            ],
        },
        description="More vLLM flags, each as one '--flag' or '--flag=value' item; managed flags are refused.",
    )

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, value: list[str]) -> list[str]:
        for arg in value:
            if len(arg) > 256 or not re.fullmatch(EXTRA_ARG_PATTERN, arg):
                raise ValueError(f"engine.extraArgs item {arg!r} must look like --flag or --flag=value")
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_ENGINE_FLAGS:
                raise ValueError(f"engine.extraArgs may not set {flag}: the operator manages it; use the matching engine field")
        return value

    @model_validator(mode="after")
    def _batched_tokens(self) -> "EngineSpec":
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("engine.maxNumBatchedTokens must be at least engine.maxNumSeqs")
        if self.speculative_config is not None:
            raise ValueError(SPECULATIVE_REFUSED)
        return self

    @model_validator(mode="after")
    def _fp8_needs_vllm(self) -> "EngineSpec":
        if self.kv_cache_dtype.startswith("fp8") and self.kind != "vllm":
            raise ValueError(f"engine.kvCacheDtype {self.kv_cache_dtype} is not honoured by the {self.kind} engine "
                             "(its KV cache is kept in the activation dtype); use kvCacheDtype auto, or "
                             "engine.kind vllm for an 8-bit KV cache")
        return self


# --- gpu --------------------------------------------------------------------------------


class GpuProfile(str, Enum):
    """How the gpu block becomes pod resources."""

    GPU_MEMORY = "gpu-memory"  # limit nvidia.com/gpu.memory in MiB
    HAMI = "hami"  # HAMi: nvidia.com/gpu + nvidia.com/gpumem
    WHOLE_GPU = "whole-gpu"  # nvidia.com/gpu: N
    MIG = "mig"  # the smallest configured nvidia.com/mig-<profile> that fits
    DRA = "dra"  # a ResourceClaimTemplate: one device per rank, GPU memory as consumable capacity


# Below anything runnable: the smallest plan that fits is ~1.25 GiB (the vllm engine, AWQ weights,
# one short sequence); between this and what a spec needs, the GPUCapacity condition explains.
MIN_GPU_MEMORY = "1Gi"
_MIN_GPU_MEMORY_RULE = Rule(
    f"!isQuantity(self) || !quantity(self).isGreaterThan(quantity('0')) "
    f"|| quantity(self).compareTo(quantity('{MIN_GPU_MEMORY}')) >= 0",
    f"gpu.memory must be at least {MIN_GPU_MEMORY}: no engine runs ChatTTS in less",
    lambda text: parse_quantity(text) >= parse_quantity(MIN_GPU_MEMORY))


class GpuSpec(SpecModel):
    """GPU memory per replica and how many GPUs (tensor parallel)."""

    memory: str = Field(
        max_length=32,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "isQuantity(self)", "message": "gpu.memory must be a quantity such as 8Gi, 8192Mi or 24G"},
                {
                    "rule": "!isQuantity(self) || quantity(self).isGreaterThan(quantity('0'))",
                    "message": "gpu.memory must be greater than zero",
                },
                _MIN_GPU_MEMORY_RULE.schema(),
            ]
        },
        description="GPU memory per GPU of a replica, a quantity such as 8Gi.",
    )
    count: int = Field(1, ge=1, le=8, description="GPUs per replica: the tensor parallel size; multiplies what is asked.")
    profile: GpuProfile | None = Field(
        None, description="Sharing profile for this resource; unset: the operator's default."
    )
    product: str | None = Field(
        None, max_length=128, description="Only nodes whose nvidia.com/gpu.product label has this value."
    )
    node_selector: dict[str, str] | None = Field(None, description="More node labels the pods require.")

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        if parse_quantity(value) <= 0:
            raise ValueError("gpu.memory must be greater than zero")
        enforce(value, _MIN_GPU_MEMORY_RULE)
        return value

    @property
    def memory_mib(self) -> int:
        return quantity_to_mib(self.memory)


# --- the rest -------------------------------------------------------------------------


# core/v1's own toleration rules (the API server would refuse the Deployment's pod template).
_TOLERATION_RULES = (
    ("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
     "a toleration with operator Exists must not set value"),
    ("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
     "a toleration without key must use operator Exists (it then matches every taint)"),
    ("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
     "tolerationSeconds needs effect NoExecute"),
)


class Toleration(SpecModel):
    """A pod toleration (as in core/v1)."""

    model_config = ConfigDict(json_schema_extra={
        "x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in _TOLERATION_RULES]})

    key: str | None = Field(None, max_length=253, description="Taint key; empty with Exists: every taint.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal (the default).")
    value: str | None = Field(None, max_length=63, description="Taint value, with Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect; empty: all effects."
    )
    toleration_seconds: int | None = Field(None, description="With NoExecute: how long the pod stays bound.")

    @model_validator(mode="after")
    def _core_v1_rules(self) -> "Toleration":
        if self.operator == "Exists" and self.value:
            raise ValueError(_TOLERATION_RULES[0][1])
        if not self.key and self.operator != "Exists":
            raise ValueError(_TOLERATION_RULES[1][1])
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(_TOLERATION_RULES[2][1])
        return self


class ContainerResources(SpecModel):
    """CPU and memory of the runtime container (requests; memory is also the limit)."""

    cpu: str = Field("2", max_length=32, pattern=QUANTITY_PATTERN, description="CPU request.")
    memory: str = Field("8Gi", max_length=32, pattern=QUANTITY_PATTERN, description="Memory request and limit.")


class ServerSpec(SpecModel):
    """The speech API server in each pod."""

    max_queue: int = Field(256, ge=1, le=100_000, description="Requests waiting beyond running ones; more get 429.")
    max_input_chars: int = Field(4096, ge=1, le=1_000_000, description="Longest input text accepted.")
    shutdown_grace_seconds: int = Field(
        30, ge=0, le=3600, description="On shutdown, in-flight speech may finish for this long."
    )


class SpeechSpec(SpecModel):
    """How the pods speak: upstream ChatTTS's Chat.infer() defaults unless a field here says otherwise."""

    voice_from_first_piece: Literal["upstream", "stream", "off"] = Field(
        "upstream",
        description="A long input's voice (its pieces are spoken in the first piece's voice). upstream: as "
        "upstream ChatTTS does, the first piece is generated whole as a voice sample, then every piece, the first "
        "again, is spoken with it; the first audio of a long input waits for that whole piece. stream: the voice "
        "pass is itself streamed as the first piece's audio and the rest is spoken in its voice: first audio as "
        "soon as for a one-sentence input, but NOT upstream's output (the first piece is spoken once, without the "
        "sample). off: each piece on its own (the voice may drift between pieces). A request's "
        "voice_from_first_piece field overrides it.",
    )


# Cross-field rules of the whole spec (defaults are applied before CEL runs: engine.kind is set).
TENSOR_PARALLEL_NEEDS_VLLM = Rule(
    "self.gpu.count == 1 || self.engine.kind == 'vllm'",
    "gpu.count above 1 (tensor parallel) needs engine.kind vllm: the graph and reference engines run on one GPU",
    lambda spec: spec.gpu.count == 1 or spec.engine.kind == "vllm")
BATCH_TOKEN_TUNING_NEEDS_VLLM = Rule(
    "!has(self.autoscaling) || !has(self.autoscaling.batchTokenTuning) || !self.autoscaling.batchTokenTuning.enabled"
    " || self.engine.kind == 'vllm'",
    "autoscaling.batchTokenTuning needs engine.kind vllm: the other engines have no maxNumBatchedTokens to tune",
    lambda spec: spec.autoscaling is None or not spec.autoscaling.batch_token_tuning.enabled
    or spec.engine.kind == "vllm")
SPEC_RULES = (TENSOR_PARALLEL_NEEDS_VLLM, BATCH_TOKEN_TUNING_NEEDS_VLLM)


class ChatTTSDeploymentSpec(SpecModel):
    """ChatTTS served by the TTS runtime on GPU pods."""

    model_config = ConfigDict(json_schema_extra=cel(*SPEC_RULES))

    replicas: int = Field(1, ge=0, le=10_000, description="Serving pods wanted (the scale subresource).")
    image: str | None = Field(None, max_length=512, description="Runtime image; unset: the operator's default.")
    model: ModelSpec = Field(description="Where the weights are and their format.")
    engine: EngineSpec = Field(
        default_factory=EngineSpec, json_schema_extra={"default": {}},
        description="Engine settings (engine.kind: graph by default, vllm one field away).",
    )
    gpu: GpuSpec = Field(description="GPU memory and count per replica.")
    server: ServerSpec = Field(
        default_factory=ServerSpec, json_schema_extra={"default": {}}, description="Speech API settings."
    )
    resources: ContainerResources = Field(
        default_factory=ContainerResources, json_schema_extra={"default": {}},
        description="CPU and memory of the runtime container.",
    )
    speech: SpeechSpec = Field(
        default_factory=SpeechSpec, json_schema_extra={"default": {}},
        description="The speech pipeline's choices (upstream ChatTTS's output by default).",
    )
    auth: AuthSpec | None = Field(
        None, description="API keys from a Secret: /v1/* needs 'Authorization: Bearer <key>'. Unset: the speech API "
        "is open to anyone who can reach the Service.",
    )
    network_policy: NetworkPolicySpec | None = Field(
        None, description="A NetworkPolicy limiting ingress to the serving pods; unset: none is rendered.",
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32, description="Extra pod tolerations.")
    priority_class_name: str | None = Field(None, max_length=253, description="PriorityClass of the serving pods.")
    autoscaling: AutoscalingSpec | None = Field(
        None, description="Scale on scheduler_deadline_wait; unset or disabled: spec.replicas is left to you (or HPA/KEDA)."
    )
    quantization: QuantizationSpec | None = Field(
        None,
        description="AWQ-quantize the fp16 weights in an offline Job; once it succeeds the pods serve the "
        "quantized weights, read-only (see the Quantized condition).",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> "ChatTTSDeploymentSpec":
        enforce(self, *SPEC_RULES)
        return self


# --- status ---------------------------------------------------------------------------


class DraDevice(StatusModel):
    """One device a claim was allocated, as the claim's allocation status says."""

    claim: str = ""
    pool: str = Field("", description="The driver's pool (the node, for NVIDIA's driver).")
    device: str = ""
    memory_mi_b: int = Field(0, alias="memoryMiB", description="Memory consumed on the device (whole device: its capacity).")


class DraAllocation(StatusModel):
    """The dra profile's claims: the template, and what is allocated now."""

    resource_claim_template: str = ""
    device_class: str = ""
    claims: int = Field(0, description="Claims made from the template (one per pod).")
    allocated_claims: int = 0
    allocated_memory_mi_b: int = Field(0, alias="allocatedMemoryMiB", description="Sum over the allocated claims.")
    devices: list[DraDevice] = Field(default_factory=list)


class ResolvedGpu(StatusModel):
    """What the sharing profile turned the gpu block into."""

    profile: str = ""
    limits: dict[str, str] = Field(default_factory=dict, description="Extended resources on each pod.")
    node_min_gpu_memory_mi_b: int | None = Field(
        None, alias="nodeMinGpuMemoryMiB", description="Nodes must have GPUs larger than this (GFD label)."
    )
    mig_profile: str | None = None
    dra: DraAllocation | None = Field(None, description="dra profile: what the scheduler allocated (from the claims).")


class MemoryPlan(StatusModel):
    """The GPU memory planner's budget for one GPU of a replica (MiB), for the engine the spec names."""

    fits: bool = False
    reason: str = ""
    engine: str = Field("", description="The engine planned for (its allocations differ: see parts).")
    budget_mi_b: int = Field(0, alias="budgetMiB", description="GPU memory x utilization.")
    weights_mi_b: int = Field(0, alias="weightsMiB", description="Weights on the GPU, every copy counted.")
    weight_copies: int = Field(1, description="Processes holding the weights (graph: the engine's and the speech API's).")
    activations_mi_b: int = Field(0, alias="activationsMiB", description="Activations and CUDA-graph capture pools.")
    overhead_mi_b: int = Field(0, alias="overheadMiB", description="CUDA contexts, CUDA graphs and slack.")
    kv_cache_mi_b: int = Field(
        0, alias="kvCacheMiB", description="vllm: what is left for the KV cache; graph and reference: what it allocates."
    )
    kv_bytes_per_token: int = 0
    max_concurrent_sequences: int = Field(
        0, description="maxModelLen-long sequences the KV cache holds (graph and reference: maxNumSeqs when it fits)."
    )
    parts: dict[str, int] = Field(default_factory=dict, description="MiB by what holds it.")
    notes: list[str] = Field(
        default_factory=list, description="What the plan assumes, e.g. AWQ dequantized to 16 bits by the graph engine."
    )


class ChatTTSDeploymentStatus(StatusModel):
    observed_generation: int | None = None
    phase: str = ""
    replicas: int = 0
    ready_replicas: int = 0
    updated_replicas: int = 0
    available_replicas: int = 0
    selector: str = Field("", description="Label selector of the pods (for the scale subresource).")
    gpu_share: str = Field("", description="One-line GPU share per replica, e.g. '1x8Gi gpu-memory'.")
    gpu: ResolvedGpu | None = None
    memory_plan: MemoryPlan | None = None
    applied_generation: int | None = Field(
        None, description="The generation now rolled out (the last one that could start)."
    )
    config_hash: str = Field("", description="Hash of the runtime config now rolled out.")
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    autoscaling: AutoscalingStatus | None = Field(None, description="Written by the autoscaler.")
    quantization: QuantizationStatus | None = Field(None, description="The AWQ quantization Job and its outcome.")


_NAME_RULES = [
    {
        "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
        "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters: child objects and labels are named after it",
    },
    {
        "rule": f"self.metadata.name.matches('{NAME_PATTERN}')",
        "message": "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter, "
        "no dots): it also names the Service",
    },
]


class ChatTTSDeployment(BaseModel):
    """ChatTTS text-to-speech served on GPU pods by the chattts-operator."""

    model_config = ConfigDict(populate_by_name=True, json_schema_extra={"x-kubernetes-validations": _NAME_RULES})

    spec: ChatTTSDeploymentSpec
    status: ChatTTSDeploymentStatus | None = None


def validate_name(name: str) -> str:
    """The same checks as the CRD's root CEL rules, for the operator and tests."""
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(_NAME_RULES[0]["message"])
    if not re.fullmatch(NAME_PATTERN, name):
        raise ValueError(_NAME_RULES[1]["message"])
    return name


PRINTER_COLUMNS = [
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Ready serving pods."},
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas", "description": "Serving pods wanted."},
    {"name": "GPU", "type": "string", "jsonPath": ".status.gpuShare", "description": "GPU share per replica."},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
SCALE_SUBRESOURCE = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}


__all__ = [
    "API_VERSION", "GROUP", "VERSION", "KIND", "PLURAL", "SINGULAR", "SHORT_NAMES", "SCOPE",
    "MAX_NAME_LENGTH", "NAME_PATTERN",
    "PRINTER_COLUMNS", "SCALE_SUBRESOURCE", "ChatTTSDeployment", "validate_name",
    "ChatTTSDeploymentSpec", "ChatTTSDeploymentStatus", "ContainerResources", "EngineSpec",
    "GpuProfile", "GpuSpec", "HostPathSource", "ImageSource", "MemoryPlan", "ModelShape", "ModelSpec",
    "PvcSource", "ResolvedGpu", "ServerSpec", "Toleration", "parse_quantity", "quantity_to_mib",
]
