"""Offline batch synthesis: ``texts.jsonl`` in, audio files + ``manifest.jsonl`` out, resumable.

Input lines: ``{"id": "a1", "text": "...", "voice": "nova", "speed": 1.0}`` (voice and
speed optional). Each finished item is written to ``<out>/<id>.<format>`` (atomically:
temporary file, then rename) and then recorded in ``<out>/manifest.jsonl``. A rerun
skips ids the manifest records as ``ok`` whose file still exists, so a Job that was
suspended or evicted continues where it stopped. Items that fail validation (empty
text, unknown voice...) are recorded with ``status: error`` and retried on the next run.
The whole input is checked before any work starts (bad JSON, missing fields, duplicate
or unsafe ids fail at once with the line number).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from chattts_runtime.config import RuntimeConfig

log = logging.getLogger(__name__)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MANIFEST = "manifest.jsonl"


class SynthesizeError(ValueError):
    pass


@dataclass(frozen=True)
class Item:
    id: str
    text: str
    voice: str | None
    speed: float


@dataclass
class Summary:
    total: int = 0
    done: int = 0
    skipped: int = 0
    failed: int = 0

    def __str__(self) -> str:
        return (f"synthesized {self.done}, skipped {self.skipped} (already done), failed {self.failed}, "
                f"of {self.total}")


def read_items(path: Path) -> list[Item]:
    if not path.exists():
        raise SynthesizeError(f"input {path} does not exist")
    items: list[Item] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise SynthesizeError(f"{path}:{lineno}: invalid JSON: {err}") from None
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise SynthesizeError(f"{path}:{lineno}: expected an object with a string 'text'")
        item_id = str(data.get("id", lineno))
        if not _SAFE_ID.match(item_id):
            raise SynthesizeError(f"{path}:{lineno}: id {item_id!r} must match {_SAFE_ID.pattern}")
        if item_id in seen:
            raise SynthesizeError(f"{path}:{lineno}: duplicate id {item_id!r}")
        seen.add(item_id)
        voice = data.get("voice")
        speed = data.get("speed", 1.0)
        if not isinstance(speed, (int, float)):
            raise SynthesizeError(f"{path}:{lineno}: speed must be a number")
        items.append(Item(item_id, data["text"], voice if isinstance(voice, str) else None, float(speed)))
    return items


def completed_ids(out_dir: Path) -> set[str]:
    manifest = out_dir / MANIFEST
    done: set[str] = set()
    if not manifest.exists():
        return done
    for line in manifest.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line from an interrupted run
        if rec.get("status") == "ok" and (out_dir / rec.get("file", "")).is_file():
            done.add(rec["id"])
    return done


async def _run(config: RuntimeConfig, items: list[Item], out_dir: Path, fmt: str, default_voice: str,
               concurrency: int, summary: Summary) -> None:
    from chattts_runtime.metrics import RuntimeMetrics  # noqa: PLC0415
    from chattts_runtime.model import load_chattts  # noqa: PLC0415
    from chattts_runtime.engines.factory import create_engine, load_options, resolve_device  # noqa: PLC0415
    from chattts_runtime.service import APIError, SpeechRequest, SpeechService  # noqa: PLC0415

    device = resolve_device(config)
    model = await asyncio.to_thread(load_chattts, config.model.path, **load_options(config, device))
    metrics = RuntimeMetrics()
    engine = create_engine(config, model, metrics)
    await engine.start()
    service = SpeechService(config, model, engine, metrics)
    manifest = (out_dir / MANIFEST).open("a")
    gate = asyncio.Semaphore(concurrency)

    def record(rec: dict) -> None:
        manifest.write(json.dumps(rec, ensure_ascii=False) + "\n")
        manifest.flush()
        os.fsync(manifest.fileno())

    async def one(item: Item) -> None:
        async with gate:
            try:
                req = SpeechRequest(model=config.model.served_name, input=item.text,
                                    voice=item.voice or default_voice, response_format=fmt, speed=item.speed)
                synthesis = service.prepare(req)
                await service.refine(synthesis, req)
                await service.voice_from_first_piece(synthesis, req)
                audio = await service.synthesize(synthesis, service.submit(synthesis))
                data = await asyncio.to_thread(service.encode, audio, fmt)
            except APIError as err:
                summary.failed += 1
                record({"id": item.id, "status": "error", "error": err.message})
                return
            name = f"{item.id}.{fmt}"
            tmp = out_dir / f".{name}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, out_dir / name)
            summary.done += 1
            record({"id": item.id, "status": "ok", "file": name, "format": fmt,
                    "seconds": round(len(audio) / 24_000, 4), "bytes": len(data)})

    try:
        await asyncio.gather(*(one(item) for item in items))
    finally:
        manifest.close()
        await service.close()


def run_synthesize(config: RuntimeConfig, input_path: Path, out_dir: Path, *, fmt: str = "wav",
                   default_voice: str = "alloy", concurrency: int = 8) -> Summary:
    from chattts_runtime.audio_io import UnsupportedFormat, check_format  # noqa: PLC0415

    try:
        check_format(fmt, stream=False)
    except UnsupportedFormat as err:
        raise SynthesizeError(str(err)) from None
    if concurrency < 1:
        raise SynthesizeError("concurrency must be >= 1")
    items = read_items(input_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = completed_ids(out_dir)
    pending = [i for i in items if i.id not in done]
    summary = Summary(total=len(items), skipped=len(items) - len(pending))
    if pending:
        asyncio.run(_run(config, pending, out_dir, fmt, default_voice, concurrency, summary))
    log.info("%s", summary)
    return summary
