"""The speech API's own CPU per request, with the engine taken out of the measurement.

Why: on the H200 the graph engine now outruns the speech API's one process. With 128-frame requests at
256 streams the API process ran at a whole core and its event loop fell tens of ms behind, which is what
raised the fixed-length row's time to first audio (bench/results/runtime-h200-2026-12-04-s4-summary.md).
Whatever the API spends per request and per streamed chunk is paid on that one core, so it is worth a
number of its own, measured on any machine, without a GPU.

The runtime's real server (``chattts_runtime.server.serve``: uvicorn, the app, the text front-end,
streaming and PCM encoding) runs in a process of its own with a tiny random checkpoint; only the model's
work is taken out: its engine is a paced stand-in for the graph engine's loop (a frame per request every
``--step-ms``, each audio window sent when the runtime's window schedule says, already decoded), run as
on a GPU in an engine process behind the real ``ProcessEngine`` (its pipes, reader thread and chunk
delivery are the API process's work too), or with ``--process same`` in the server's process.
Closed-loop clients in another process stream the responses to the end. Reported: the server process's
CPU milliseconds per request (and per audio second; the engine process is not counted), its cores, and the
clients' time to first audio. Compare two trees by running this in each, alternately, on the same machine:
the figure is CPU time, steadier than wall time on a shared machine, not immune to it.

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

import numpy as np

from bench.runtime.launch import free_port, wait_ready
from bench.runtime.speech_api import process_cpu_seconds
from chattts_runtime.audio_io import StreamWindows
from chattts_runtime.config import GenerationSettings
from chattts_runtime.engines.base import Engine, FrameChunk
from chattts_runtime.engines.plumbing import RequestPlumbing

FRAMES = 128
FRAME_SECONDS = 512 / 24_000  # one frame of ChatTTS's codes: 21.3 ms of audio
STEP_MS = 3.0  # the graph engine's decode step at 64-256 streams on the H200 is ~2.5-6.5 ms
BODY = {"model": "chattts", "input": "benchmark sentence 7: the quick brown fox jumps over the lazy dog.",
        "voice": "alloy", "response_format": "pcm", "stream_format": "audio", "max_new_tokens": FRAMES}


def chunk_schedule(frames: int, chunk_frames: int = 24) -> list[int]:
    """Frames of audio per streamed chunk of a ``frames``-long response: the runtime's own window schedule,
    with the config's defaults otherwise (the stand-in sends each chunk when its audio's last frame is made,
    not the lookahead's frames later: the same chunks, a few steps sooner)."""
    windows = StreamWindows.of(GenerationSettings(stream_chunk_frames=chunk_frames))
    sizes, sent = [], 0
    while sent < frames:
        end = min(windows.next_end(sent), frames)
        after = windows.sent_after(end, final=end == frames)
        sizes.append(after - sent)
        sent = after
    return sizes


