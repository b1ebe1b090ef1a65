"""Closed-loop streaming load generator for the speech API, spread over client processes.

One Python process reading ~2,000 streamed chunks per second saturates its core and then
measures itself rather than the server. ``run_level`` therefore splits the closed-loop
clients over ``procs`` processes (spawned, so no state is inherited from the parent), lets
each one import its HTTP library and open its connections, and releases them all at once:
the level's wall time runs from that common release to the last request's end, across
processes (``time.monotonic`` is the system-wide CLOCK_MONOTONIC on Linux).

Each process reports one record per request (time to first audio, total time, audio
seconds, real-time factor) and its own CPU use over the measured window, so a report can
show that the load generator was not the bottleneck. A child that fails (an HTTP error, a
broken stream, an exception) fails the whole level with its message.

The HTTP client is aiohttp when installed (several times cheaper per chunk than httpx),
else httpx; the event loop is uvloop when installed. Both are recorded.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import resource
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_any
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

SAMPLE_RATE = 24_000
SPEECH_PATH = "/v1/audio/speech"
CLIENT_LIBS = ("aiohttp", "httpx")
MAX_DEFAULT_PROCS = 8
CLIENTS_PER_PROC = 32
# Idle connections are dropped before the runtime's (uvicorn's) 5 s keep-alive timeout can
# close one under a request that is just being sent on it.
KEEPALIVE_EXPIRY_S = 2.0
REQUEST_TIMEOUT_S = 600.0
WARM_TIMEOUT_S = 120.0


# ---------------------------------------------------------------- pure parts

def default_client_procs(concurrency: int) -> int:
    """``min(8, ceil(concurrency / 32))``, at least 1: one process per 32 streams."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    return max(1, min(MAX_DEFAULT_PROCS, math.ceil(concurrency / CLIENTS_PER_PROC)))


def split_clients(concurrency: int, procs: int) -> list[list[int]]:
    """Client ids 0..concurrency-1 dealt over ``min(procs, concurrency)`` processes, sizes differing by at most 1."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if procs < 1:
        raise ValueError(f"client processes must be >= 1, got {procs}")
    procs = min(procs, concurrency)
    return [list(range(p, concurrency, procs)) for p in range(procs)]


def request_text(texts: Sequence[str | dict], client: int, round_: int, rounds: int) -> str | dict:
    """The text client ``client`` sends in round ``round_``: the same whichever process runs that client."""
    return texts[(client * rounds + round_) % len(texts)]


def speech_body(text: str | dict) -> bytes:
    """A streaming PCM request for ``text``, or for a dict of body fields (``input`` and any others)."""
    fields = text if isinstance(text, dict) else {"input": text}
    return json.dumps({"model": "chattts", "voice": "alloy", "response_format": "pcm", "stream": True,
                       **fields}).encode()


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class ProcResult:
    """What one client process sends back: its records and its measured window."""

    records: list[dict]
    started: float  # time.monotonic() when the release was seen
    finished: float  # time.monotonic() after its last request
    cpu_s: float  # user + system CPU seconds of the process over [started, finished]
    client_lib: str
    loop: str


def steady_window(records: Sequence[dict], released: float, stagger_s: float) -> tuple[float, float]:
    """``[start, end]`` during which every client was in its closed loop.

    It starts once the last client has started (``stagger_s`` after the release) and ends
    when the first client has finished its last request: outside it, fewer than
    ``concurrency`` streams were offered, so neither throughput nor latency there is "at
    that load".
    """
    last_end: dict[int, float] = {}
    for r in records:
        last_end[r["client"]] = max(last_end.get(r["client"], r["ended"]), r["ended"])
    return released + stagger_s, min(last_end.values())


def audio_in_window(record: dict, start: float, end: float) -> float:
    """The request's audio seconds delivered inside ``[start, end]`` (delivery taken as even from first audio to end)."""
    first = record["began"] + record["ttfa"]
    span = record["ended"] - first
    if span <= 0:
        return record["audio_s"] if start <= record["ended"] <= end else 0.0
    overlap = min(end, record["ended"]) - max(start, first)
    return record["audio_s"] * max(0.0, overlap) / span


