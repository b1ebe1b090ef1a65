"""Time the speech API's audio decode (DVAE + Vocos) per batched call on the GPU.

``python -m bench.runtime.decode_check --size full``: median milliseconds of one
``model.codes_to_audio`` call for batches of 1/16/64/256 windows of 8/32/64 frames (the
window lengths the streaming decoder asks for with 24-frame chunks and 40 frames of
context), and the frames per second of new audio that implies. Says whether the decode
thread, not the GPT, bounds a server at high concurrency.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.runtime.speech_api import RESULTS, make_checkpoint


def main() -> int:
    import torch

    from chattts_runtime.model import load_chattts

    p = argparse.ArgumentParser()
    p.add_argument("--size", default="full")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    model = load_chattts(make_checkpoint(args.size, RESULTS / "tmp" / f"bench-{args.size}"), device="cuda",
                         dtype=torch.bfloat16)
    vocab = model.sizes.gpt.num_audio_tokens - 1
    rows = []
    with torch.inference_mode():
        for batch in (1, 16, 64, 256):
            for frames in (8, 32, 64):
                codes = torch.randint(0, vocab, (batch, frames, model.sizes.gpt.num_vq))
                for _ in range(3):
                    model.codes_to_audio(codes).cpu()
                times = []
                for _ in range(10):
                    t0 = time.perf_counter()
                    model.codes_to_audio(codes).cpu()  # what the decode thread does, sync included
                    times.append((time.perf_counter() - t0) * 1e3)
                ms = statistics.median(times)
                rows.append({"batch": batch, "window_frames": frames, "ms_per_call": ms,
                             "windows_per_s": batch / ms * 1e3})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
