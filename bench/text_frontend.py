"""CPU cost per request of the text front-end: normalization and long-input splitting.

    python -m bench.text_frontend [--out bench/results/text-frontend-cpu-DATE] [--repeat 200]

Builds the small (tiny) random checkpoint, then times, per text, ``TextNormalizer`` alone
and ``FrontEnd.pieces`` (upstream's split, normalization, tokenization of every piece,
packing of pieces beyond the context) with the server's defaults (max_model_len 2048,
16 frames per text token). The homophone table is read from an installed upstream
package when one is importable (``.venv/parity-site`` is tried), else that stage is off.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

EN = "ChatTTS is a text-to-speech model designed for dialogue! It supports English and Chinese. "
ZH = "ChatTTS是一款强大的对话式文本转语音模型。它有中英混读和多说话人的能力！你觉得怎么样？"
TEXTS = {
    "en-short (26 chars)": "Hello! It's 3 o'clock: ok?",
    "zh-short (16 chars)": "你好，世界。我们是中文语音合成！",
    "mixed-500": ((EN + ZH) * 10)[:500],
    "en-2448 (the issue's length)": (EN * 30)[:2448],
    "zh-2000": (ZH * 50)[:2000],
    "en-4096 (max_input_chars)": (EN * 50)[:4096],
}


def timed(fn, repeat: int) -> dict:
    fn()  # warm (caches, first regex compile)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 4), "p95_ms": round(samples[int(0.95 * len(samples)) - 1], 4)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "bench/results" / f"text-frontend-cpu-{time.strftime('%Y-%m-%d')}"))
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    site = REPO / ".venv" / "parity-site"
    if site.is_dir():
        sys.path.append(str(site))

    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.model.prompt import PromptTokenizer
    from chattts_runtime.model import config as layout
    from chattts_runtime.testing import make_tiny_checkpoint
    from chattts_runtime.text.frontend import FrontEnd

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tiny_checkpoint(Path(tmp) / "tiny")
        config = RuntimeConfig.model_validate({"model": {"path": str(ckpt)}})
        frontend = FrontEnd.from_config(config, PromptTokenizer(ckpt / layout.TOKENIZER_DIR))
        rows = []
        for name, text in TEXTS.items():
            pieces = frontend.pieces(text)
            rows.append({"text": name, "chars": len(text), "pieces": len(pieces),
                         "prompt_tokens": sum(len(p.prompt.input_ids) for p in pieces),
                         "normalize": timed(lambda: frontend.normalizer(text), args.repeat),
                         "normalize_split_tokenize": timed(lambda: frontend.pieces(text), args.repeat)})
    result = {"what": "text front-end CPU cost per request (normalize; normalize + split + tokenize)",
              "command": "python -m bench.text_frontend", "machine": f"{platform.machine()}, {platform.processor()}",
              "python": platform.python_version(), "normalizer": frontend.normalizer.describe(),
              "tokenizer": "tiny test tokenizer (chattts_runtime.testing)", "repeat": args.repeat, "rows": rows}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    lines = [f"# {result['what']}", "", f"`{result['command']}`; {result['machine']}, Python {result['python']}; "
             f"normalizer {result['normalizer']}; {result['tokenizer']}; {args.repeat} runs each.", "",
             "| text | chars | pieces | prompt tokens | normalize median / p95 ms | normalize+split+tokenize median / p95 ms |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['text']} | {r['chars']} | {r['pieces']} | {r['prompt_tokens']} | "
                     f"{r['normalize']['median_ms']} / {r['normalize']['p95_ms']} | "
                     f"{r['normalize_split_tokenize']['median_ms']} / {r['normalize_split_tokenize']['p95_ms']} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
