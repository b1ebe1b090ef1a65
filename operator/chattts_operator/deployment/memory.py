"""GPU memory planner (pure): will a replica's engine start in the GPU memory it is given,
and how many full-length sequences will its KV cache hold? One model per engine, each
following how that engine really allocates (per GPU of a replica; budget = the GPU memory
x ``gpuMemoryUtilization`` for every engine: vLLM's own budget, and for the runtime's
engines the same share kept free for allocator fragmentation and what torch does not count).

**vllm**: vLLM loads the weights, runs a profiling step (activations), keeps room for
CUDA graphs and the CUDA context, and gives what is left to the KV cache; it refuses to
start when that cannot hold one ``maxModelLen``-long sequence. Tensor parallel splits the
GPT body's linear weights and KV heads; embeddings and heads sit whole on each GPU.
- weights (``vllm_weight_bytes``): the body's linear weights in the engine's dtype (2 bytes, 4 in
  float32), or AWQ / compressed-tensors W4A16 = 4 bits + one fp16 scale and a 4-bit zero per group
  of 128 (0.5195 bytes/param); embeddings, heads and norms float32 (the plugin keeps them so). The
  auxiliary decoder/DVAE/Vocos are in the speech API's copy, not in vLLM's budget.
- activations: a profiling step of ``maxNumBatchedTokens`` tokens (vLLM's default of 8192
  when unset) x hidden size x 2 bytes x ``ACTIVATION_FACTOR`` live intermediates.
- overhead: ``OVERHEAD_MIB`` (plus ``TP_OVERHEAD_MIB`` for NCCL buffers under tensor parallel).
- the speech API's process loads the whole model too (it decodes audio), outside vLLM's
  budget: a warning when it does not fit in what vLLM leaves.

**graph** (``engines/graph.py``): one GPU, everything allocated up front.
- weights once per process that holds them: the engine's process and the speech API's
  (``engine.process: auto`` runs the graph engine in a process of its own on CUDA). The
  GPT body in the activation dtype, embeddings and heads float32, auxiliary models float32;
  AWQ is dequantized to 16 bits at load, so it saves disk, not GPU memory (said in status).
- KV cache: the slot cache ``(maxNumSeqs + 1) x maxModelLen x KV bytes per token`` (one
  scratch slot) and the slots' frame history (``num_vq`` int64 codes per position).
- capture pools: the largest captured prefill (``GRAPH_PREFILL_ROWS`` newcomers x
  ``PREFILL_TOKENS`` tokens; beside it the prefill's voice-sample codes, ``GRAPH_PREFILL_ROWS`` x
  ``maxModelLen`` x ``num_vq`` int64) and the audio windows (``AUDIO_ROWS`` windows of
  ``AUDIO_WINDOW_FRAMES`` frames through DVAE + Vocos), plus the speech API's decode of one
  whole non-streamed response.
- a CUDA context per process (``CUDA_CONTEXT_MIB``).

**reference** (``engines/reference.py``): one GPU, one process, eager. Its KV cache
(``kvcache.BatchKVCache``) grows by doubling and copies rows when requests join or leave:
at worst ``REFERENCE_KV_FACTOR`` x ``maxNumSeqs x maxModelLen`` positions live at once.
Activations: a prefill of every admitted prompt at once (``maxNumSeqs`` x ``PREFILL_TOKENS``).

These are estimates with a stated model, checked against measurements on an H200 by
``bench/runtime/memory_probe.py`` (allocated and reserved vs predicted, per engine): the
point is to refuse a config that cannot start and to report how much room is left.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from chattts_runtime.config import WeightFormat

from chattts_operator.api.chattts import EngineSpec, ModelShape

MIB = 1 << 20
BYTES_16BIT = 2.0
BYTES_FLOAT32 = 4.0
BYTES_4BIT_GROUP128 = 0.5 + (2.0 + 0.5) / 128  # packed int4 + fp16 scale + int4 zero per group of 128
BYTES_AUXILIARY = 4.0
ACTIVATION_FACTOR = 16
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
OVERHEAD_MIB = 512
TP_OVERHEAD_MIB = 256

# The runtime's engines (graph, reference); sizes follow engines/graph.py's defaults.
CUDA_CONTEXT_MIB = 512  # CUDA context + cuBLAS workspaces of one process (not in torch's allocator)
NUM_VQ = 4  # ChatTTS's code heads: the frame history holds 4 int64 codes per position
FRAME_HISTORY_BYTES_PER_TOKEN = NUM_VQ * 8
GRAPH_PREFILL_ROWS = 32  # GraphEngine(prefill_rows=32): newcomers per captured prefill
PREFILL_TOKENS = 256  # GraphEngine(prefill_max_len=256); the reference engine's prompts, planned alike
ATTENTION_SCORE_COPIES = 2  # scores and their softmax, float32, per prefill
AUDIO_ROWS = 64  # GraphEngine(audio_rows=64): windows decoded together
AUDIO_WINDOW_FRAMES = 64  # StreamWindows: 24 new frames + 40 of context
AUDIO_BYTES_PER_FRAME = 96 * 1024  # DVAE + Vocos float32 live intermediates per code frame (2 mel frames)
REFERENCE_KV_FACTOR = 3  # doubled storage + the old one while it is copied


@dataclass(frozen=True)
class MemoryPlanResult:
    fits: bool
    reason: str  # Fits, WeightsDoNotFit, KVCacheDoesNotFit, ActivationsDoNotFit, TensorParallelMismatch,
    # TensorParallelUnsupported
    message: str
    budget_mib: int
    weights_mib: int  # every copy: weights x weight_copies (+ vLLM's split)
    activations_mib: int
    overhead_mib: int
    kv_cache_mib: int
    kv_bytes_per_token: int
    max_concurrent_sequences: int
    warnings: list[str] = field(default_factory=list)
    engine: str = "vllm"
    weight_copies: int = 1
    parts: dict[str, int] = field(default_factory=dict)  # MiB by what holds it (see the module docstring)
    notes: list[str] = field(default_factory=list)  # what the plan assumes that the spec may not say

    def to_status(self) -> dict:
        return {
            "fits": self.fits,
            "reason": self.reason,
            "engine": self.engine,
            "budgetMiB": self.budget_mib,
            "weightsMiB": self.weights_mib,
            "weightCopies": self.weight_copies,
            "activationsMiB": self.activations_mib,
            "overheadMiB": self.overhead_mib,
            "kvCacheMiB": self.kv_cache_mib,
            "kvBytesPerToken": self.kv_bytes_per_token,
            "maxConcurrentSequences": self.max_concurrent_sequences,
            "parts": dict(self.parts),
            "notes": list(self.notes),
        }


def linear_weight_bytes_per_param(weight_format: WeightFormat) -> float:
    return BYTES_16BIT if weight_format is WeightFormat.FP16 else BYTES_4BIT_GROUP128


def kv_element_bytes(engine: EngineSpec) -> int:
    if engine.kv_cache_dtype.startswith("fp8"):
        return 1
    return 4 if engine.dtype == "float32" else 2


def kv_bytes_per_token(shape: ModelShape, engine: EngineSpec, tensor_parallel: int = 1) -> int:
    """2 (K and V) x layers x KV heads on one GPU x head dim x element size."""
    kv_heads_per_gpu = max(shape.num_kv_heads // tensor_parallel, 1)
    return 2 * shape.num_layers * kv_heads_per_gpu * shape.head_dim * kv_element_bytes(engine)


def vllm_weight_bytes(shape: ModelShape, weight_format: WeightFormat, engine: EngineSpec,
                      tensor_parallel: int = 1) -> float:
    """What vLLM's engine core loads on one GPU (the ChatTTS plugin): its share of the GPT body in the
    engine's dtype (or AWQ's 4 bits), and the embeddings and heads whole, float32 as in the reference
    model. The auxiliary models are not there: they live in the speech API's copy. Measured on the H200 (2026-12-03, full size): 0.50 GiB
    in bfloat16, 0.84 in float32, 0.24 with AWQ, against 516 / 894 / 239 MiB from this."""
    body = BYTES_FLOAT32 if engine.dtype == "float32" and weight_format is WeightFormat.FP16 \
        else linear_weight_bytes_per_param(weight_format)
    return shape.linear_params * body / tensor_parallel + shape.other_params * BYTES_FLOAT32


def runtime_weight_bytes(shape: ModelShape, engine: EngineSpec) -> float:
    """One copy of the model as ``chattts_runtime.model.load_chattts`` puts it on the GPU: the GPT
    body in the activation dtype (AWQ dequantized), embeddings, heads and auxiliary models float32."""
    body = BYTES_FLOAT32 if engine.dtype == "float32" else BYTES_16BIT
    return shape.linear_params * body + (shape.other_params + shape.auxiliary_params) * BYTES_FLOAT32


def _mib(nbytes: float) -> int:
    whole = int(nbytes // MIB)
    return whole + (1 if nbytes > whole * MIB else 0)


def _utilization_warnings(engine: EngineSpec, utilization_warning: float) -> list[str]:
    if engine.gpu_memory_utilization > utilization_warning:
        return [f"gpuMemoryUtilization {engine.gpu_memory_utilization:g} is above {utilization_warning:g}: "
                "out-of-memory errors are likely (keep it at or below 0.85)"]
    return []


def _budget_text(gpu_memory_mib: int, engine: EngineSpec) -> str:
    budget = int(gpu_memory_mib * engine.gpu_memory_utilization)
    return f"{gpu_memory_mib} MiB x gpuMemoryUtilization {engine.gpu_memory_utilization:g} = {budget} MiB per GPU"


def plan_memory(
    *,
    shape: ModelShape,
    weight_format: WeightFormat,
    engine: EngineSpec,
    gpu_memory_mib: int,
    tensor_parallel: int = 1,
    utilization_warning: float = 0.9,
) -> MemoryPlanResult:
    """The memory budget of one GPU of a replica, for the engine the spec names."""
    if engine.kind == "vllm":
        return _plan_vllm(shape, weight_format, engine, gpu_memory_mib, tensor_parallel, utilization_warning)
    return _plan_runtime_engine(shape, weight_format, engine, gpu_memory_mib, tensor_parallel, utilization_warning)


def _plan_vllm(shape: ModelShape, weight_format: WeightFormat, engine: EngineSpec, gpu_memory_mib: int,
               tensor_parallel: int, utilization_warning: float) -> MemoryPlanResult:
    budget_bytes = gpu_memory_mib * MIB * engine.gpu_memory_utilization
    weights_bytes = vllm_weight_bytes(shape, weight_format, engine, tensor_parallel)
    batched_tokens = engine.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    activation_bytes = batched_tokens * shape.hidden_size * BYTES_16BIT * ACTIVATION_FACTOR
    overhead_bytes = (OVERHEAD_MIB + (TP_OVERHEAD_MIB if tensor_parallel > 1 else 0)) * MIB
    per_token = kv_bytes_per_token(shape, engine, tensor_parallel)
    kv_available = budget_bytes - weights_bytes - activation_bytes - overhead_bytes
    sequence_bytes = per_token * engine.max_model_len
    # The speech API's own copy of the model (it decodes audio) lives outside vLLM's budget.
    api_copy_bytes = runtime_weight_bytes(shape, engine) + CUDA_CONTEXT_MIB * MIB
    outside_mib = int(gpu_memory_mib - budget_bytes // MIB)

    warnings = _utilization_warnings(engine, utilization_warning)
    if _mib(api_copy_bytes) > outside_mib:
        warnings.append(
            f"the speech API's process holds its own copy of the model and a CUDA context ({_mib(api_copy_bytes)} "
            f"MiB) outside vLLM's budget, but only {outside_mib} MiB are left outside it: lower "
            "gpuMemoryUtilization or vLLM may find too little free memory at start")
    parts = {"weights": _mib(weights_bytes), "activations": _mib(activation_bytes),
             "overhead": _mib(overhead_bytes), "speechApiCopy": _mib(api_copy_bytes)}

    def result(fits: bool, reason: str, message: str, sequences: int) -> MemoryPlanResult:
        kv_mib = max(int(kv_available // MIB), 0)
        return MemoryPlanResult(
            fits=fits, reason=reason, message=message, budget_mib=int(budget_bytes // MIB),
            weights_mib=_mib(weights_bytes), activations_mib=_mib(activation_bytes),
            overhead_mib=_mib(overhead_bytes), kv_cache_mib=kv_mib, kv_bytes_per_token=per_token,
            max_concurrent_sequences=sequences, warnings=warnings, engine="vllm", weight_copies=2,
            parts={**parts, "kvCache": kv_mib},
        )

    budget_text = _budget_text(gpu_memory_mib, engine)
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
            f"({per_token} bytes/token); vLLM would refuse to start",
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


def _plan_runtime_engine(shape: ModelShape, weight_format: WeightFormat, engine: EngineSpec, gpu_memory_mib: int,
                         tensor_parallel: int, utilization_warning: float) -> MemoryPlanResult:
    """The graph and reference engines: fixed allocations, summed part by part (module docstring)."""
    kind = engine.kind
    graph = kind == "graph"
    seqs, length = engine.max_num_seqs, engine.max_model_len
    budget_mib = int(gpu_memory_mib * engine.gpu_memory_utilization)
    per_token = kv_bytes_per_token(shape, engine)
    copies = 2 if graph else 1  # graph: the engine's process and the speech API's
    weights_bytes = runtime_weight_bytes(shape, engine)
    prompt_tokens = min(PREFILL_TOKENS, length)
    prefill_rows = min(GRAPH_PREFILL_ROWS, seqs) if graph else seqs
    prefill_bytes = prefill_rows * prompt_tokens * (
        shape.hidden_size * BYTES_16BIT * ACTIVATION_FACTOR
        + shape.num_kv_heads * prompt_tokens * BYTES_FLOAT32 * ATTENTION_SCORE_COPIES)
    audio_bytes = AUDIO_ROWS * min(AUDIO_WINDOW_FRAMES, length) * AUDIO_BYTES_PER_FRAME
    if graph:
        kv_bytes = (seqs + 1) * length * per_token
        parts = {
            "weights": _mib(weights_bytes) * copies,
            "kvCache": _mib(kv_bytes),
            "frameHistory": _mib((seqs + 1) * length * FRAME_HISTORY_BYTES_PER_TOKEN),
            # the Decoder path's hidden states per slot, 16-bit
            "hiddenHistory": _mib((seqs + 1) * length * shape.hidden_size * BYTES_16BIT),
            "prefillPool": _mib(prefill_bytes),
            # the voice-sample codes a prefill may embed after a prompt (a long input's first piece): the
            # int64 codes, and their float32 embeddings (the sum and one codebook's) in the captured prefill
            "voiceSampleCodes": _mib(prefill_rows * length * FRAME_HISTORY_BYTES_PER_TOKEN
                                     + prefill_rows * prompt_tokens * shape.hidden_size * BYTES_FLOAT32 * 2),
            "audioPool": _mib(audio_bytes),
            "speechApiDecode": _mib(length * AUDIO_BYTES_PER_FRAME),  # one whole non-streamed response
            "cudaContexts": CUDA_CONTEXT_MIB * copies,
        }
        kv_text = (f"the slot cache (maxNumSeqs {seqs} + 1) x maxModelLen {length} x {per_token} bytes (audio and "
                   f"refine-text rows share it), and the frame and hidden-state history")
    else:
        kv_bytes = REFERENCE_KV_FACTOR * seqs * length * per_token
        parts = {
            "weights": _mib(weights_bytes),
            "kvCache": _mib(kv_bytes),
            "prefillActivations": _mib(prefill_bytes),
            "audioWindows": _mib(audio_bytes),
            "cudaContexts": CUDA_CONTEXT_MIB,
        }
        kv_text = (f"the growing KV cache at its worst, {REFERENCE_KV_FACTOR} x maxNumSeqs {seqs} x maxModelLen "
                   f"{length} x {per_token} bytes")
    kv_mib = sum(parts.get(k, 0) for k in ("kvCache", "frameHistory", "hiddenHistory"))
    activations_mib = sum(v for k, v in parts.items() if k in ("prefillPool", "voiceSampleCodes", "audioPool",
                                                                "speechApiDecode",
                                                                "prefillActivations", "audioWindows"))
    weights_and_contexts_mib = parts["weights"] + parts["cudaContexts"]

    notes: list[str] = []
    if weight_format is not WeightFormat.FP16:
        notes.append(
            f"model.format {weight_format.value}: the {kind} engine dequantizes the GPT to 16 bits at load, so "
            f"{weight_format.value} saves disk, not GPU memory (weights planned at 16 bits: "
            f"{_mib(weights_bytes)} MiB per copy)")
    if graph:
        notes.append("weights counted twice: the graph engine's process and the speech API's each hold a copy "
                     "(engine.process auto on CUDA)")
    warnings = _utilization_warnings(engine, utilization_warning)

    def result(fits: bool, reason: str, message: str) -> MemoryPlanResult:
        return MemoryPlanResult(
            fits=fits, reason=reason, message=message, budget_mib=budget_mib, weights_mib=parts["weights"],
            activations_mib=activations_mib, overhead_mib=parts["cudaContexts"], kv_cache_mib=kv_mib,
            kv_bytes_per_token=per_token, max_concurrent_sequences=seqs if fits else 0, warnings=warnings,
            engine=kind, weight_copies=copies, parts=parts, notes=notes,
        )

    budget_text = _budget_text(gpu_memory_mib, engine)
    if tensor_parallel > 1:
        return result(False, "TensorParallelUnsupported",
                      f"the {kind} engine runs on one GPU, but gpu.count is {tensor_parallel}: use gpu.count 1 "
                      "(the model is under 1 GiB; scale by replicas) or engine.kind vllm for tensor parallel")
    copies_text = f"{copies} cop{'ies' if copies > 1 else 'y'}"
    # Each stage adds to what the GPU holds; the first that passes the budget names the refusal.
    stages = (
        ("WeightsDoNotFit", weights_and_contexts_mib,
         f"weights {parts['weights']} MiB ({copies_text}) + CUDA contexts {parts['cudaContexts']} MiB",
         "ask for more gpu.memory"),
        ("KVCacheDoesNotFit", kv_mib, f"{kv_text} = {kv_mib} MiB",
         "lower engine.maxNumSeqs or engine.maxModelLen, or ask for more gpu.memory"),
        ("ActivationsDoNotFit", activations_mib, f"activations and capture pools {activations_mib} MiB",
         "lower engine.maxNumSeqs or engine.maxModelLen (the KV cache before it), or ask for more gpu.memory"),
    )
    held = 0
    for reason, mib, what, advice in stages:
        before, held = held, held + mib
        if held > budget_mib:
            on_top = f" on top of {before} MiB planned before it" if before else ""
            return result(False, reason, f"{kind} engine: {what}{on_top} makes {held} MiB, more than the budget of "
                                         f"{budget_text}; {advice}")
    return result(True, "Fits",
                  f"{kind} engine: weights {parts['weights']} MiB ({copies_text}), "
                  f"KV cache {kv_mib} MiB for {seqs} sequences of {length} tokens, activations and pools "
                  f"{activations_mib} MiB, CUDA contexts {parts['cudaContexts']} MiB: {held} MiB within "
                  f"{budget_text}" + (f". {notes[0]}" if weight_format is not WeightFormat.FP16 else ""))