def summarize(results: Sequence[ProcResult], released: float, stagger_s: float = 0.0) -> dict:
    """Merge the processes' records into one level: throughput, percentiles, client CPU.

    Throughput and percentiles are taken over the steady window (``steady_window``):
    throughput is the audio delivered inside it per second of it, percentiles cover the
    requests that began and ended inside it (all requests when fewer than one per client
    did, e.g. slow requests and few rounds). ``throughput_wall_audio_s_per_s`` is all audio over the whole level's wall,
    ramps included. ``loadgen_cpu_max_proc`` is the busiest process's CPU seconds per wall
    second of its own window (1.0 = one core saturated: the load generator may then be the
    bottleneck); ``loadgen_cpu_cores`` is all processes' CPU seconds per level wall second.
    """
    if not results:
        raise ValueError("no client process results to summarize")
    records = sorted((r for res in results for r in res.records), key=lambda r: (r["client"], r["round"]))
    wall = max(res.finished for res in results) - released
    if wall <= 0:
        raise ValueError(f"level wall time must be positive, got {wall}")
    audio = sum(r["audio_s"] for r in records)
    start, end = steady_window(records, released, stagger_s)
    steady = [r for r in records if r["began"] >= start and r["ended"] <= end]
    if len(steady) < len({r["client"] for r in records}):  # under one per client: too few to stand for the level
        steady = records
    if end - start > 0:
        throughput = sum(audio_in_window(r, start, end) for r in records) / (end - start)
    else:  # no moment with every client in its loop (one round, wide stagger): the whole wall
        throughput = audio / wall
    ttfa = [r["ttfa"] for r in steady]
    rtf = [r["rtf"] for r in steady]
    classes = {}
    for name, keep in (("one_piece", lambda r: r.get("pieces") == 1), ("multi_piece", lambda r: r.get("pieces", 0) > 1)):
        chosen = [r["ttfa"] for r in steady if keep(r)]
        if chosen:
            classes[name] = {"requests": len(chosen), "ttfa_p50_s": percentile(chosen, 0.5),
                             "ttfa_p99_s": percentile(chosen, 0.99)}
    per_proc = [res.cpu_s / max(res.finished - res.started, 1e-9) for res in results]
    return {
        "requests": len(records), "steady_requests": len(steady), "wall_s": wall, "audio_s": audio,
        "steady_window_s": max(0.0, end - start), "stagger_s": stagger_s,
        "steady_began_at": start, "steady_ended_at": end,  # time.monotonic(), system-wide: the server's clock too
        "throughput_audio_s_per_s": throughput, "throughput_wall_audio_s_per_s": audio / wall,
        "ttfa_p50_s": percentile(ttfa, 0.5), "ttfa_p99_s": percentile(ttfa, 0.99),
        "rtf_p50": percentile(rtf, 0.5), "rtf_p99": percentile(rtf, 0.99),
        "ttfa_by_class": classes, "first_audio_parts": first_audio_parts(steady),
        "client_procs": len(results),
        "client_lib": results[0].client_lib, "client_loop": results[0].loop,
        "release_skew_s": max(res.started for res in results) - released,
        "loadgen_cpu_max_proc": max(per_proc),
        "loadgen_cpu_cores": sum(res.cpu_s for res in results) / wall,
    }


