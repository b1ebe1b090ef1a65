"""GPU sharing profiles and the GPU memory planner (pure, table-driven)."""
from __future__ import annotations

import pytest

from chattts_runtime.config import WeightFormat

from chattts_operator.api import EngineSpec, GpuSpec, ModelShape
from chattts_operator.api.common import parse_live_quantity, parse_quantity, quantity_to_mib
from chattts_operator.deployment.gpu import (
    GpuAssignmentError,
    GpuCodec,
    assign_gpu,
    mig_profile_memory_mib,
    node_affinity,
    smallest_mig_profile,
)
from chattts_operator.deployment.memory import BYTES_4BIT_GROUP128, plan_memory
from chattts_operator.core.settings import OperatorSettings, SettingsError

SETTINGS = OperatorSettings()


@pytest.mark.parametrize(
    "text, value",
    [("8Gi", 8 * 2**30), ("8192Mi", 8 * 2**30), ("24G", 24 * 10**9), ("1.5Gi", int(1.5 * 2**30)), ("1e3", 1000),
     ("500m", 0.5), ("0", 0)],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == pytest.approx(value)
    assert parse_live_quantity(text) == parse_quantity(text)  # one codec: a live object's value reads the same


@pytest.mark.parametrize("text", ["8 GB", "8GB", "", "Gi", "8gi", "--1"])
def test_parse_quantity_rejects(text):
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("text, mib", [("8Gi", 8192), ("8G", 7630), ("1Mi", 1), ("1", 1), ("1536Mi", 1536)])
def test_quantity_to_mib_rounds_up(text, mib):
    assert quantity_to_mib(text) == mib


@pytest.mark.parametrize(
    "gpu, profile, limits, share",
    [
        ({"memory": "8Gi"}, "gpu-memory", {"nvidia.com/gpu.memory": "8192"}, "1x8Gi gpu-memory"),
        ({"memory": "8Gi", "count": 2}, "gpu-memory", {"nvidia.com/gpu.memory": "16384"}, "2x8Gi gpu-memory"),
        ({"memory": "8Gi"}, "hami", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"}, "1x8Gi hami"),
        ({"memory": "10Gi", "count": 4}, "hami", {"nvidia.com/gpu": "4", "nvidia.com/gpumem": "10240"}, "4x10Gi hami"),
        ({"memory": "8Gi"}, "whole-gpu", {"nvidia.com/gpu": "1"}, "1x8Gi whole-gpu"),
        ({"memory": "8Gi", "count": 2}, "whole-gpu", {"nvidia.com/gpu": "2"}, "2x8Gi whole-gpu"),
        ({"memory": "8Gi"}, "mig", {"nvidia.com/mig-1g.10gb": "1"}, "1x1g.10gb mig"),
        ({"memory": "12Gi"}, "mig", {"nvidia.com/mig-1g.20gb": "1"}, "1x1g.20gb mig"),
        ({"memory": "30Gi", "count": 2}, "mig", {"nvidia.com/mig-3g.40gb": "2"}, "2x3g.40gb mig"),
        ({"memory": "1500Mi"}, "gpu-memory", {"nvidia.com/gpu.memory": "1500"}, "1x1500Mi gpu-memory"),
    ],
)
def test_profiles(gpu, profile, limits, share):
    assignment = assign_gpu(GpuSpec.model_validate({**gpu, "profile": profile}), SETTINGS)
    assert assignment.limits == limits
    assert assignment.share == share
    assert assignment.node_min_gpu_memory_mib == quantity_to_mib(gpu["memory"])


def test_profile_default_comes_from_settings_and_resource_names_are_configurable():
    settings = OperatorSettings(gpu_profile="hami", gpu_resource="example.com/gpu", hami_memory_resource="example.com/mem")
    assignment = assign_gpu(GpuSpec(memory="4Gi"), settings)
    assert assignment.limits == {"example.com/gpu": "1", "example.com/mem": "4096"}
    # A per-resource override wins over the operator default.
    assert assign_gpu(GpuSpec(memory="4Gi", profile="whole-gpu"), settings).limits == {"example.com/gpu": "1"}


def test_mig_profile_too_small():
    with pytest.raises(GpuAssignmentError) as err:
        assign_gpu(GpuSpec(memory="100Gi", profile="mig"), SETTINGS)
    assert err.value.reason == "NoMigProfileFits" and "7g.80gb" in str(err.value)


@pytest.mark.parametrize(
    "mib, profiles, expected",
    [
        (9000, ("1g.10gb", "2g.20gb", "1g.20gb"), "1g.10gb"),
        (10000, ("2g.20gb", "1g.20gb", "3g.40gb"), "1g.20gb"),  # same memory: fewer slices
        (17000, ("1g.18gb", "2g.35gb", "3g.71gb"), "1g.18gb"),
        (17500, ("1g.18gb", "2g.35gb", "3g.71gb"), "2g.35gb"),
        (200000, ("1g.18gb",), None),
    ],
)
def test_smallest_mig_profile(mib, profiles, expected):
    assert smallest_mig_profile(mib, profiles) == expected


def test_mig_memory_is_decimal_gb():
    assert mig_profile_memory_mib("1g.10gb") == int(10 * 1000**3 / 2**20)


# Every MIG profile NVIDIA lists for the H100 80GB (the default) and the H200 141GB.
ALL_MIG_PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
                    "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
RENAMED = OperatorSettings(gpu_memory_resource="example.com/vram", gpu_resource="example.com/gpu",
                           hami_memory_resource="example.com/gpumem", mig_resource_prefix="example.com/slice-",
                           node_memory_label="example.com/gpu-mib")


@pytest.mark.parametrize("names", [SETTINGS, RENAMED], ids=["default", "renamed"])
@pytest.mark.parametrize("profile", ALL_MIG_PROFILES)
@pytest.mark.parametrize("count", [1, 2])
def test_gpu_codec_round_trips_every_mig_profile(names, profile, count):
    """The pod limits assign_gpu writes read back (the share policy's direction) as exactly
    the memory the assignment budgets, with the configured names: MiB in, MiB out."""
    settings = names.model_copy(update={"mig_profiles": (profile,)})
    mib = mig_profile_memory_mib(profile)
    assignment = assign_gpu(GpuSpec(memory=f"{mib}Mi", count=count, profile="mig"), settings)
    assert assignment.mig_profile == profile
    assert assignment.limits == {f"{settings.mig_resource_prefix}{profile}": str(count)}
    codec = GpuCodec.from_settings(settings)
    assert codec.container_memory_mib({"limits": assignment.limits}, per_gpu_mib=0) == mib * count
    assert assignment.memory_per_gpu_mib == mib
    node = {"metadata": {"labels": {settings.node_memory_label: "143771"}},
            "status": {"allocatable": {f"{settings.mig_resource_prefix}{profile}": "7"}}}
    assert codec.node_memory_mib(node) == 7 * mib


@pytest.mark.parametrize("settings", [SETTINGS, RENAMED], ids=["default", "renamed"])
@pytest.mark.parametrize("profile", ["gpu-memory", "hami"])
def test_gpu_codec_round_trips_memory_profiles(settings, profile):
    assignment = assign_gpu(GpuSpec(memory="10000Mi", count=2, profile=profile), settings)
    codec = GpuCodec.from_settings(settings)
    assert codec.container_memory_mib({"limits": assignment.limits}, per_gpu_mib=0) == 2 * 10_000


@pytest.mark.parametrize("profile", ["gpu-memory", "hami", "whole-gpu", "mig"])
def test_node_affinity_in_every_profile(profile):
    assignment = assign_gpu(GpuSpec(memory="8Gi", profile=profile), SETTINGS)
    term = node_affinity(assignment, SETTINGS)["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["8191"]}
    ]


def test_no_affinity_when_label_disabled():
    settings = OperatorSettings(node_memory_label="")
    assert node_affinity(assign_gpu(GpuSpec(memory="8Gi"), settings), settings) is None


def test_product_and_node_selector():
    assignment = assign_gpu(GpuSpec(memory="8Gi", product="NVIDIA-H200", node_selector={"pool": "tts"}), SETTINGS)
    assert assignment.node_selector == {"pool": "tts", "nvidia.com/gpu.product": "NVIDIA-H200"}


# --- planner ---------------------------------------------------------------------------------

SHAPE = ModelShape()
VLLM = EngineSpec(kind="vllm")


def test_chattts_default_shape_numbers():
    # 225 M parameters, 2 x 20 layers x 12 heads x 64 dims x 2 bytes = 60 KiB of KV per token.
    assert SHAPE.linear_params + SHAPE.other_params == pytest.approx(225e6, rel=0.01)
    plan = plan_memory(shape=SHAPE, weight_format=WeightFormat.FP16, engine=VLLM, gpu_memory_mib=8192)
    assert plan.kv_bytes_per_token == 2 * 20 * 12 * 64 * 2 == 61440


@pytest.mark.parametrize(
    "fmt, engine, mib, tp, fits, reason, sequences",
    [
        ("fp16", {}, 8192, 1, True, "Fits", 48),  # (6963 - 499 - 192 - 512) MiB / 120 MiB per sequence
        ("awq", {}, 8192, 1, True, "Fits", 50),
        ("awq", {"kvCacheDtype": "fp8"}, 8192, 1, True, "Fits", 100),
        ("fp16", {}, 1024, 1, False, "WeightsDoNotFit", 0),
        ("fp16", {"maxModelLen": 131072}, 4096, 1, False, "KVCacheDoesNotFit", 0),
        ("fp16", {"gpuMemoryUtilization": 0.5}, 2048, 1, False, "WeightsDoNotFit", 0),
        ("fp16", {"maxModelLen": 4096}, 2048, 1, True, "Fits", 2),
        ("fp16", {}, 8192, 5, False, "TensorParallelMismatch", 0),
        ("fp16", {}, 8192, 2, True, "Fits", 0),  # checked separately below
    ],
)
def test_plan_table(fmt, engine, mib, tp, fits, reason, sequences):
    plan = plan_memory(shape=SHAPE, weight_format=WeightFormat(fmt), engine=EngineSpec.model_validate({"kind": "vllm", **engine}),
                       gpu_memory_mib=mib, tensor_parallel=tp)
    assert (plan.fits, plan.reason) == (fits, reason), plan.message
    if tp == 1:
        assert plan.max_concurrent_sequences == sequences
    if not fits:
        assert plan.max_concurrent_sequences == 0 and plan.message


@pytest.mark.parametrize("dtype, fmt, measured_gib", [
    ("bfloat16", "fp16", 0.50), ("float32", "fp16", 0.84), ("bfloat16", "awq", 0.24)])
def test_vllm_weights_as_vllm_loaded_them_on_the_h200(dtype, fmt, measured_gib):
    # vLLM 0.26's "Actual usage is X GiB for weight" for the full-size checkpoint (upstream's shape),
    # bench/results/vllm-memory-lines-2026-12-03-s2-call7.txt and -call8.txt: the body in the engine's
    # dtype (or 4 bits), embeddings and heads float32, no auxiliary models (they are the speech API's).
    plan = plan_memory(shape=SHAPE, weight_format=WeightFormat(fmt),
                       engine=EngineSpec(kind="vllm", dtype=dtype), gpu_memory_mib=81920)
    assert plan.weights_mib == pytest.approx(measured_gib * 1024, rel=0.06)


def test_awq_weights_are_about_a_quarter():
    fp16 = plan_memory(shape=SHAPE, weight_format=WeightFormat.FP16, engine=VLLM, gpu_memory_mib=8192)
    awq = plan_memory(shape=SHAPE, weight_format=WeightFormat.AWQ, engine=VLLM, gpu_memory_mib=8192)
    linear_fp16_mib = SHAPE.linear_params * 2 / 2**20
    linear_awq_mib = SHAPE.linear_params * BYTES_4BIT_GROUP128 / 2**20
    assert fp16.weights_mib - awq.weights_mib == pytest.approx(linear_fp16_mib - linear_awq_mib, abs=2)


def test_tensor_parallel_splits_kv_per_gpu():
    one = plan_memory(shape=SHAPE, weight_format=WeightFormat.FP16, engine=VLLM, gpu_memory_mib=8192)
    two = plan_memory(shape=SHAPE, weight_format=WeightFormat.FP16, engine=VLLM, gpu_memory_mib=8192,
                      tensor_parallel=2)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.max_concurrent_sequences > one.max_concurrent_sequences


def test_kv_cache_numbers_are_consistent():
    plan = plan_memory(shape=SHAPE, weight_format=WeightFormat.AWQ, engine=VLLM, gpu_memory_mib=16384)
    assert plan.budget_mib == int(16384 * 0.85)
    assert plan.kv_cache_mib == pytest.approx(plan.budget_mib - plan.weights_mib - plan.activations_mib
                                              - plan.overhead_mib, abs=3)
    per_sequence_mib = plan.kv_bytes_per_token * 2048 / 2**20
    assert plan.max_concurrent_sequences == int(plan.kv_cache_mib // per_sequence_mib) or \
        plan.max_concurrent_sequences == int(plan.kv_cache_mib // per_sequence_mib) + 1


@pytest.mark.parametrize("utilization, warned", [(0.85, False), (0.9, False), (0.95, True), (1.0, True)])
def test_high_utilization_warns(utilization, warned):
    plan = plan_memory(shape=SHAPE, weight_format=WeightFormat.AWQ,
                       engine=EngineSpec(kind="vllm", gpu_memory_utilization=utilization, max_num_seqs=8), gpu_memory_mib=8192)
    assert any("above 0.9" in w for w in plan.warnings) == warned


def test_more_batched_tokens_cost_activation_memory():
    small = plan_memory(shape=SHAPE, weight_format=WeightFormat.AWQ,
                        engine=EngineSpec(kind="vllm", max_num_batched_tokens=2048), gpu_memory_mib=8192)
    big = plan_memory(shape=SHAPE, weight_format=WeightFormat.AWQ,
                      engine=EngineSpec(kind="vllm", max_num_batched_tokens=65536), gpu_memory_mib=8192)
    assert big.activations_mib > small.activations_mib and big.kv_cache_mib < small.kv_cache_mib


# --- the graph and reference engines -------------------------------------------------------------

KV_PER_TOKEN = 61440  # 60 KiB: 2 x 20 layers x 12 heads x 64 x 2 bytes


def plan(kind: str, mib: int, fmt: str = "fp16", tp: int = 1, **engine):
    return plan_memory(shape=SHAPE, weight_format=WeightFormat(fmt), engine=EngineSpec(kind=kind, **engine),
                       gpu_memory_mib=mib, tensor_parallel=tp)


def test_the_default_engine_is_graph():
    assert EngineSpec().kind == "graph"
    assert plan_memory(shape=SHAPE, weight_format=WeightFormat.FP16, engine=EngineSpec(),
                       gpu_memory_mib=16384).engine == "graph"


def test_graph_slot_cache_is_allocated_up_front():
    """(maxNumSeqs + 1) x maxModelLen x 60 KiB, whatever the budget: it is not "what is left"."""
    for mib in (24576, 81920):
        p = plan("graph", mib, max_num_seqs=128, max_model_len=1024)
        assert p.fits and p.parts["kvCache"] == -(-129 * 1024 * KV_PER_TOKEN // 2**20)
        assert p.max_concurrent_sequences == 128
    assert plan("graph", 81920, max_num_seqs=128, max_model_len=1024).kv_cache_mib == p.kv_cache_mib


def test_graph_hidden_history_is_planned_and_refine_rows_share_the_slot_cache():
    """The Decoder path's hidden states ((maxNumSeqs + 1) x maxModelLen x hidden x 2 bytes) are held
    beside the slot cache; refine-text rows take slots of that same cache (no cache of their own).
    The H200 probe measured 11,067 MiB at 64 x 1024 while refine-text had a second cache of
    64 x 1024 x 60 KiB = 3,840 MiB (memory-probe-h200-2026-12-01); without it, ~7,227 MiB."""
    p = plan("graph", 81920, max_num_seqs=64, max_model_len=1024)
    assert "refineKvCache" not in p.parts
    assert p.parts["hiddenHistory"] == -(-65 * 1024 * SHAPE.hidden_size * 2 // 2**20)
    assert p.kv_cache_mib >= p.parts["kvCache"] + p.parts["hiddenHistory"]
    assert sum(p.parts.values()) == pytest.approx(11067 - 3840, rel=0.05)
    tight = plan("graph", 8192, max_num_seqs=128, max_model_len=1024)
    assert not tight.fits and tight.reason == "KVCacheDoesNotFit"


def test_graph_weights_are_counted_once_per_process():
    graph, reference = plan("graph", 16384, max_model_len=1024), plan("reference", 16384, max_model_len=1024)
    assert graph.weight_copies == 2 and reference.weight_copies == 1
    assert graph.weights_mib == 2 * reference.weights_mib
    assert graph.parts["cudaContexts"] == 2 * reference.parts["cudaContexts"]
    # One copy: the GPT body in bf16, embeddings, heads and the auxiliary models float32 (load_chattts).
    one = (SHAPE.linear_params * 2 + (SHAPE.other_params + SHAPE.auxiliary_params) * 4) / 2**20
    assert reference.weights_mib == pytest.approx(one, abs=1)
    assert any("weights counted twice" in n for n in graph.notes)


@pytest.mark.parametrize("kind", ["graph", "reference"])
def test_awq_saves_disk_not_gpu_memory_on_the_runtime_engines(kind):
    fp16, awq = plan(kind, 16384, max_model_len=1024), plan(kind, 16384, "awq", max_model_len=1024)
    assert awq.weights_mib == fp16.weights_mib and awq.fits
    note = next(n for n in awq.notes if n.startswith("model.format awq"))
    assert "saves disk, not GPU memory" in note and note in awq.message
    assert not any(n.startswith("model.format") for n in fp16.notes)
    assert "notes" in awq.to_status() and awq.to_status()["notes"] == awq.notes
    # vLLM runs AWQ kernels: there the weights shrink.
    assert plan("vllm", 16384, "awq").weights_mib < plan("vllm", 16384).weights_mib


@pytest.mark.parametrize(
    "kind, mib, engine, tp, reason",
    [
        ("graph", 2048, {}, 1, "WeightsDoNotFit"),  # two copies + two CUDA contexts
        ("graph", 8192, {}, 1, "KVCacheDoesNotFit"),  # 65 x 2048 x 60 KiB = 7.6 GiB
        ("graph", 8192, {"max_model_len": 256}, 1, "Fits"),
        # the caches fit (6308 MiB of 6963), the capture pools on top of them do not
        ("graph", 8192, {"max_num_seqs": 200, "max_model_len": 320}, 1, "ActivationsDoNotFit"),
        ("graph", 16384, {"max_num_seqs": 256, "max_model_len": 1024}, 1, "KVCacheDoesNotFit"),
        ("graph", 71 * 1000**3 // 2**20, {"max_num_seqs": 256, "max_model_len": 1024}, 1, "Fits"),  # MIG 3g.71gb
        ("graph", 35 * 1000**3 // 2**20, {"max_num_seqs": 128, "max_model_len": 1024}, 1, "Fits"),  # MIG 2g.35gb
        ("graph", 16384, {"max_model_len": 1024}, 2, "TensorParallelUnsupported"),
        ("reference", 16384, {"max_model_len": 1024}, 2, "TensorParallelUnsupported"),
        ("reference", 16384, {"max_model_len": 1024}, 1, "Fits"),
        ("reference", 16384, {"max_num_seqs": 128, "max_model_len": 1024}, 1, "KVCacheDoesNotFit"),  # 3 x the rows
        ("vllm", 16384, {"max_model_len": 1024}, 2, "Fits"),
    ],
)
def test_every_engine_refuses_what_does_not_fit(kind, mib, engine, tp, reason):
    p = plan(kind, mib, tp=tp, **engine)
    assert (p.fits, p.reason) == (reason == "Fits", reason), p.message
    assert p.engine == kind and p.message
    if kind != "vllm" and reason not in ("Fits", "TensorParallelUnsupported"):
        assert f"{kind} engine" in p.message and "MiB" in p.message
    if reason == "TensorParallelUnsupported":
        assert "engine.kind vllm" in p.message


def test_graph_plan_parts_add_up():
    p = plan("graph", 32768, max_num_seqs=64, max_model_len=2048)
    assert sum(p.parts.values()) == p.weights_mib + p.kv_cache_mib + p.activations_mib + p.overhead_mib
    assert p.parts["frameHistory"] == -(-65 * 2048 * 32 // 2**20)
    assert sum(p.parts.values()) <= p.budget_mib
    status = p.to_status()
    assert status["engine"] == "graph" and status["weightCopies"] == 2 and status["parts"] == p.parts


def test_reference_kv_cache_is_planned_at_its_worst():
    p = plan("reference", 65536, max_num_seqs=64, max_model_len=1024)
    assert p.parts["kvCache"] == -(-3 * 64 * 1024 * KV_PER_TOKEN // 2**20)


def test_vllm_warns_when_the_speech_api_copy_has_no_room_outside_its_budget():
    assert not any("speech API" in w for w in plan("vllm", 16384).warnings)  # 15% of 16 GiB is room enough
    tight = plan("vllm", 16384, gpu_memory_utilization=0.95)
    assert tight.fits and any("speech API's process holds its own copy" in w for w in tight.warnings)


# --- settings ----------------------------------------------------------------------------------


def test_settings_from_env():
    settings = OperatorSettings.from_env({
        "CHATTTS_OPERATOR_GPU_PROFILE": "mig",
        "CHATTTS_OPERATOR_MIG_PROFILES": "1g.18gb, 3g.71gb",
        "CHATTTS_OPERATOR_WATCH_NAMESPACES": "a,b",
        "CHATTTS_OPERATOR_METRICS_PORT": "0",
        "PATH": "/bin",
    })
    assert settings.gpu_profile.value == "mig"
    assert settings.mig_profiles == ("1g.18gb", "3g.71gb")
    assert settings.watch_namespaces == ("a", "b")
    assert settings.metrics_port == 0


@pytest.mark.parametrize(
    "env, message",
    [
        ({"CHATTTS_OPERATOR_GPU_PROFILE": "vgpu"}, "CHATTTS_OPERATOR_GPU_PROFILE"),
        ({"CHATTTS_OPERATOR_MIG_PROFILES": "big"}, "1g.10gb"),
        ({"CHATTTS_OPERATOR_METRICS_PORT": "http"}, "CHATTTS_OPERATOR_METRICS_PORT"),
        ({"CHATTTS_OPERATOR_GPU_PROFIL": "hami"}, "unknown setting"),
    ],
)
def test_bad_settings_name_the_variable(env, message):
    with pytest.raises(SettingsError, match=message):
        OperatorSettings.from_env(env)
