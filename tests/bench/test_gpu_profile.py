"""The GPU profile's summary of a trace: the busy share is the union of device work over streams (overlaps
counted once), streams and kernel families are told apart, and a CPU machine's trace is summarized too."""
from __future__ import annotations

import json

from bench.runtime.gpu_profile import family_of, profile_window, summarize_dir, summarize_trace


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


def test_a_window_on_this_machine_is_summarized_after_it_and_its_trace_kept_as_asked(tmp_path):
    for index in range(3):
        trace = profile_window(0.05, tmp_path, index)
        assert trace.exists() and (tmp_path / trace.name.replace("trace-", "window-")).exists()
    summaries = summarize_dir(tmp_path, keep_every=2)
    assert [s["index"] for s in summaries] == [0, 1, 2]
    pid = summaries[0]["pid"]
    written = json.loads((tmp_path / f"gpu-profile-{pid}-1.json").read_text())
    assert written == summaries[1] and written["window_s"] == 0.05
    # The first window's trace and every second one's are kept; nothing raw is left.
    assert sorted(p.name for p in tmp_path.glob("trace-*")) == [f"trace-{pid}-0.json.gz", f"trace-{pid}-2.json.gz"]
    assert not list(tmp_path.glob("window-*"))


def test_a_span_longer_than_the_window_is_what_shares_are_of():
    trace = {"traceEvents": [_kernel("gemm", 0, 1000, 7), _kernel("gemm", 1500, 1000, 7)]}
    summary = summarize_trace(trace, window_s=0.002)  # the work spans 2.5 ms of a 2 ms window
    assert summary["span_ms"] == 2.5 and summary["busy_share"] == 0.8


def test_float32_products_on_cuda_cores_are_a_family_of_their_own():
    assert family_of("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8") == "matmul_fp32"
    assert family_of("void sgemm_largek_lds64<true, false, 5, 5>") == "matmul_fp32"
    assert family_of("nvjet_sm90_hsh_64x96_64x10_4x1_v_bz_TNT") == "matmul"
    assert family_of("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc") == "convolution"


def test_a_trace_cut_short_is_reported_and_the_others_summarized(tmp_path, capsys):
    profile_window(0.01, tmp_path, 0)
    (tmp_path / "trace-99-1.json").write_text('{"traceEvents": [')  # the step was stopped while writing it
    summaries = summarize_dir(tmp_path)
    assert [s["index"] for s in summaries] == [0]
    assert "trace-99-1.json: not summarized" in capsys.readouterr().out
    assert not (tmp_path / "trace-99-1.json").exists()