def first_audio_parts(records: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Where the time to first audio went, per part, over ``records`` (p50, p99, mean seconds): the
    server's stages before the response starts (``Server-Timing``: refine, voice) and, after the
    response's headers, ``after_headers`` (the first piece's queue wait, prefill and first window)."""
    parts: dict[str, list[float]] = {}
    for r in records:
        for name, seconds in r.get("stages", {}).items():
            parts.setdefault(name, []).append(seconds)
        if r.get("headers_s") is not None and r.get("ttfa") is not None:
            parts.setdefault("after_headers", []).append(r["ttfa"] - r["headers_s"])
    return {name: {"n": len(v), "p50_s": percentile(v, 0.5), "p99_s": percentile(v, 0.99),
                   "mean_s": sum(v) / len(v)} for name, v in parts.items()}


# ---------------------------------------------------------------- HTTP clients (one per library, same interface)

def pick_client_lib(requested: str = "auto") -> str:
    if requested not in ("auto", *CLIENT_LIBS):
        raise ValueError(f"client library must be one of auto, {', '.join(CLIENT_LIBS)}; got {requested!r}")
    candidates = CLIENT_LIBS if requested == "auto" else (requested,)
    for name in candidates:
        try:
            __import__(name)
        except ImportError:
            continue
        return name
    raise RuntimeError(f"no HTTP client library installed (wanted {' or '.join(candidates)})")


class AiohttpClient:
    def __init__(self, base_url: str, connections: int):
        import aiohttp

        self._base = base_url.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=KEEPALIVE_EXPIRY_S),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S), auto_decompress=False)

    async def get_status(self, path: str) -> int:
        async with self._session.get(self._base + path) as r:
            await r.read()
            return r.status

    @contextlib.asynccontextmanager
    async def post_stream(self, path: str, body: bytes) -> AsyncIterator[tuple[int, Any, AsyncIterator[bytes]]]:
        async with self._session.post(self._base + path, data=body,
                                      headers={"Content-Type": "application/json"}) as r:
            yield r.status, r.headers, r.content.iter_any()

    async def close(self) -> None:
        await self._session.close()


class HttpxClient:
    def __init__(self, base_url: str, connections: int):
        import httpx

        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                              keepalive_expiry=KEEPALIVE_EXPIRY_S)
        self._client = httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(REQUEST_TIMEOUT_S), limits=limits)

    async def get_status(self, path: str) -> int:
        return (await self._client.get(path)).status_code

    @contextlib.asynccontextmanager
    async def post_stream(self, path: str, body: bytes) -> AsyncIterator[tuple[int, Any, AsyncIterator[bytes]]]:
        async with self._client.stream("POST", path, content=body,
                                       headers={"Content-Type": "application/json"}) as r:
            yield r.status_code, r.headers, r.aiter_raw()

    async def close(self) -> None:
        await self._client.aclose()


def make_client(lib: str, base_url: str, connections: int):
    return {"aiohttp": AiohttpClient, "httpx": HttpxClient}[lib](base_url, connections)


# ---------------------------------------------------------------- one request, one process

async def one_request(client, body: bytes) -> dict:
    """POST one streaming PCM request; time to the first audio bytes and to the end of the stream."""
    start = time.perf_counter()
    began = time.monotonic()  # system-wide clock: comparable across the client processes
    first = None
    received = 0
    async with client.post_stream(SPEECH_PATH, body) as (status, headers, chunks):
        headers_s = time.perf_counter() - start
        if status != 200:
            error = b""
            async for chunk in chunks:
                error += chunk
                if len(error) > 300:
                    break
            raise RuntimeError(f"HTTP {status} from {SPEECH_PATH}: {error[:300]!r}")
        async for chunk in chunks:
            if chunk and first is None:
                first = time.perf_counter() - start
            received += len(chunk)
    total = time.perf_counter() - start
    if not received:
        raise RuntimeError(f"{SPEECH_PATH} answered 200 with an empty stream")
    if received % 2:
        raise RuntimeError(f"PCM stream of odd length {received} (16-bit samples expected)")
    audio_s = received / 2 / SAMPLE_RATE
    return {"ttfa": first, "total": total, "audio_s": audio_s, "rtf": total / audio_s,
            "began": began, "ended": began + total, "headers_s": headers_s,
            "pieces": int(headers.get("X-ChatTTS-Pieces") or 0),
            "stages": server_timing(headers.get("Server-Timing") or "")}


def server_timing(value: str) -> dict[str, float]:
    """A ``Server-Timing`` header (``name;dur=ms, ...``) -> {name: seconds}; entries without a duration are skipped."""
    out = {}
    for entry in value.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            key, _, number = param.partition("=")
            if name and key.strip() == "dur":
                try:
                    out[name] = float(number) / 1e3
                except ValueError:
                    pass
    return out


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run_clients(conn, url: str, clients: list[int], rounds: int, texts: list[str], lib: str, loop_name: str,
                       release, stagger: tuple[float, int] = (0.0, 1)) -> None:
    client = make_client(lib, url, len(clients) + 4)
    try:
        # Warm: one connection per client opened now, so the level's first requests don't pay the TCP connect.
        statuses = await asyncio.gather(*(client.get_status("/health") for _ in clients))
        if any(s != 200 for s in statuses):
            raise RuntimeError(f"/health answered {sorted(set(statuses))} during warm-up")
        bodies = {(c, r): speech_body(request_text(texts, c, r, rounds)) for c in clients for r in range(rounds)}
        conn.send(("ready", None))
        # The release is a multiprocessing.Event: waiting on it blocks, so wait in a thread and keep the loop free.
        await asyncio.to_thread(release.wait)
        started, cpu0 = time.monotonic(), _cpu_seconds()
        records: list[dict] = []

        async def closed_loop(c: int) -> None:
            spread, concurrency = stagger
            if spread > 0:  # client c starts c/C of the spread late: arrivals in steady phases, not one burst
                await asyncio.sleep(spread * c / concurrency)
            for r in range(rounds):
                records.append({"client": c, "round": r, **(await one_request(client, bodies[(c, r)]))})

        await asyncio.gather(*(closed_loop(c) for c in clients))
        finished, cpu1 = time.monotonic(), _cpu_seconds()
    finally:
        await client.close()
    conn.send(("done", ProcResult(records, started, finished, cpu1 - cpu0, lib, loop_name)))


def _child_main(conn, url: str, clients: list[int], rounds: int, texts: list[str], lib: str, release,
                stagger: tuple[float, int] = (0.0, 1)) -> None:
    """Entry point of one client process: run its clients, send back ``ProcResult`` or the error's traceback."""
    try:
        try:
            import uvloop
        except ImportError:
            uvloop = None
        if uvloop is not None and hasattr(uvloop, "run"):
            runner, loop_name = uvloop.run, "uvloop"
        else:
            runner, loop_name = asyncio.run, "asyncio"
        runner(_run_clients(conn, url, clients, rounds, texts, lib, loop_name, release, stagger))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent with its message
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


