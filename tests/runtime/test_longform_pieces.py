"""A long input's pieces chained into one response (``longform.chain_pieces``) on a real engine.

The next piece starts beside the current one only while the engine has room (nobody waiting, a
slot free); a full engine gets it when the current piece ends, so a response never holds two
slots that another response is waiting for. Every piece's last chunk but the final one says
``piece_end`` (each piece's audio is decoded on its own).
"""
from __future__ import annotations

import asyncio

from chattts_runtime.engines.base import SamplingParams
from chattts_runtime.engines.reference import ReferenceEngine
from chattts_runtime.longform import chain_pieces
from rt_helpers import TEXTS, request

PARAMS = SamplingParams(temperature=0, max_new_frames=12, min_new_frames=12)


class WatchedEngine(ReferenceEngine):
    """The reference engine, noting how many requests ran when each one was submitted."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.running_at_submit: list[int] = []

    def submit(self, req):
        self.running_at_submit.append(self.num_running + self.num_waiting)
        return super().submit(req)


async def _speak(model, max_num_seqs: int):
    engine = WatchedEngine(model, max_num_seqs=max_num_seqs)
    await engine.start()
    pieces = [request(model, i, text, PARAMS) for i, text in enumerate(TEXTS[:3])]
    try:
        chunks = [c async for c in chain_pieces(engine, engine.submit(pieces[0]), pieces[1:])]
    finally:
        await engine.stop()
    return chunks, engine.running_at_submit


def test_pieces_start_early_while_the_engine_has_room(tiny_model):
    chunks, busy = asyncio.run(_speak(tiny_model, max_num_seqs=8))
    assert busy[0] == 0 and all(n >= 1 for n in busy[1:])  # each next piece joined the current one
    assert sum(len(c.codes) for c in chunks) == 3 * 12
    assert [c.piece_end for c in chunks].count(True) == 2 and chunks[-1].finished
    assert not any(c.finished for c in chunks[:-1])


def test_a_full_engine_gets_the_next_piece_when_the_current_one_ends(tiny_model):
    chunks, busy = asyncio.run(_speak(tiny_model, max_num_seqs=1))
    assert busy == [0, 0, 0]  # never a second slot asked for while the one slot was taken
    assert sum(len(c.codes) for c in chunks) == 3 * 12
    assert [c.piece_end for c in chunks].count(True) == 2 and chunks[-1].finished
