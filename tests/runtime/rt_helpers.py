"""Helpers shared by the runtime tests (servers on loopback, requests)."""
from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import numpy as np

from chattts_runtime.engines.base import SynthesisRequest
from tests.support import RunningServer, free_port, launch_server, wait_ready  # noqa: F401  (the tier imports them from here)

REPO = Path(__file__).resolve().parents[2]


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


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
