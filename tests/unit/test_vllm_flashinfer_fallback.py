"""The vllm engine without FlashInfer: vLLM 0.26's CUDA sampler import is turned off, not left to fail the
engine core's start (what the H200 showed on 2026-12-03). Needs no vLLM: the check runs before it starts."""
from __future__ import annotations

import importlib.util

import pytest

from chattts_runtime.engines.vllm_engine import use_native_sampler_without_flashinfer


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
