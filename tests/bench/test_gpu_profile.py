"""The GPU profile's summary of a trace: the busy share is the union of device work over streams (overlaps
counted once), streams and kernel families are told apart, and a CPU machine's trace is summarized too."""
from __future__ import annotations

import json

from bench.runtime.gpu_profile import family_of, profile_window, summarize_trace


def _kernel(name, ts, dur, stream, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_busy_share_counts_overlapping_streams_once_and_names_the_families():
    trace = {"traceEvents": [
        _kernel("sm90_xmma_gemm_bf16", 0, 400, 7),
        _kernel("fmha_cutlassF_bf16", 300, 300, 7),  # overlaps the gemm by 100 us on the same stream
        _kernel("cudnn::conv_fwd_kernel", 500, 200, 13),  # overlaps on the audio stream
        _kernel("Memcpy DtoH (Device -> Pinned)", 900, 50, 7, cat="gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # host work: not the GPU's
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 10},
    ]}
    summary = summarize_trace(trace, window_s=0.002)
    assert summary["events"] == "gpu" and summary["count"] == 4
    assert summary["busy_ms"] == 0.75  # [0, 700) and [900, 950)
    assert summary["busy_share"] == 0.375
    assert summary["streams"]["7"] == {"busy_share": 0.325, "count": 3}  # [0, 600) and [900, 950)
    assert summary["streams"]["13"] == {"busy_share": 0.1, "count": 1}
    assert summary["families_ms"] == {"matmul": 0.4, "attention": 0.3, "convolution": 0.2, "copy": 0.05}
    assert summary["top"][0] == {"name": "sm90_xmma_gemm_bf16", "count": 1, "total_ms": 0.4, "mean_us": 400.0}


def test_without_device_events_the_cpu_operators_are_summarized():
    trace = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 0, "dur": 1000,
                              "tid": 1}]}
    summary = summarize_trace(trace, window_s=0.01)
    assert summary["events"] == "cpu_op" and summary["busy_share"] == 0.1


def test_families():
    assert family_of("void at::native::vectorized_elementwise_kernel<4>") == "elementwise"
    assert family_of("triton_poi_fused_add_0") == "triton"
    assert family_of("ampere_bf16_s16816gemm") == "matmul"
    assert family_of("something_new") == "other"


def test_a_window_on_this_machine_writes_its_summary(tmp_path):
    summary = profile_window(0.05, tmp_path, 0, keep_trace=True)
    written = json.loads((tmp_path / f"gpu-profile-{summary['pid']}-0.json").read_text())
    assert written == summary and written["window_s"] == 0.05
    assert (tmp_path / f"trace-{summary['pid']}-0.json.gz").exists()
    assert not list(tmp_path.glob("*.json.tmp")) and not (tmp_path / f"trace-{summary['pid']}-0.json").exists()
