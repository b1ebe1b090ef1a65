"""GPU memory of nodes and pods in MiB across sharing profiles (the deployment's GPU codec,
read back); label selectors."""
from __future__ import annotations

from decimal import Decimal

import pytest

from chattts_operator.api.common import bytes_to_mib
from chattts_operator.api.common import parse_live_quantity as parse_quantity
from chattts_operator.api.sharepolicy import LabelSelector
from chattts_operator.deployment.gpu import DEFAULT_GPU_CODEC, mig_profile_memory_mib
from chattts_operator.sharepolicy.resources import node_is_usable, selector_matches, selector_string

node_gpu_memory_mib = DEFAULT_GPU_CODEC.node_memory_mib
pod_spec_gpu_memory_mib = DEFAULT_GPU_CODEC.pod_spec_memory_mib


@pytest.mark.parametrize(
    "text, value",
    [("24Gi", Decimal(24 * 2**30)), ("1500M", Decimal(1_500_000_000)), ("3", Decimal(3)), (7, Decimal(7)),
     ("500m", Decimal("0.5")), ("1.5Gi", Decimal(3 * 2**29)), ("1e3", Decimal(1000))],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "Gi", "12GB", "1.2.3", True, "ten"])
def test_parse_quantity_rejects_malformed(bad):
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity(bad)


def test_bytes_to_mib_rounds_up():
    assert bytes_to_mib("24Gi") == 24 * 1024
    assert bytes_to_mib("1M") == 1  # 0.95 MiB: never under-count


def node(allocatable=None, labels=None, ready="True", unschedulable=False):
    return {
        "metadata": {"name": "n", "labels": labels or {}},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": allocatable or {}, "conditions": [{"type": "Ready", "status": ready}]},
    }


H200_LABELS = {"nvidia.com/gpu.memory": "143771", "nvidia.com/gpu.count": "8"}

NODE_CASES = [
    ("gpu.memory resource (summed over GPUs)", node({"nvidia.com/gpu.memory": "1150168", "nvidia.com/gpu": "8"}, H200_LABELS), 1_150_168),
    ("whole GPUs x GFD label", node({"nvidia.com/gpu": "8"}, H200_LABELS), 8 * 143_771),
    ("GFD labels only", node({}, H200_LABELS), 8 * 143_771),
    ("MIG slices", node({"nvidia.com/mig-1g.18gb": "16", "nvidia.com/mig-3g.71gb": "8"}, {"nvidia.com/gpu.memory": "143771"}),
     16 * mig_profile_memory_mib("1g.18gb") + 8 * mig_profile_memory_mib("3g.71gb")),
    # The simulated demo node (hack/cluster nodes.yaml): every GPU partitioned, GFD's gpu.count still 8;
    # the slices hold the GPUs' memory, counted once.
    ("MIG slices with GFD's gpu.count", node({"nvidia.com/mig-1g.18gb": "16", "nvidia.com/mig-3g.71gb": "8"},
                                             H200_LABELS),
     16 * mig_profile_memory_mib("1g.18gb") + 8 * mig_profile_memory_mib("3g.71gb")),
    ("MIG mixed: 2 whole GPUs and slices", node({"nvidia.com/gpu": "2", "nvidia.com/mig-3g.71gb": "12"}, H200_LABELS),
     2 * 143_771 + 12 * mig_profile_memory_mib("3g.71gb")),
    ("volcano", node({"volcano.sh/vgpu-memory": "40000"}), 40_000),
    ("no GPUs", node({"cpu": "8"}), 0),
]


@pytest.mark.parametrize("case, obj, mib", NODE_CASES, ids=[c[0] for c in NODE_CASES])
def test_node_gpu_memory(case, obj, mib):
    assert node_gpu_memory_mib(obj) == mib


def test_node_usable():
    assert node_is_usable(node())
    assert not node_is_usable(node(ready="False"))
    assert not node_is_usable(node(unschedulable=True))
    assert not node_is_usable({"metadata": {}, "status": {}})


def pod(*limits, init=()):
    return {
        "containers": [{"name": f"c{i}", "resources": {"limits": lim}} for i, lim in enumerate(limits)],
        "initContainers": [{"name": f"i{i}", "resources": {"limits": lim}} for i, lim in enumerate(init)],
    }


POD_CASES = [
    ("gpu-memory profile", pod({"nvidia.com/gpu.memory": "20480"}), 20_480),
    ("hami: MiB per GPU x GPUs", pod({"nvidia.com/gpumem": "10000", "nvidia.com/gpu": "2"}), 20_000),
    ("hami percentage", pod({"nvidia.com/gpumem-percentage": "50", "nvidia.com/gpu": "1"}), 71_886),
    ("whole GPU", pod({"nvidia.com/gpu": "2"}), 2 * 143_771),
    ("MIG", pod({"nvidia.com/mig-2g.35gb": "1"}), mig_profile_memory_mib("2g.35gb")),
    ("two containers add up", pod({"nvidia.com/gpu.memory": "1000"}, {"nvidia.com/gpu.memory": "500"}), 1_500),
    ("a bigger init container decides", pod({"nvidia.com/gpu.memory": "1000"}, init=[{"nvidia.com/gpu.memory": "4000"}]), 4_000),
    ("CPU only", pod({"cpu": "1"}), 0),
]


@pytest.mark.parametrize("case, spec, mib", POD_CASES, ids=[c[0] for c in POD_CASES])
def test_pod_gpu_memory(case, spec, mib):
    assert pod_spec_gpu_memory_mib(spec, per_gpu_mib=143_771) == mib


SELECTOR = LabelSelector.model_validate(
    {
        "matchLabels": {"pool": "tts"},
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
            {"key": "drain", "operator": "DoesNotExist"},
            {"key": "nvidia.com/gpu.product", "operator": "Exists"},
            {"key": "tier", "operator": "NotIn", "values": ["spot"]},
        ],
    }
)


@pytest.mark.parametrize(
    "labels, expected",
    [
        ({"pool": "tts", "zone": "a", "nvidia.com/gpu.product": "H200"}, True),
        ({"pool": "tts", "zone": "b", "nvidia.com/gpu.product": "H200", "tier": "reserved"}, True),
        ({"pool": "tts", "zone": "c", "nvidia.com/gpu.product": "H200"}, False),
        ({"pool": "tts", "zone": "a", "nvidia.com/gpu.product": "H200", "drain": "1"}, False),
        ({"pool": "tts", "zone": "a"}, False),
        ({"pool": "tts", "zone": "a", "nvidia.com/gpu.product": "H200", "tier": "spot"}, False),
        ({"zone": "a", "nvidia.com/gpu.product": "H200"}, False),
    ],
)
def test_selector_matches(labels, expected):
    assert selector_matches(SELECTOR, labels) is expected


def test_selector_string():
    assert selector_string(SELECTOR) == "pool=tts,zone in (a,b),!drain,nvidia.com/gpu.product,tier notin (spot)"
    assert selector_string(LabelSelector()) == ""
