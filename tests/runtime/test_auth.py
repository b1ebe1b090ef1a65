"""API keys on the speech API: a Kubernetes Secret volume's layout, constant-time checks, live reload."""
from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from rt_helpers import launch_server, stop_server, tiny_server_config

KEY_A = "sk-test-alpha-0123456789"
KEY_B = "sk-test-bravo-9876543210"


def write_secret_volume(root: Path, entries: dict[str, str], generation: int) -> None:
    """What the kubelet writes for a Secret: a timestamped data dir, ``..data`` pointing at it, key links."""
    data = root / f"..2026_12_01_00_00_0{generation}.000000"
    data.mkdir()
    for name, value in entries.items():
        (data / name).write_text(value)
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to(data.name)
    os.replace(tmp_link, root / "..data")  # the atomic swap the kubelet does
    for name in entries:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def test_keys_from_a_file_and_a_secret_volume(tmp_path):
    from chattts_runtime.auth import APIKeys, bearer_token

    file = tmp_path / "keys.txt"
    file.write_text(f"# rotated monthly\n{KEY_A}\n\n  {KEY_B}  \n")
    keys = APIKeys(file)
    assert len(keys) == 2 and keys.accepts(KEY_A) and keys.accepts(KEY_B)
    assert not keys.accepts(KEY_A[:-1]) and not keys.accepts("") and not keys.accepts(None)
    volume = tmp_path / "secret"
    volume.mkdir()
    write_secret_volume(volume, {"key": KEY_A, "team-b": KEY_B + "\n"}, 1)
    now = [0.0]
    keys = APIKeys(volume, reload_seconds=1.0, clock=lambda: now[0])
    assert len(keys) == 2  # the ..data link and the timestamped directory are not keys
    write_secret_volume(volume, {"key": "sk-rotated", "team-b": KEY_B}, 2)
    assert keys.accepts(KEY_A)  # not re-checked yet
    now[0] = 1.5
    assert keys.accepts("sk-rotated") and not keys.accepts(KEY_A)
    assert bearer_token(f"Bearer {KEY_A}") == KEY_A and bearer_token(f"bearer  {KEY_A} ") == KEY_A
    assert bearer_token(f"Basic {KEY_A}") is None and bearer_token("Bearer ") is None
    missing = APIKeys(tmp_path / "absent")
    assert len(missing) == 0 and not missing.accepts("")  # fails closed


@pytest.fixture(scope="module")
def secured(tmp_path_factory, tiny_checkpoint):
    tmp = tmp_path_factory.mktemp("auth")
    volume = tmp / "api-keys"
    volume.mkdir()
    write_secret_volume(volume, {"key": KEY_A}, 1)
    srv = launch_server(tiny_server_config(
        tiny_checkpoint, server={"api_keys_path": str(volume), "api_keys_reload_seconds": 0.2}), tmp)
    srv.volume = volume
    yield srv
    stop_server(srv)


def test_speech_needs_a_key_and_probes_stay_open(secured):
    with secured.client() as c:
        for path in ("/health", "/ready", "/metrics"):
            assert c.get(path).status_code == 200
        for headers, message in (({}, "didn't provide"), ({"Authorization": "Bearer sk-wrong"}, "Incorrect"),
                                 ({"Authorization": f"Basic {KEY_A}"}, "didn't provide")):
            r = c.post("/v1/audio/speech", json={"model": "chattts", "voice": "alloy", "input": "hi"},
                       headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            err = r.json()["error"]
            assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
            assert message in err["message"] and "sk-wrong" not in r.text
            assert c.get("/v1/models", headers=headers).status_code == 401
        ok = c.post("/v1/audio/speech", json={"model": "chattts", "voice": "alloy", "input": "hi",
                                              "response_format": "pcm"},
                    headers={"Authorization": f"Bearer {KEY_A}"})
        assert ok.status_code == 200 and ok.content
    metrics = httpx.get(secured.url + "/metrics").text
    assert 'chattts_requests_total{status="client_error"} 3.0' in metrics
    assert KEY_A not in secured.log()


def test_api_docs_need_the_key_when_keys_are_on(secured):
    with secured.client() as c:
        for path in ("/docs", "/redoc", "/openapi.json"):
            r = c.get(path)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
            assert c.get(path, headers={"Authorization": f"Bearer {KEY_A}"}).status_code == 200, path


def test_rotated_secret_takes_effect_without_restart(secured):
    write_secret_volume(secured.volume, {"key": KEY_B}, 2)
    deadline = time.monotonic() + 10
    with secured.client() as c:
        while time.monotonic() < deadline:
            r = c.get("/v1/models", headers={"Authorization": f"Bearer {KEY_B}"})
            if r.status_code == 200:
                break
            time.sleep(0.1)
        assert r.status_code == 200
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {KEY_A}"}).status_code == 401
    assert secured.proc.poll() is None and KEY_B not in secured.log()
