"""``chattts-runtime``: serve, quantize, synthesize, make-tiny-checkpoint.

Exit codes: 0 success, 1 runtime failure, 2 bad arguments or configuration (the message
names the field).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from chattts_runtime.config import ConfigError, load_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chattts-runtime", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve the speech API")
    s.add_argument("--config", help="runtime.yaml (the operator mounts /etc/chattts/runtime.yaml)")
    s.add_argument("--host")
    s.add_argument("--port", type=int)

    q = sub.add_parser("quantize", help="AWQ-quantize the GPT's decoder linear layers (AutoAWQ)")
    q.add_argument("--model", required=True, help="16-bit checkpoint directory")
    q.add_argument("--out", required=True, help="output checkpoint directory")
    q.add_argument("--calib", required=True, help="texts.jsonl: one {\"text\": ...} per line")
    q.add_argument("--w-bit", type=int, default=4, choices=(4,))
    q.add_argument("--group-size", type=int, default=128)
    q.add_argument("--n-samples", type=int, default=512)
    q.add_argument("--max-calib-frames", type=int, default=64,
                   help="frames generated per calibration text (the GPT sees audio codes, not only text)")
    q.add_argument("--no-zero-point", action="store_true", help="symmetric quantization")

    y = sub.add_parser("synthesize", help="offline batch: texts.jsonl -> audio files + manifest (resumable)")
    y.add_argument("--config", help="runtime.yaml (model path, engine, generation settings)")
    y.add_argument("--model", help="checkpoint directory (overrides the config)")
    y.add_argument("--input", required=True, help="texts.jsonl: {\"id\": ..., \"text\": ..., \"voice\"?: ...}")
    y.add_argument("--out", required=True, help="output directory (audio files + manifest.jsonl)")
    y.add_argument("--format", default="wav", help="audio format (wav, pcm, flac, mp3, opus, aac)")
    y.add_argument("--voice", default="alloy", help="default voice for items without one")
    y.add_argument("--concurrency", type=int, default=8, help="items generated together")

    t = sub.add_parser("make-tiny-checkpoint", help="write a random tiny checkpoint (tests, demos)")
    t.add_argument("--out", required=True)
    t.add_argument("--hidden-size", type=int, default=64)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--heads", type=int, default=2)
    t.add_argument("--full-size", action="store_true", help="the official architecture, random weights")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--endless", action="store_true", help="never emit the end code (fixed-length output)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            config = load_config(args.config)
            if args.host or args.port:
                server = config.server.model_copy(update={k: v for k, v in
                                                          (("host", args.host), ("port", args.port)) if v})
                config = config.model_copy(update={"server": server})
            from chattts_runtime.model.config import CheckpointError, load_model_sizes  # noqa: PLC0415

            try:  # a wrong model path fails here, before the server starts
                load_model_sizes(config.model.path)
            except CheckpointError as err:
                print(f"chattts-runtime: model.path: {err}", file=sys.stderr)
                return 2
            from chattts_runtime.server import serve  # noqa: PLC0415

            return serve(config)
        if args.command == "make-tiny-checkpoint":
            from chattts_runtime import testing  # noqa: PLC0415

            sizes = testing.full_sizes() if args.full_size else testing.tiny_sizes(
                hidden_size=args.hidden_size, num_layers=args.layers, num_heads=args.heads)
            print(testing.make_checkpoint(args.out, sizes, seed=args.seed, endless=args.endless))
            return 0
        if args.command == "quantize":
            from chattts_runtime.quantize import QuantizeError, quantize_checkpoint  # noqa: PLC0415

            try:
                quantize_checkpoint(Path(args.model), Path(args.out), Path(args.calib), w_bit=args.w_bit,
                                    group_size=args.group_size, n_samples=args.n_samples,
                                    zero_point=not args.no_zero_point, max_calib_frames=args.max_calib_frames)
            except QuantizeError as err:
                print(f"chattts-runtime quantize: {err}", file=sys.stderr)
                return 2
            return 0
        if args.command == "synthesize":
            from chattts_runtime.synthesize import SynthesizeError, run_synthesize  # noqa: PLC0415

            config = load_config(args.config)
            if args.model:
                config = config.model_copy(update={"model": config.model.model_copy(update={"path": args.model})})
            try:
                summary = run_synthesize(config, Path(args.input), Path(args.out), fmt=args.format,
                                         default_voice=args.voice, concurrency=args.concurrency)
            except SynthesizeError as err:
                print(f"chattts-runtime synthesize: {err}", file=sys.stderr)
                return 2
            print(summary)
            return 0 if summary.failed == 0 else 1
    except ConfigError as err:
        print(f"chattts-runtime: {err}", file=sys.stderr)
        return 2
    return 2
