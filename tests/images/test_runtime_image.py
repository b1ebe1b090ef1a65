"""The CPU runtime image serves a tiny random checkpoint (mounted read-only) over loopback."""
from __future__ import annotations

import io
import json
import urllib.request
import wave

import pytest

from conftest import free_port, wait_for_http

pytestmark = pytest.mark.images


@pytest.fixture
def readable_checkpoint(tmp_path):
    """A tiny random checkpoint the container's user (65532) can read."""
    from chattts_runtime.testing import make_tiny_checkpoint

    checkpoint = make_tiny_checkpoint(tmp_path / "checkpoint")
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return checkpoint


def test_runtime_image_serves_speech_from_a_read_only_checkpoint(runtime_cpu_image, readable_checkpoint,
                                                                  run_container):
    port = free_port()
    container = run_container(runtime_cpu_image, "serve", options=[
        f"--volume={readable_checkpoint}:/models/chattts:ro",
        "--env=CHATTTS_ENGINE_KIND=reference", "--env=CHATTTS_DEVICE=cpu",
        "--env=CHATTTS_SERVER__HOST=127.0.0.1", f"--env=CHATTTS_SERVER__PORT={port}",
        "--env=CHATTTS_GENERATION__MAX_NEW_FRAMES=24"])
    base = f"http://127.0.0.1:{port}"
    wait_for_http(f"{base}/ready", container)

    request = urllib.request.Request(f"{base}/v1/audio/speech", method="POST",
                                     headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "chattts", "input": "Hello from the image.",
                                                      "voice": "alloy", "response_format": "wav"}).encode())
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        audio = response.read()
    with wave.open(io.BytesIO(audio)) as wav:
        assert wav.getframerate() == 24000 and wav.getnchannels() == 1
        frames = wav.readframes(wav.getnframes())
    assert wav.getnframes() > 0 and any(frames), "the WAV holds no samples or only silence"

