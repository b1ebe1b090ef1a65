"""The CPU runtime image serves a tiny random checkpoint (mounted read-only) over loopback."""
from __future__ import annotations

import io
import json
import urllib.request
import wave

import pytest

from conftest import LOCKED_DOWN, free_port, podman, wait_for_http  # at import: tests/images' conftest

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



def test_runtime_image_speaks_numbers_dates_and_amounts(runtime_cpu_image):
    """The image carries the language normalizers with their grammars built (no compiling at start): a date
    and an amount come out spelled out, and the runtime's default finds both normalizers."""
    code = ("import json; from chattts_runtime.text import language as l; "
            "n = l.load_language_normalizers('installed'); print(json.dumps({'names': l.installed_normalizers(), "
            "'grammars': sorted(p.name for p in l.GRAMMAR_DIR.glob('*.far')), 'zh': n['zh']('2024年3月15日下午3:30'), "
            "'en': n['en']('It costs $1,234.50.')}))")
    result = podman("run", "--rm", *LOCKED_DOWN, "--entrypoint=python", runtime_cpu_image, "-c", code, timeout=300)
    said = json.loads(result.stdout.strip().splitlines()[-1])
    assert said["names"] == ["wetext", "nemo"]
    assert said["zh"].startswith("二零二四年三月十五日下午三点三十分")
    assert "one thousand two hundred and thirty four dollars fifty cents" in said["en"]
    # nemo's English grammars were compiled at build time, into the cache the runtime loads them from
    assert any(name.startswith("en_tn_") for name in said["grammars"]), said["grammars"]
