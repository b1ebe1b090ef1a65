"""GPU memory planner (pure): will a replica's engine start in the GPU memory it is given,
and how many full-length sequences will its KV cache hold?

vLLM takes ``gpu memory x gpuMemoryUtilization`` as its budget, loads the weights, runs a
profiling step (activations), keeps room for CUDA graphs and the CUDA context, and gives
what is left to the KV cache; it refuses to start when that cannot hold one
``maxModelLen``-long sequence. The numbers here follow that accounting, per GPU (tensor
parallel splits the GPT's weights and KV heads; the auxiliary decoder/DVAE/Vocos sit whole
on each GPU, the conservative case):

- weights: 16-bit = 2 bytes/param; AWQ and compressed-tensors W4A16 = 4 bits + one fp16
  scale and a 4-bit zero per group of 128 (0.5195 bytes/param) for the decoder layers'
  linear weights; embeddings, heads and norms stay 16-bit; auxiliary models float32.
- KV bytes per token = 2 (K and V) x layers x KV heads x head dim x element size
  (fp8 = 1 byte; auto = the activation dtype, 2 bytes, or 4 for float32).
- activations: a profiling step of ``maxNumBatchedTokens`` tokens (vLLM's default of 8192
  when unset) x hidden size x 2 bytes x ``ACTIVATION_FACTOR`` live intermediates.
- overhead: the CUDA context, CUDA graphs and allocator slack, ``OVERHEAD_MIB`` (plus
  ``TP_OVERHEAD_MIB`` for NCCL buffers under tensor parallelism).

These are estimates with a stated model, not measurements: the point is to refuse a
config that cannot start and to report how much room the KV cache gets.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from chattts_runtime.config import WeightFormat

from chattts_operator.api.chattts import EngineSpec, ModelShape

MIB = 1 << 20
BYTES_16BIT = 2.0
BYTES_4BIT_GROUP128 = 0.5 + (2.0 + 0.5) / 128  # packed int4 + fp16 scale + int4 zero per group of 128
BYTES_AUXILIARY = 4.0
ACTIVATION_FACTOR = 16
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
OVERHEAD_MIB = 512
TP_OVERHEAD_MIB = 256


@dataclass(frozen=True)
class MemoryPlanResult:
    fits: bool
    reason: str  # Fits, WeightsDoNotFit, KVCacheDoesNotFit, TensorParallelMismatch
    message: str
    budget_mib: int
    weights_mib: int
    activations_mib: int
    overhead_mib: int
    kv_cache_mib: int
    kv_bytes_per_token: int
    max_concurrent_sequences: int
    warnings: list[str] = field(default_factory=list)

    def to_status(self) -> dict:
        return {
            "fits": self.fits,
            "reason": self.reason,
            "budgetMiB": self.budget_mib,
            "weightsMiB": self.weights_mib,
            "activationsMiB": self.activations_mib,
            "overheadMiB": self.overhead_mib,
            "kvCacheMiB": self.kv_cache_mib,
            "kvBytesPerToken": self.kv_bytes_per_token,
            "maxConcurrentSequences": self.max_concurrent_sequences,
        }


def linear_weight_bytes_per_param(weight_format: WeightFormat) -> float:
    return BYTES_16BIT if weight_format is WeightFormat.FP16 else BYTES_4BIT_GROUP128


def kv_element_bytes(engine: EngineSpec) -> int:
    if engine.kv_cache_dtype.startswith("fp8"):
        return 1
    return 4 if engine.dtype == "float32" else 2


def _mib(nbytes: float) -> int:
    whole = int(nbytes // MIB)
    return whole + (1 if nbytes > whole * MIB else 0)


def plan_memory(
    *,
    shape: ModelShape,
    weight_format: WeightFormat,
    engine: EngineSpec,
    gpu_memory_mib: int,
    tensor_parallel: int = 1,
    utilization_warning: float = 0.9,
) -> MemoryPlanResult:
    """The memory budget of one GPU of a replica."""
    budget_bytes = gpu_memory_mib * MIB * engine.gpu_memory_utilization
    weights_bytes = (
        shape.linear_params * linear_weight_bytes_per_param(weight_format)
        + shape.other_params * BYTES_16BIT
    ) / tensor_parallel + shape.auxiliary_params * BYTES_AUXILIARY
    batched_tokens = engine.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    activation_bytes = batched_tokens * shape.hidden_size * BYTES_16BIT * ACTIVATION_FACTOR
    overhead_bytes = (OVERHEAD_MIB + (TP_OVERHEAD_MIB if tensor_parallel > 1 else 0)) * MIB
    kv_heads_per_gpu = shape.num_kv_heads // tensor_parallel
    kv_bytes_per_token = 2 * shape.num_layers * max(kv_heads_per_gpu, 1) * shape.head_dim * kv_element_bytes(engine)
    kv_available = budget_bytes - weights_bytes - activation_bytes - overhead_bytes
    sequence_bytes = kv_bytes_per_token * engine.max_model_len

    warnings: list[str] = []
    if engine.gpu_memory_utilization > utilization_warning:
        warnings.append(
            f"gpuMemoryUtilization {engine.gpu_memory_utilization:g} is above {utilization_warning:g}: "
            "out-of-memory errors are likely (keep it at or below 0.85)"
        )

    def result(fits: bool, reason: str, message: str, sequences: int) -> MemoryPlanResult:
        return MemoryPlanResult(
            fits=fits,
            reason=reason,
            message=message,
            budget_mib=int(budget_bytes // MIB),
            weights_mib=_mib(weights_bytes),
            activations_mib=_mib(activation_bytes),
            overhead_mib=_mib(overhead_bytes),
            kv_cache_mib=max(int(kv_available // MIB), 0),
            kv_bytes_per_token=kv_bytes_per_token,
            max_concurrent_sequences=sequences,
            warnings=warnings,
        )

    budget_text = (
        f"{gpu_memory_mib} MiB x gpuMemoryUtilization {engine.gpu_memory_utilization:g} = "
        f"{int(budget_bytes // MIB)} MiB per GPU"
    )
    if shape.num_kv_heads % tensor_parallel != 0:
        return result(
            False,
            "TensorParallelMismatch",
            f"gpu.count {tensor_parallel} does not divide the model's {shape.num_kv_heads} KV heads",
            0,
        )
    fixed_mib = _mib(weights_bytes) + _mib(activation_bytes) + _mib(overhead_bytes)
    if kv_available <= 0:
        return result(
            False,
            "WeightsDoNotFit",
            f"weights {_mib(weights_bytes)} MiB + activations {_mib(activation_bytes)} MiB + overhead "
            f"{_mib(overhead_bytes)} MiB = {fixed_mib} MiB exceed the budget of {budget_text}",
            0,
        )
    sequences = int(kv_available // sequence_bytes)
    if sequences < 1:
        return result(
            False,
            "KVCacheDoesNotFit",
            f"the KV cache gets {int(kv_available // MIB)} MiB of {budget_text}, but one maxModelLen "
            f"{engine.max_model_len} sequence needs {_mib(sequence_bytes)} MiB "
            f"({kv_bytes_per_token} bytes/token); vLLM would refuse to start",
            0,
        )
    if sequences < engine.max_num_seqs:
        warnings.append(
            f"the KV cache holds {sequences} full-length sequences, fewer than maxNumSeqs {engine.max_num_seqs}"
        )
    return result(
        True,
        "Fits",
        f"weights {_mib(weights_bytes)} MiB, KV cache {int(kv_available // MIB)} MiB "
        f"({sequences} sequences of {engine.max_model_len} tokens) within {budget_text}",
        sequences,
    )
