"""Helpers shared by the runtime tests (servers on loopback, requests)."""
from __future__ import annotations

import asyncio
import hashlib
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np

from chattts_runtime.engines.base import SynthesisRequest
from tests.support import free_port

REPO = Path(__file__).resolve().parents[2]


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class RunningServer:
    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path):
        self.proc, self.url, self.log_path = proc, url, log_path

    def client(self, **kw) -> "httpx.Client":
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 60.0), **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, list]:
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {f.name: f.samples for f in text_string_to_metric_families(text)}


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready after {timeout}s:\n{log_path.read_text()}")


def launch_server(config: dict, workdir: Path, env_extra: dict[str, str] | None = None) -> RunningServer:
    """``chattts-runtime serve`` with ``config`` (its port set) as a subprocess, once ready; stop it by pid.
    ``env_extra``: more environment for it (``PYTHONPATH`` for packages installed apart)."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    port = config["server"]["port"]
    cfg_path = workdir / f"runtime-{port}.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    log_path = workdir / f"server-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATTTS_")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "2")
    env.update(env_extra or {})
    proc = subprocess.Popen([sys.executable, "-m", "chattts_runtime", "serve", "--config", str(cfg_path)],
                            stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log_path)
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    return RunningServer(proc, url, log_path)


def tiny_server_config(checkpoint: Path, **overrides) -> dict:
    """The runtime tier's usual server: reference engine on CPU, loopback, greedy, short outputs."""
    return merge({
        "model": {"path": str(checkpoint)},
        "engine_kind": "reference",
        "device": "cpu",
        "server": {"host": "127.0.0.1", "port": free_port(), "shutdown_grace_seconds": 30},
        "generation": {"temperature": 0, "max_new_frames": 48, "refine_text": False},
    }, overrides)


def stop_server(server: RunningServer) -> None:
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(timeout=30)


def speech(client, **body):
    payload = {"model": "chattts", "voice": "alloy"}
    payload.update(body)
    return client.post("/v1/audio/speech", json=payload)


# -- engines driven directly (no HTTP) ---------------------------------------------------------

TEXTS = ["hello", "hello world, this is a longer sentence", "hi", "one two three four five six seven",
         "你好世界", "a", "the quick brown fox jumps over the lazy dog", "12345 67890"]


class Recorder:
    def __init__(self):
        self.waits: list[float] = []
        self.batches: list[int] = []

    def on_scheduled(self, request, wait_seconds):
        self.waits.append(wait_seconds)

    def on_step(self, batch_size):
        self.batches.append(batch_size)


def fixed_speaker(model) -> np.ndarray:
    """A fixed speaker vector, independent of how presets are drawn: the draw these engine tests
    were written against (on the tiny random model some texts end early with it, others run on)."""
    seed = int.from_bytes(hashlib.sha256(b"alloy").digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(model.sizes.gpt.hidden_size).astype(np.float32)


def request(model, i, text, params):
    prompt = model.tokenizer.build(text, with_speaker=True)
    return SynthesisRequest(f"r{i}", prompt.input_ids, fixed_speaker(model), params)


async def run_all(engine_cls, model, texts, params, *, concurrent, stagger=0.0, make_request=request, **engine_kw):
    """Each text as one request (at once, or one after another): (frames, chunk sizes, finish reason) each;
    ``make_request(model, i, text, params)`` builds request ``i``."""
    rec = Recorder()
    engine = engine_cls(model, observer=rec, **engine_kw)
    await engine.start()

    async def one(i, text):
        await asyncio.sleep(stagger * i)
        frames, chunks, reason = [], [], None
        async for chunk in engine.submit(make_request(model, i, text, params)):
            chunks.append(len(chunk.codes))
            frames.extend(chunk.codes.tolist())
            reason = chunk.finish_reason
        return frames, chunks, reason

    try:
        if concurrent:
            results = await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
        else:
            results = [await one(i, t) for i, t in enumerate(texts)]
    finally:
        await engine.stop()
    return results, rec
