"""The speech API's own CPU per request, with the engine taken out of the measurement.

Why: on the H200 the graph engine now outruns the speech API's one process. With 128-frame requests at
256 streams the API process ran at a whole core and its event loop fell tens of ms behind, which is what
raised the fixed-length row's time to first audio (bench/results/runtime-h200-2026-12-04-s4-summary.md).
Whatever the API spends per request and per streamed chunk is paid on that one core, so it is worth a
number of its own, measured on any machine, without a GPU.

The runtime's real server (``chattts_runtime.server.serve``: uvicorn, the app, the text front-end,
streaming and PCM encoding) runs in a process of its own with a tiny random checkpoint; only its engine is
replaced by one that answers every request at once with the graph engine's chunk schedule (audio windows
of 8, then 24 frames, already decoded, as the engine process delivers them). Closed-loop clients in
another process stream the responses to the end. Reported: the server process's CPU milliseconds per
request (and per audio second), its cores, and the clients' time to first audio. Compare two trees by
running this in each, alternately, on the same machine: the figure is CPU time, so it is steadier than
wall time on a shared machine, but not immune to it.

    python -m bench.runtime.api_cpu --requests 2000 --concurrency 64
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.runtime.launch import free_port, wait_ready
from bench.runtime.speech_api import process_cpu_seconds

FRAMES = 128
FRAME_SECONDS = 512 / 24_000  # one frame of ChatTTS's codes: 21.3 ms of audio
BODY = {"model": "chattts", "input": "benchmark sentence 7: the quick brown fox jumps over the lazy dog.",
        "voice": "alloy", "response_format": "pcm", "stream_format": "audio", "max_new_tokens": FRAMES}


def chunk_schedule(frames: int, chunk_frames: int = 24) -> list[int]:
    """Frames per streamed chunk of a ``frames``-long response: the runtime's own window schedule."""
    from chattts_runtime.audio_io import StreamWindows  # noqa: PLC0415

    windows, sizes, done = StreamWindows(chunk_frames), [], 0
    while done < frames:
        end = min(windows.next_end(done), frames)
        sizes.append(end - done)
        done = end
    return sizes


def _serve(checkpoint: str, port: int, frames: int) -> None:
    """The server process: the runtime's server, its engine replaced by one that answers at once."""
    import numpy as np  # noqa: PLC0415

    import chattts_runtime.server as server  # noqa: PLC0415
    from chattts_runtime.config import RuntimeConfig  # noqa: PLC0415
    from chattts_runtime.engines.base import Engine, FrameChunk  # noqa: PLC0415

    sizes = chunk_schedule(frames)

    class AnswersAtOnce(Engine):
        name = "answers-at-once"
        decodes_audio = True  # chunks carry decoded audio, as the graph engine's do
        refines_text = False

        def __init__(self, samples_per_frame: int, num_vq: int):
            self.max_model_len, self.max_num_seqs, self.max_waiting = 1024, 256, 4096
            self.samples_per_frame, self.num_vq = samples_per_frame, num_vq

        async def start(self) -> None:
            pass

        async def stop(self) -> None:
            pass

        def submit(self, request):
            async def chunks():
                for i, n in enumerate(sizes):
                    await asyncio.sleep(0)  # other streams' chunks interleave, as they would
                    last = i == len(sizes) - 1
                    yield FrameChunk(np.zeros((n, self.num_vq), np.int64),
                                     audio=np.zeros(n * self.samples_per_frame, np.float32),
                                     finished=last, finish_reason="length" if last else None)
            return chunks()

        def abort(self, request_id: str) -> None:
            pass

        @property
        def num_waiting(self) -> int:
            return 0

        @property
        def num_running(self) -> int:
            return 0

        def describe(self) -> dict:
            return {"kind": self.name}

    server.create_engine = lambda config, model, *a, **k: AnswersAtOnce(model.sizes.samples_per_frame,
                                                                         model.sizes.gpt.num_vq)
    config = RuntimeConfig.model_validate({
        "model": {"path": checkpoint}, "engine_kind": "reference", "device": "cpu",
        "server": {"host": "127.0.0.1", "port": port, "max_queue": 4096},
        "text": {"frames_per_text_token": 4.0},
        "generation": {"refine_text": False, "audio_decoder": "dvae", "max_new_frames": frames, "warmup": False}})
    sys.exit(server.serve(config))


