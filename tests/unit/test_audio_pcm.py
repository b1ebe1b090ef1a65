"""16-bit PCM, the bytes of every streamed pcm/wav chunk: clipped, scaled by 32767, NaN as silence."""
from __future__ import annotations

import numpy as np
import pytest

from chattts_runtime.audio_io import to_pcm16


def _spec(samples: np.ndarray) -> bytes:
    """The conversion as first written (NaN to 0, clip, scale, truncate): the fast one must give its bytes."""
    clipped = np.clip(np.nan_to_num(samples, nan=0.0), -1.0, 1.0)
    return (clipped * 32767.0).astype("<i2").tobytes()


def test_known_values():
    got = np.frombuffer(to_pcm16(np.array([0.0, 1.0, -1.0, 0.5, 2.0, -7.0, np.nan, np.inf, -np.inf, -0.0],
                                          np.float32)), "<i2")
    assert got.tolist() == [0, 32767, -32767, 16383, 32767, -32767, 0, 32767, -32767, 0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equals_the_plain_conversion_on_hostile_samples(dtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(50_000) * 1.5).astype(dtype)
    x[::97], x[::101], x[::103] = np.nan, np.inf, -np.inf
    assert to_pcm16(x) == _spec(x)
    assert to_pcm16(x[::3]) == _spec(x[::3])  # a strided view
    before = x.copy()
    to_pcm16(x)
    np.testing.assert_array_equal(x, before)  # the caller's samples are left as they were


def test_empty_and_integer_input():
    assert to_pcm16(np.zeros(0, np.float32)) == b""
    ints = np.array([0, 1, -1, 3])
    assert to_pcm16(ints) == _spec(ints)