class PacedEngine(Engine):
    """A stand-in for the graph engine's worker loop, with no model: every ``step_ms`` each running
    request gains one frame, and its audio window (silence, already decoded) goes out when the runtime's
    window schedule says it is due, all of a step's windows in one batch, as the graph engine emits them.
    It runs behind the real ``ProcessEngine`` in an engine process (``--process separate``, as on a GPU)
    or in the server's process (``same``); either way through the engines' own ``RequestPlumbing``."""

    name = "paced"
    decodes_audio = True
    refines_text = False
    max_num_seqs = None

    def __init__(self, observer, *, frames: int, step_ms: float, samples_per_frame: int, num_vq: int):
        import types  # noqa: PLC0415

        self.observer, self.step_s = observer, step_ms / 1000
        self.samples_per_frame, self.num_vq = samples_per_frame, num_vq
        self.max_model_len, self.max_waiting = 1024, 4096
        self.window_ends = list(np.cumsum(chunk_schedule(frames)))
        self.model = types.SimpleNamespace(sizes=types.SimpleNamespace(gpt=types.SimpleNamespace(num_vq=num_vq)))
        self.requests = RequestPlumbing(max_waiting=self.max_waiting, num_vq=num_vq,
                                        request_id=lambda request: request.request_id)
        self._running: dict[str, list[int]] = {}  # request id -> [frames made, windows sent]

    # the event-loop side (in the server's process)
    async def start(self) -> None:
        self.requests.bind_loop()
        self.start_worker()

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_worker)
        self.requests.close_streams()

    def submit(self, request):
        return self.requests.submit(request, self.enqueue, self.abort)

    # what the engine process drives too
    def enqueue(self, request) -> None:
        self.requests.add(request)

    def abort(self, request_id: str) -> None:
        self.requests.abort(request_id)

    @property
    def num_waiting(self) -> int:
        return self.requests.num_waiting

    @property
    def num_running(self) -> int:
        return len(self._running)

    def describe(self) -> dict:
        return {"kind": self.name, "step_ms": 1000 * self.step_s}

    def _empty(self):
        return np.zeros((0, self.num_vq), np.int64)

    def start_worker(self) -> None:
        self.requests.start_worker(self._work, "paced-engine")

    def stop_worker(self) -> None:
        self.requests.stop_worker()

    def _work(self) -> None:
        due = time.monotonic()
        while True:
            with self.requests.cond:
                if not self.requests.wait_for_work(lambda: bool(self._running)):
                    return
                aborted = self.requests.take_aborted()
                new = list(self.requests.waiting)
                self.requests.waiting.clear()
            for request in new:
                self.observer.on_scheduled(request, 0.0)
                self._running[request.request_id] = [0, 0]
            for request_id in aborted:
                self._running.pop(request_id, None)
            batch = []
            for request_id, state in list(self._running.items()):
                state[0] += 1
                if state[0] < self.window_ends[state[1]]:
                    continue
                frames = state[0] - (self.window_ends[state[1] - 1] if state[1] else 0)
                state[1] += 1
                last = state[1] == len(self.window_ends)
                batch.append((request_id, FrameChunk(
                    np.zeros((frames, self.num_vq), np.int64),
                    audio=np.zeros(frames * self.samples_per_frame, np.float32),
                    finished=last, finish_reason="length" if last else None)))
                if last:
                    del self._running[request_id]
            self.observer.on_step(len(self._running) + len(batch))
            if batch:
                self.requests.emit(batch)
            now = time.monotonic()
            due = max(due + self.step_s, now - self.step_s)  # after a stall: no burst of catch-up steps
            time.sleep(max(0.0, due - now))


def _paced_engine_process(spec, requests, events) -> None:
    """The engine process's entry point, building the paced engine instead of a model's."""
    import chattts_runtime.engines.process as engine_process  # noqa: PLC0415

    engine_process._build_engine = lambda spec, observer: PacedEngine(observer, **spec.kwargs)
    engine_process.engine_process_main(spec, requests, events)


def _serve(checkpoint: str, port: int, frames: int, process: str, step_ms: float) -> None:
    """The server process: the runtime's server, its engine the paced one."""
    import chattts_runtime.engines.process as engine_process  # noqa: PLC0415
    import chattts_runtime.server as server  # noqa: PLC0415
    from chattts_runtime.config import RuntimeConfig  # noqa: PLC0415

    def create_engine(config, model, observer, on_failure=None):
        kwargs = {"frames": frames, "step_ms": step_ms, "samples_per_frame": model.sizes.samples_per_frame,
                  "num_vq": model.sizes.gpt.num_vq}
        if process == "same":
            return PacedEngine(observer, **kwargs)
        engine_process.engine_process_main = _paced_engine_process  # what ProcessEngine spawns
        spec = engine_process.ChildEngine("paced", checkpoint, "cpu", "float32", kwargs)
        return engine_process.ProcessEngine(spec, max_waiting=4096, max_model_len=1024, observer=observer,
                                            on_failure=on_failure)

    server.create_engine = create_engine
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


def measure(requests: int, concurrency: int, frames: int = FRAMES, process: str = "separate",
            step_ms: float = STEP_MS) -> dict:
    from chattts_runtime.testing import make_tiny_checkpoint  # noqa: PLC0415

    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_tiny_checkpoint(Path(tmp) / "ckpt")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        # Not a daemon: it starts the engine process itself (terminated in the finally below).
        server = ctx.Process(target=_serve, args=(str(checkpoint), port, frames, process, step_ms))
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
            server.terminate()  # SIGTERM: the server drains, stops its engine process and exits
            server.join(60)
            if server.is_alive():
                server.kill()
    audio_s = requests * frames * FRAME_SECONDS
    return {"requests": requests, "concurrency": concurrency, "frames": frames, "process": process,
            "step_ms": step_ms,
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
    parser.add_argument("--process", choices=("separate", "same"), default="separate",
                        help="the engine in a process of its own behind ProcessEngine (as on a GPU) or in the server's")
    parser.add_argument("--step-ms", type=float, default=STEP_MS,
                        help="the stand-in engine's step: every running request gains a frame per step")
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    if min(args.requests, args.concurrency, args.frames) < 1:
        parser.error("--requests, --concurrency and --frames must be at least 1")
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
              **measure(args.requests, args.concurrency, args.frames, args.process, args.step_ms)}
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