async def _clients(url: str, concurrency: int, requests: int) -> list[float]:
    """Closed-loop streaming clients; each request's time to first audio."""
    import aiohttp  # noqa: PLC0415

    left, ttfa = [requests], []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def client():
            while left[0] > 0:
                left[0] -= 1
                t0, first = time.perf_counter(), None
                async with session.post(url + "/v1/audio/speech", json=BODY) as response:
                    if response.status != 200:
                        raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:300]}")
                    async for _ in response.content.iter_any():
                        first = first if first is not None else time.perf_counter() - t0
                if first is None:
                    raise RuntimeError("a response brought no audio")
                ttfa.append(first)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return ttfa


def _client_process(url: str, concurrency: int, requests: int, out) -> None:
    try:
        out.send(("ok", asyncio.run(_clients(url, concurrency, requests))))
    except BaseException as err:  # noqa: BLE001  (reported to the parent)
        out.send(("error", f"{type(err).__name__}: {err}"))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Polled:
    """A ``multiprocessing.Process`` as ``launch.wait_ready`` polls a server: ``poll()`` and ``returncode``."""

    def __init__(self, process):
        self.process = process

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode


def measure(requests: int, concurrency: int, frames: int = FRAMES) -> dict:
    from chattts_runtime.testing import make_tiny_checkpoint  # noqa: PLC0415

    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_tiny_checkpoint(Path(tmp) / "ckpt")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = ctx.Process(target=_serve, args=(str(checkpoint), port, frames), daemon=True)
        server.start()
        try:
            asyncio.run(wait_ready(url, _Polled(server), timeout=300))
            # Warm: the first requests import and compile what later ones reuse.
            warm_in, warm_out = ctx.Pipe(duplex=False)
            ctx.Process(target=_client_process, args=(url, 4, 16, warm_out), daemon=True).start()
            status, warm = warm_in.recv()
            if status != "ok":
                raise RuntimeError(f"warm-up failed: {warm}")
            got, out = ctx.Pipe(duplex=False)
            client = ctx.Process(target=_client_process, args=(url, concurrency, requests, out), daemon=True)
            cpu0, t0 = process_cpu_seconds(server.pid), time.monotonic()
            client.start()
            status, ttfa = got.recv()
            wall, cpu = time.monotonic() - t0, process_cpu_seconds(server.pid) - cpu0
            client.join(30)
            if status != "ok":
                raise RuntimeError(f"the clients failed: {ttfa}")
        finally:
            server.terminate()
            server.join(30)
    audio_s = requests * frames * FRAME_SECONDS
    return {"requests": requests, "concurrency": concurrency, "frames": frames,
            "chunks_per_request": len(chunk_schedule(frames)), "wall_s": round(wall, 3),
            "server_cpu_s": round(cpu, 3), "server_cores": round(cpu / wall, 3),
            "server_cpu_ms_per_request": round(1e3 * cpu / requests, 4),
            "server_cpu_ms_per_audio_s": round(1e3 * cpu / audio_s, 4),
            "ttfa_p50_ms": round(1e3 * _percentile(ttfa, 0.5), 2), "ttfa_p99_ms": round(1e3 * _percentile(ttfa, 0.99), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime.api_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests measured (after 16 to warm up)")
    parser.add_argument("--concurrency", type=int, default=64, help="closed-loop streams")
    parser.add_argument("--frames", type=int, default=FRAMES, help="frames per response (21.3 ms each)")
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    if min(args.requests, args.concurrency, args.frames) < 1:
        parser.error("--requests, --concurrency and --frames must be at least 1")
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
              **measure(args.requests, args.concurrency, args.frames)}
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
