"""One response from several pieces: their engine streams chained, in order, as one stream.

A long input is cut into pieces (``text.split``); each piece is its own engine request.
:func:`chain_pieces` yields the first piece's chunks, then the next piece's, and so on;
only the last piece's final chunk is ``finished``; the last chunk of every other piece says
``piece_end``, and each piece's audio is decoded on its own (by the engine for streams, or
by the speech API), as upstream decodes every piece of a split text and concatenates them.
The next piece is submitted as soon as the current one produces while the engine has room
(``Engine.has_room``: nobody waiting, a slot free), so it is generated beside the current one;
otherwise when the current one ends. A full engine thus gives each response one slot, and
``max_num_seqs`` streams fit ``max_num_seqs`` slots: submitted early regardless, a paragraph
held two slots most of its life, and past half the slots responses queued behind other
responses' next pieces (bench/results/runtime-h200-2026-12-01-v3-summary.md). A late start
costs the listener nothing: a piece is generated faster than it plays, so its audio is ahead
when the next one starts. A piece the engine cannot queue yet (QueueFull) is retried: the
request was already admitted, so its later pieces wait rather than fail.
"""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Sequence

import numpy as np

from chattts_runtime.engines.base import Engine, EngineStopped, FrameChunk, QueueFull, SynthesisRequest

RETRY_SECONDS = 0.02
OK_REASONS = ("eos", "length")


async def submit_admitted(engine: Engine, request: SynthesisRequest) -> AsyncIterator[FrameChunk]:
    while True:
        request.arrival = time.monotonic()
        try:
            return engine.submit(request)
        except QueueFull:
            await asyncio.sleep(RETRY_SECONDS)


def _error_chunk(message: str) -> FrameChunk:
    return FrameChunk(np.zeros((0, 1), np.int64), finished=True, finish_reason="error", error=message)


async def chain_pieces(engine: Engine, first: AsyncIterator[FrameChunk],
                       rest: Sequence[SynthesisRequest]) -> AsyncIterator[FrameChunk]:
    current: AsyncIterator[FrameChunk] | None = first
    upcoming: AsyncIterator[FrameChunk] | None = None
    try:
        for index in range(len(rest) + 1):
            last = index == len(rest)
            async for chunk in current:
                joint = chunk.finished and not last and chunk.finish_reason in OK_REASONS
                if upcoming is None and not last and (joint or engine.has_room()):
                    try:
                        upcoming = await submit_admitted(engine, rest[index])
                    except EngineStopped:
                        yield _error_chunk("server is shutting down")
                        return
                if joint:  # the response goes on with the next piece
                    yield FrameChunk(chunk.codes, chunk.hidden, audio=chunk.audio, piece_end=True)
                    continue
                yield chunk
                if chunk.finished:
                    return
            current, upcoming = upcoming, None
    finally:
        for stream in (current, upcoming):
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
