"""What a streamed piece's audio costs per window schedule, and how far each schedule's audio is from the
whole piece decoded at once.

    python -m bench.runtime.window_schedule --device cuda --size full --out bench/results   # GPU figures
    python -m bench.runtime.window_schedule --size tiny --streams 2 --repeats 1             # CPU smoke

A streamed piece is decoded window by window (``audio_io.StreamWindows``): each window re-decodes at
least 40 frames of left context, so with 24-frame chunks a long piece decodes each frame ~2.7 times.
``generation.stream_max_chunk_frames`` lets later chunks grow (doubling up to it), and
``generation.stream_lookahead_frames`` sends each window's audio that many frames before its end (the
decoders look ahead: audio decoded without the frames after it is not the whole piece's). Per audio path
and schedule this measures, on the mixed benchmark's piece lengths (``speech_api.MIXED_SENTENCES``):

- windows per piece and frames decoded per frame of audio (exact, from the schedule);
- the decoders' time per second of audio: ``--streams`` pieces decoded together, one batched call per
  window (as the engines batch windows of one shape), eager (the graph engine replays captured graphs,
  so its launches cost less than here), the host copy included; schedules alternate, median of
  ``--repeats``;
- SNR (dB) of the streamed audio against the whole piece decoded in one call (what streaming changes:
  each window's audio near its end, decoded without the frames after it unless a lookahead waits for them).

Random weights (``speech_api.make_checkpoint``): the costs are the architecture's; the SNR is a
random decoder's, not a trained one's.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from bench.runtime.dtype_agreement import snr_db
from bench.runtime.speech_api import FRAMES_PER_WORD, MIXED_SENTENCES, RESULTS, make_checkpoint

BASE_CHUNK = 24  # the runtime's default stream_chunk_frames


def piece_lengths() -> list[int]:
    """The mixed benchmark's piece lengths: each sentence's words at ``FRAMES_PER_WORD`` frames."""
    return sorted({FRAMES_PER_WORD * len(s.split()) for s in MIXED_SENTENCES})


def stream(schedule, frames: np.ndarray, decode, spf: int) -> tuple[np.ndarray, int, int]:
    """Every stream of ``frames [B, T, ...]`` decoded window by window on ``schedule``, the B windows of a
    step in one ``decode`` call: (samples ``[B, S]``, windows per stream, frames decoded per stream)."""
    from chattts_runtime.audio_io import StreamingDecoder  # noqa: PLC0415

    decoders = [StreamingDecoder(spf, windows=schedule) for _ in frames]
    for decoder, piece in zip(decoders, frames):
        decoder.push(piece)
    out: list[list[np.ndarray]] = [[] for _ in frames]
    windows = decoded = 0
    while decoders[0].pending_frames:
        cut = [d.next_window(final=True) for d in decoders]  # every frame is here: the piece has ended
        audio = decode(np.stack([frames_ for frames_, _, _, _ in cut]))
        for i, (decoder, (_, start, end, last)) in enumerate(zip(decoders, cut)):
            out[i].append(decoder.accept(audio[i], start, end, last))
        windows += 1
        decoded += cut[0][2] - cut[0][1]
    return np.stack([np.concatenate(parts) for parts in out]), windows, decoded


def main(argv: list[str] | None = None) -> int:
    import torch  # noqa: PLC0415

    from chattts_runtime.audio_io import StreamWindows  # noqa: PLC0415
    from chattts_runtime.model import load_chattts  # noqa: PLC0415
    from chattts_runtime.model.config import SAMPLE_RATE  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--size", default="full")
    p.add_argument("--paths", default="decoder,dvae", help="audio paths, comma-separated: decoder, dvae")
    p.add_argument("--max-chunks", default="24,48,96,192",
                   help=f"stream_max_chunk_frames of each schedule ({BASE_CHUNK}: chunks never grow, the baseline)")
    p.add_argument("--lookaheads", default="0,4",
                   help="stream_lookahead_frames of each schedule (0: each window's audio sent whole, the baseline)")
    p.add_argument("--streams", type=int, default=16, help="pieces decoded together (one batched call a window)")
    p.add_argument("--lengths", default=None, help="piece lengths in frames (default: the mixed benchmark's)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="directory for the JSON and markdown results")
    p.add_argument("--tag", default=None)
    args = p.parse_args(argv)

    tops = [int(x) for x in args.max_chunks.split(",")]
    if BASE_CHUNK not in tops:
        tops.insert(0, BASE_CHUNK)
    aheads = [int(x) for x in args.lookaheads.split(",")]
    if 0 not in aheads:
        aheads.insert(0, 0)
    base = (BASE_CHUNK, 0)
    schedules = {(top, ahead): StreamWindows(BASE_CHUNK, max_chunk_frames=top, lookahead_frames=ahead)
                 for ahead in aheads for top in tops}
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else piece_lengths()
    model = load_chattts(make_checkpoint(args.size, RESULTS / "tmp" / f"bench-{args.size}"), device=args.device,
                         audio_tf32=args.device == "cuda")  # the runtime's default audio precision on CUDA
    spf = model.sizes.samples_per_frame
    frames_per_s = SAMPLE_RATE / spf
    rng = np.random.default_rng(0)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    rows = []
    for path in args.paths.split(","):
        if path == "decoder" and getattr(model, "decoder", None) is None:
            raise SystemExit("this checkpoint has no Decoder")
        convert = model.hidden_to_audio if path == "decoder" else model.codes_to_audio

        def decode(batch: np.ndarray, convert=convert) -> np.ndarray:
            with torch.inference_mode():
                return convert(torch.from_numpy(batch).to(args.device)).float().cpu().numpy()

        pieces = {}
        for length in lengths:
            if path == "decoder":
                pieces[length] = rng.standard_normal((args.streams, length, model.sizes.gpt.hidden_size),
                                                     dtype=np.float32)
            else:
                pieces[length] = rng.integers(0, model.sizes.gpt.num_audio_tokens - 1,
                                              (args.streams, length, model.sizes.gpt.num_vq))
        whole = {length: decode(pieces[length][:1])[0] for length in lengths}
        for schedule in schedules.values():  # warm-up: every shape once
            for length in lengths:
                stream(schedule, pieces[length], decode, spf)
        seconds: dict[tuple[int, int], list[float]] = {key: [] for key in schedules}
        for _ in range(args.repeats):  # schedules alternate within each repeat (a shared, noisy machine)
            for key, schedule in schedules.items():
                sync()
                t0 = time.perf_counter()
                for length in lengths:
                    stream(schedule, pieces[length], decode, spf)
                sync()
                seconds[key].append(time.perf_counter() - t0)
        audio_s = args.streams * sum(lengths) / frames_per_s
        base_ms = statistics.median(seconds[base]) / audio_s * 1e3
        for (top, ahead), schedule in schedules.items():
            windows, decoded, snrs = [], 0, []
            for length in lengths:
                streamed, count, frames_decoded = stream(schedule, pieces[length][:1], decode, spf)
                windows.append(count)
                decoded += frames_decoded
                snrs.append(snr_db(whole[length], streamed[0]))
            ms = statistics.median(seconds[(top, ahead)]) / audio_s * 1e3
            rows.append({"path": path, "max_chunk_frames": top, "lookahead_frames": ahead,
                         "chunk_sizes": list(schedule.chunk_sizes),
                         "windows_per_piece": statistics.mean(windows), "decoded_per_frame": decoded / sum(lengths),
                         "ms_per_audio_second": ms, "vs_base": ms / base_ms,
                         "snr_db_median": statistics.median(snrs), "snr_db_min": min(snrs),
                         "seconds": seconds[(top, ahead)]})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "seconds"}), flush=True)
    if args.out:
        write(args, rows, lengths, torch)
    return 0


def write(args, rows: list[dict], lengths: list[int], torch) -> None:
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
    tag = args.tag or f"{args.device}-{dt.date.today().isoformat()}"
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": device, "torch": torch.__version__, "size": args.size, "streams": args.streams,
            "lengths": lengths, "repeats": args.repeats, "date": dt.datetime.now(dt.timezone.utc).isoformat()}
    (args.out / f"window-schedule-{tag}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = [f"# Window schedules: audio decode cost and distance from the whole piece ({device})", "",
             f"`python -m bench.runtime.window_schedule --device {args.device} --size {args.size} --paths {args.paths} "
             f"--max-chunks {args.max_chunks} --lookaheads {args.lookaheads} --streams {args.streams} --lengths "
             f"{','.join(map(str, lengths))} --repeats {args.repeats}`; torch {torch.__version__}; random weights.",
             "", "| path | max chunk | lookahead | chunk sizes | windows a piece | frames decoded a frame | ms a second "
             "of audio (x baseline) | SNR to the whole piece, median / min |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['path']} | {r['max_chunk_frames']} | {r['lookahead_frames']} | {r['chunk_sizes']} | "
                     f"{r['windows_per_piece']:.1f} | "
                     f"{r['decoded_per_frame']:.2f} | {r['ms_per_audio_second']:.2f} ({r['vs_base']:.2f}x) | "
                     f"{r['snr_db_median']:.1f} / {r['snr_db_min']:.1f} dB |")
    (args.out / f"window-schedule-{tag}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