# ---------------------------------------------------------------- the parent side

class LoadGenError(RuntimeError):
    """A client process failed; the message holds its traceback."""


@contextlib.contextmanager
def _children() -> Iterator[list]:
    procs: list = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()


def _collect(pending: dict, kind: str, deadline: float | None) -> dict[int, Any]:
    """Wait until every pending child sent a message of ``kind``; a child error or death raises ``LoadGenError``."""
    got: dict[int, Any] = {}
    while len(got) < len(pending):
        waiting = {i: (conn, proc) for i, (conn, proc) in pending.items() if i not in got}
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait_for_any([o for conn, proc in waiting.values() for o in (conn, proc.sentinel)], timeout)
        if not ready:
            raise LoadGenError(f"client processes {sorted(waiting)} not {kind} within {WARM_TIMEOUT_S:.0f} s")
        for i, (conn, proc) in waiting.items():
            if conn in ready or (proc.sentinel in ready and conn.poll()):
                try:
                    tag, payload = conn.recv()
                except EOFError:
                    raise LoadGenError(f"client process {i} exited with {proc.exitcode} before it was {kind}") from None
                if tag == "error":
                    raise LoadGenError(f"client process {i} failed:\n{payload}")
                if tag != kind:
                    raise LoadGenError(f"client process {i} sent {tag!r}, expected {kind!r}")
                got[i] = payload
            elif proc.sentinel in ready:
                proc.join()
                raise LoadGenError(f"client process {i} exited with {proc.exitcode} before it was {kind}")
    return got


