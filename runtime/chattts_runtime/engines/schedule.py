"""Which waiting work an engine starts next: the admission policy, pure (no torch, no threads).

A response's listener hears nothing until its *first-audio work* is done: the refine-text jobs of
its pieces, a long input's first-piece voice pass, then its first piece. A response that is already
playing asks for more only when its next piece is due, and its listener then has the current
piece's audio buffered ahead (a piece is generated faster than it plays). So the engines admit
in two classes:

* **urgent** (``Stage.FIRST``, ``Stage.VOICE``, refine-text jobs): first come, first served, across
  both kinds of slot;
* **steady** (``Stage.NEXT``): after every urgent item, first come first served, until it has waited
  ``next_piece_grace`` seconds; then it is urgent by its own arrival (a playing stream is never
  starved past that bound, whatever arrives).

Free slots are the only budget (both kinds of work take one slot each); refine-text jobs have a
cap of their own (``text_room``, the refine rows still free). Audio may be held back for one
iteration (``audio_open`` False: the engine gathers newcomers into one prefill) without losing its
place.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence


class Stage(str, Enum):
    """Where an audio request stands on its response's way to the listener."""

    FIRST = "first"  # a response's first piece: its first audio
    VOICE = "voice"  # a long input's first-piece voice pass (upstream's spk_smp from the first piece)
    NEXT = "next"  # a later piece of a response that is already playing


URGENT_STAGES = frozenset({Stage.FIRST, Stage.VOICE})


@dataclass(frozen=True)
class Waiting:
    """One waiting item as the policy sees it: when it arrived and what it is."""

    arrival: float
    stage: Stage = Stage.FIRST


@dataclass(frozen=True)
class Admission:
    """Indices into the waiting audio requests and the waiting refine-text jobs to start now, in order."""

    audio: tuple[int, ...] = ()
    text: tuple[int, ...] = ()


def is_urgent(item: Waiting, now: float, next_piece_grace: float) -> bool:
    return Stage(item.stage) in URGENT_STAGES or now - item.arrival >= next_piece_grace


def plan_admission(audio: Sequence[Waiting], text: Sequence[float], *, free_slots: int, text_room: int,
                   now: float, next_piece_grace: float, audio_open: bool = True) -> Admission:
    """The work to start now. ``audio``: waiting audio requests in queue order; ``text``: the arrival
    of each waiting refine-text job, in queue order; ``free_slots``: slots free for either kind;
    ``text_room``: refine-text jobs that may still start. Within a class, ties keep queue order."""
    if free_slots <= 0:
        return Admission()
    candidates: list[tuple[int, float, int, str, int]] = []  # (class, arrival, queue position, kind, index)
    if audio_open:
        for i, item in enumerate(audio):
            candidates.append((0 if is_urgent(item, now, next_piece_grace) else 1, item.arrival, i, "audio", i))
    for i, arrival in enumerate(text[:max(0, text_room)]):
        candidates.append((0, arrival, i, "text", i))
    candidates.sort(key=lambda c: (c[0], c[1], c[2]))
    chosen = candidates[:free_slots]
    return Admission(audio=tuple(sorted(c[4] for c in chosen if c[3] == "audio")),
                     text=tuple(sorted(c[4] for c in chosen if c[3] == "text")))


def take(queue: list, indices: Sequence[int]) -> tuple[list, list]:
    """``(taken, left)``: the items of ``queue`` at ``indices`` (in queue order) and the rest, in order."""
    wanted = set(indices)
    taken = [item for i, item in enumerate(queue) if i in wanted]
    left = [item for i, item in enumerate(queue) if i not in wanted]
    return taken, left
