"""The environment the vllm engine gives its engine core on CUDA (what the H200 showed on 2026-12-03):
without FlashInfer, vLLM 0.26's CUDA sampler import is turned off, not left to fail the engine core's
start; a float32 engine's Triton dot products are IEEE float32, not TF32. Needs no vLLM: both are set
before the engine core starts."""
from __future__ import annotations

import importlib.util

import pytest

from chattts_runtime.engines.vllm_engine import ieee_float32_in_triton, use_native_sampler_without_flashinfer


def test_without_flashinfer_the_native_sampler_is_asked_for(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else real(name, *a))
    environ: dict[str, str] = {}
    assert use_native_sampler_without_flashinfer(environ) is True
    assert environ == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


@pytest.mark.parametrize("setting", ["0", "1"])
def test_an_explicit_setting_is_left_alone(setting, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    environ = {"VLLM_USE_FLASHINFER_SAMPLER": setting}
    assert use_native_sampler_without_flashinfer(environ) is False
    assert environ == {"VLLM_USE_FLASHINFER_SAMPLER": setting}


def test_with_flashinfer_installed_nothing_changes(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    environ: dict[str, str] = {}
    assert use_native_sampler_without_flashinfer(environ) is False and environ == {}


def test_a_float32_engine_asks_triton_for_ieee_float32():
    environ: dict[str, str] = {}
    assert ieee_float32_in_triton("float32", environ) is True
    assert environ == {"TRITON_F32_DEFAULT": "ieee"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "auto"])
def test_a_16bit_engine_keeps_triton_defaults(dtype):
    environ: dict[str, str] = {}
    assert ieee_float32_in_triton(dtype, environ) is False and environ == {}


def test_an_explicit_triton_precision_is_left_alone():
    environ = {"TRITON_F32_DEFAULT": "tf32"}
    assert ieee_float32_in_triton("float32", environ) is False
    assert environ == {"TRITON_F32_DEFAULT": "tf32"}
