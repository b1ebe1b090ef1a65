"""Time to first byte of a streamed speech response, per response format (issue 17).

Compressed formats are encoded incrementally, so their first bytes should leave with the
first audio window, as pcm's do. Sequential requests (one at a time) against a real
server on loopback; the median and p90 of time to first body byte and to the end.

    python -m bench.runtime.ttfb_formats [--size small] [--device cpu] [--requests 12] [--frames 240]
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import time

from bench.runtime.speech_api import (RESULTS, bench_checkpoint, environment, percentile, start_server,
                                    wait_ready)

FORMATS = ("pcm", "wav", "mp3", "opus", "aac", "flac")


async def measure(url: str, fmt: str, requests: int) -> dict:
    import httpx

    first, total, sizes = [], [], []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for i in range(requests + 1):  # the first request of each format warms its encoder
            body = {"model": "chattts", "voice": "alloy", "input": f"first byte {i}", "response_format": fmt}
            start = time.perf_counter()
            t_first, size = None, 0
            async with client.stream("POST", "/v1/audio/speech", json=body) as r:
                r.raise_for_status()
                async for chunk in r.aiter_raw():
                    if chunk and t_first is None:
                        t_first = time.perf_counter() - start
                    size += len(chunk)
            if i:
                first.append(t_first)
                total.append(time.perf_counter() - start)
                sizes.append(size)
    ms = lambda values, q: round(1000 * percentile(values, q), 1)  # noqa: E731
    return {"format": fmt, "requests": requests, "ttfb_ms_p50": ms(first, 0.5), "ttfb_ms_p90": ms(first, 0.9),
            "total_ms_p50": ms(total, 0.5), "bytes_p50": int(percentile(sizes, 0.5))}


async def main_async(args) -> dict:
    checkpoint, _ = bench_checkpoint(args.size)
    log = RESULTS / "tmp" / "ttfb-server.log"
    proc, url = start_server(checkpoint, args.device, args.frames, 4, args.chunk, log)
    try:
        await wait_ready(url, proc, log=log)
        rows = [await measure(url, fmt, args.requests) for fmt in FORMATS]
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return {"date": datetime.date.today().isoformat(), "command": " ".join(["python -m bench.runtime.ttfb_formats",
                                                                          *sys.argv[1:]]),
            "params": vars(args), "environment": environment(args.device, "httpx"), "results": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", choices=["tiny", "small", "full"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--frames", type=int, default=240)
    parser.add_argument("--chunk", type=int, default=24)
    args = parser.parse_args(argv)
    report = asyncio.run(main_async(args))
    stem = f"runtime-ttfb-formats-{args.device}-{report['date']}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2))
    lines = [f"# Time to first byte per streamed format ({report['environment'].get('gpu', 'CPU')}, {report['date']})",
             "", f"Command: `{report['command']}`", "",
             f"`{args.size}` random checkpoint, reference engine, {args.frames} frames per request, "
             f"stream_chunk_frames {args.chunk}, one request at a time, {args.requests} per format.", "",
             "| format | TTFB p50 (ms) | TTFB p90 (ms) | whole stream p50 (ms) | bytes |", "|---|---|---|---|---|"]
    lines += [f"| {r['format']} | {r['ttfb_ms_p50']} | {r['ttfb_ms_p90']} | {r['total_ms_p50']} | {r['bytes_p50']} |"
              for r in report["results"]]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
