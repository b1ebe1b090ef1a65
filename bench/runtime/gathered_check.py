"""Check of the graph engine's first-audio substeps: a gathered step over some slots is the full step on them.

    python -m bench.runtime.gathered_check --out DIR             # CUDA: full size, bf16; CPU: tiny, float32

A first-audio substep steps the refine rows and voice passes wherever their slots sit
(``decode_step(gathered=True)``): the ragged attention kernel and the fused rotary/KV kernel read and write
each row's own slot of the cache. The CPU tests check that logic eagerly and the kernels in Triton's
interpreter; this runs the real kernels and their captured graphs. Two slot states start equal (random
KV, positions, inputs; greedy rows); one takes a full step over every slot, the other a gathered step
over scattered slots, each twice (the second step reads the KV the first wrote). Per decode-kernel and
attention choice this host can run (fused/modules x ragged/padded; ragged and fused need Triton on CUDA):

- the gathered rows' hidden states against the full step's (largest absolute difference) and their codes
  (share equal: the ragged kernel splits a row's columns by the step's batch, so float sums may differ
  in the last bit, and random weights' flat logits turn that into another code now and then);
- every other slot untouched (inputs, positions, KV: exactly);
- on CUDA, the same gathered step captured and replayed against it run eagerly (exactly).

Writes ``gathered-check-<device>-<date>.json`` into ``--out``; exits non-zero when a check fails.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from bench.runtime.speech_api import RESULTS, make_checkpoint

SLOTS, MAX_LEN, LENGTH = 64, 512, 512
PICKED = [3, 17, 29, 40, 41, 63]  # scattered, never the lowest slots: what the low-slot substep could not do
# Hidden states of gathered rows may differ from the full step's by a few units in the last place of their dtype.
HIDDEN_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}


def _state(model, torch, trunk):
    """A slot state with the same random contents every time (``trunk``: the fused trunk, or None)."""
    from chattts_runtime.engines.graph_steps import SlotState  # noqa: PLC0415

    state = SlotState(model.gpt, SLOTS, MAX_LEN, model.device, 4, 4, text_rows=4)
    generator = torch.Generator(device=model.device).manual_seed(7)
    total, device = SLOTS + 1, model.device
    state.position.copy_(torch.randint(1, LENGTH - 4, (total,), generator=generator, device=device))
    state.codes.copy_(torch.randint(0, model.sizes.gpt.num_audio_tokens, (total, state.heads), generator=generator,
                                    device=device))
    for cache in (*state.keys, *state.values):
        cache.copy_(torch.randn(cache.shape, generator=generator, device=device))
    state.temperature.zero_()  # greedy
    state.trunk = trunk
    return state


def check(model, trunk, ragged: bool) -> dict:
    import torch  # noqa: PLC0415

    from chattts_runtime.engines.graph_steps import decode_step  # noqa: PLC0415

    eos, cuda = model.sizes.gpt.audio_eos, model.device.type == "cuda"
    full, gathered, before = (_state(model, torch, trunk) for _ in range(3))
    batch = 8
    gather = torch.tensor([*PICKED, *[SLOTS] * (batch - len(PICKED))], device=model.device)
    gathered.gather[:batch] = gather
    others = [s for s in range(SLOTS) if s not in PICKED]
    with torch.inference_mode():
        for _ in range(2):
            decode_step(model.gpt, full, SLOTS, LENGTH, eos, None, ragged)
            decode_step(model.gpt, gathered, batch, LENGTH, eos, None, ragged, gathered=True)
        out = {
            "hidden_max_abs_diff": float((gathered.hidden[PICKED].float() - full.hidden[PICKED].float()).abs().max()),
            "codes_equal_share": float((gathered.codes[PICKED] == full.codes[PICKED]).float().mean()),
            "positions_equal": bool(torch.equal(gathered.position[PICKED], full.position[PICKED])),
            "others_untouched": bool(
                torch.equal(gathered.codes[others], before.codes[others])
                and torch.equal(gathered.position[others], before.position[others])
                and all(torch.equal(a[others], b[others]) for a, b in zip(gathered.keys + gathered.values,
                                                                           before.keys + before.values))),
        }
        if cuda:  # the same gathered step captured: a replay equals the eager step
            del full, before
            eager, graphed = _state(model, torch, trunk), _state(model, torch, trunk)
            for state in (eager, graphed):
                state.gather[:batch] = gather
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up on the capture's stream (its workspaces), on other buffers
                decode_step(model.gpt, gathered, batch, LENGTH, eos, None, ragged, gathered=True)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # Capturing records the step without running it: `graphed` still holds the starting state.
            with torch.cuda.graph(graph, stream=side):
                decode_step(model.gpt, graphed, batch, LENGTH, eos, None, ragged, gathered=True)
            graph.replay()
            decode_step(model.gpt, eager, batch, LENGTH, eos, None, ragged, gathered=True)
            torch.cuda.synchronize()
            out["replay_equals_eager"] = bool(torch.equal(graphed.hidden, eager.hidden)
                                              and torch.equal(graphed.codes, eager.codes))
    tolerance = HIDDEN_TOLERANCE.get(str(model.gpt.dtype).removeprefix("torch."), 0.1)
    out["passed"] = bool(out["hidden_max_abs_diff"] <= tolerance and out["positions_equal"] and out["others_untouched"]
                         and out.get("replay_equals_eager", True))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RESULTS), help="folder for the JSON result")
    p.add_argument("--size", default=None, help="checkpoint size: full (default on CUDA), small, tiny (default on CPU)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = p.parse_args(argv)
    import torch  # noqa: PLC0415

    from chattts_runtime.engines import attention, fused  # noqa: PLC0415
    from chattts_runtime.model import load_chattts  # noqa: PLC0415

    cuda = torch.cuda.is_available() and args.device != "cpu"
    size = args.size or ("full" if cuda else "tiny")
    checkpoint = make_checkpoint(size, RESULTS / "tmp" / f"bench-{size}")
    model = load_chattts(checkpoint, device="cuda" if cuda else "cpu", dtype=torch.bfloat16 if cuda else torch.float32)
    kernels = (cuda or fused.interpreted()) and attention.available()
    report = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__, "size": size,
              "dtype": str(model.gpt.dtype), "slots": SLOTS, "picked": PICKED, "length": LENGTH, "checks": {}}
    for fuse in (False, True) if kernels else (False,):
        # Fusing stacks the projections' weights once (the modules then read views of them: same values).
        trunk = fused.fuse_trunk(model.gpt) if fuse else None
        for ragged in (False, True) if kernels else (False,):
            name = f"{'fused' if fuse else 'modules'}/{'ragged' if ragged else 'padded'}"
            report["checks"][name] = result = check(model, trunk, ragged)
            print(name, json.dumps(result), flush=True)
    report["passed"] = all(c["passed"] for c in report["checks"].values())
    report["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    report["command"] = "python -m bench.runtime.gathered_check " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gathered-check-{'cuda' if cuda else 'cpu'}-{report['date']}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"gathered check {'passed' if report['passed'] else 'FAILED'}; wrote {path}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