def run_level(url: str, concurrency: int, rounds: int, texts: Sequence[str], procs: int | None = None,
              client_lib: str = "auto", on_release: Callable[[], None] | None = None,
              on_done: Callable[[], None] | None = None, stagger_s: float = 0.0) -> dict:
    """``concurrency`` closed-loop streaming clients, ``rounds`` requests each, over ``procs`` processes.

    Blocking (it waits on child processes): call it from a thread in async code.
    ``on_release``/``on_done`` run right before the clients are released and right after the
    last one reported (e.g. to sample the server's CPU time over the same window).
    ``stagger_s`` spreads the clients' first requests evenly over that many seconds (see
    ``summarize`` for what is then measured). Returns ``summarize``'s level dict plus ``concurrency``.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if not texts:
        raise ValueError("texts must not be empty")
    lib = pick_client_lib(client_lib)
    groups = split_clients(concurrency, default_client_procs(concurrency) if procs is None else procs)
    ctx = multiprocessing.get_context("spawn")
    release = ctx.Event()
    with _children() as children:
        pending = {}
        for i, clients in enumerate(groups):
            parent_end, child_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child_main, name=f"loadgen-{i}", daemon=True,
                               args=(child_end, url, clients, rounds, list(texts), lib, release,
                                     (stagger_s, concurrency)))
            proc.start()
            child_end.close()  # only the child writes; EOF then means the child is gone
            children.append(proc)
            pending[i] = (parent_end, proc)
        _collect(pending, "ready", time.monotonic() + WARM_TIMEOUT_S)
        if on_release is not None:
            on_release()
        released = time.monotonic()
        release.set()
        results = _collect(pending, "done", None)
        if on_done is not None:
            on_done()
    return {"concurrency": concurrency, **summarize([results[i] for i in sorted(results)], released, stagger_s)}


# ---------------------------------------------------------------- capacity: the load generator against a trivial server
#
#   python -m bench.runtime.loadgen --concurrency 256 --client-procs 1,8 --client-lib aiohttp,httpx
#
# A server that only writes prepared PCM chunks (HTTP/1.1 chunked, as uvicorn streams the speech
# API's body), in several processes sharing one port (SO_REUSEPORT), answers as fast as the load
# generator reads. The figures are then the load generator's own ceiling: requests, chunks and
# audio seconds per second it can take in, and its CPU, with each library and process count.

FRAME_SAMPLES = 512
FIRST_CHUNK_FRAMES = 8  # the runtime decodes a shorter first window for a quick first audio


def chunk_plan(frames: int, chunk_frames: int, first: int = FIRST_CHUNK_FRAMES) -> list[int]:
    """Frames per streamed chunk of one request: a short first window, then ``chunk_frames`` each."""
    if frames < 1 or chunk_frames < 1:
        raise ValueError(f"frames and chunk_frames must be >= 1, got {frames}, {chunk_frames}")
    plan = [min(first, frames, chunk_frames)]
    while sum(plan) < frames:
        plan.append(min(chunk_frames, frames - sum(plan)))
    return plan


async def _serve_pcm(reader, writer, chunks: list[bytes], interval) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *headers = head.decode("latin-1").split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            length = 0
            for header in headers:
                name, _, value = header.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            if path == "/health":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
            elif method == "POST" and path == SPEECH_PATH:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: audio/pcm\r\nTransfer-Encoding: chunked\r\n\r\n")
                pause = interval.value  # shared with the parent, which changes it between levels
                for chunk in chunks:
                    if pause:
                        await asyncio.sleep(pause)
                    writer.write(chunk)
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _pcm_server_main(port: int, chunk_frames: list[int], interval: "multiprocessing.Value", ready) -> None:
    import socket

    chunks = [b"%x\r\n" % (n * FRAME_SAMPLES * 2) + b"\x00\x01" * (n * FRAME_SAMPLES) + b"\r\n" for n in chunk_frames]

    async def serve() -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        server = await asyncio.start_server(lambda r, w: _serve_pcm(r, w, chunks, interval), sock=sock,
                                            backlog=4096)
        ready.set()
        async with server:
            await server.serve_forever()

    try:
        import uvloop
    except ImportError:
        uvloop = None
    (uvloop.run if uvloop is not None and hasattr(uvloop, "run") else asyncio.run)(serve())


def capacity_main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    import platform
    import socket

    p = argparse.ArgumentParser(prog="python -m bench.runtime.loadgen", description=capacity_main.__doc__)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--rounds", type=int, default=4, help="requests per client")
    p.add_argument("--frames", type=int, default=128, help="frames per request (512 samples each)")
    p.add_argument("--chunk-frames", type=int, default=24)
    p.add_argument("--interval-ms", default="0",
                   help="comma-separated server pauses before each chunk to compare (0: as fast as read; "
                        "~120 ms paces 6-chunk requests like a server at RTF 0.25)")
    p.add_argument("--server-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    p.add_argument("--client-procs", default=f"1,{default_client_procs(256)}", help="comma-separated counts to compare")
    p.add_argument("--client-lib", default=",".join(CLIENT_LIBS), help="comma-separated libraries to compare")
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    plan = chunk_plan(args.frames, args.chunk_frames)
    intervals = [float(v) / 1e3 for v in args.interval_ms.split(",")]
    libs = []
    for lib in args.client_lib.split(","):
        try:
            libs.append(pick_client_lib(lib))
        except RuntimeError as err:
            print(f"skipping {lib}: {err}", flush=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    servers = []
    interval = ctx.Value("d", intervals[0], lock=False)  # read by the servers at each request
    try:
        for _ in range(args.server_procs):
            ready = ctx.Event()
            proc = ctx.Process(target=_pcm_server_main, args=(port, plan, interval, ready), daemon=True)
            proc.start()
            servers.append(proc)
            if not ready.wait(30):
                raise RuntimeError("capacity server did not start")
        url = f"http://127.0.0.1:{port}"
        texts = [f"capacity {i}" for i in range(64)]
        rows = []
        for pause, lib, procs in ((i, lib, int(n)) for i in intervals for lib in libs
                                  for n in args.client_procs.split(",")):
            interval.value = pause
            row = run_level(url, args.concurrency, args.rounds, texts, procs=procs, client_lib=lib)
            row.update(server_interval_ms=pause * 1e3, requests_per_s=row["requests"] / row["wall_s"],
                       chunks_per_s=row["requests"] * len(plan) / row["wall_s"])
            rows.append(row)
            print(f"pause {pause * 1e3:5.0f} ms {lib:8s} {row['client_procs']} procs on {row['client_loop']}: "
                  f"{row['requests_per_s']:8.1f} req/s {row['chunks_per_s']:9.1f} chunks/s "
                  f"{row['throughput_audio_s_per_s']:9.1f} audio s/s, "
                  f"ttfa p50 {row['ttfa_p50_s'] * 1e3:.1f} ms p99 {row['ttfa_p99_s'] * 1e3:.1f} ms, "
                  f"client CPU busiest {row['loadgen_cpu_max_proc']:.2f} all {row['loadgen_cpu_cores']:.2f} cores",
                  flush=True)
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            proc.join(timeout=10)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"params": vars(args), "chunk_plan": plan, "cpus": os.cpu_count(),
                       "python": platform.python_version(), "rows": rows}, f, indent=1)
    return 0


capacity_main.__doc__ = "The load generator's own ceiling against a server that only writes prepared PCM chunks."

if __name__ == "__main__":
    raise SystemExit(capacity_main())
