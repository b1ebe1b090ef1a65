"""Long input: pieces that each fit the model's context, in order.

Upstream ChatTTS (``split_text=True``) cuts the raw text at line breaks when it has any,
else after ``。`` and after ``. ``, and generates every piece on its own (up to 2,048
frames each). :func:`upstream_pieces` is that cut. A piece must also fit the context
here: its prompt plus the frames it will need must stay within ``max_model_len``, and
the frames within ``max_new_frames``. :class:`Planner` keeps upstream's pieces that
fit, cuts the others at every sentence end (``。！？；…!?;``, ``.`` before a space) and
packs consecutive sentences back together while they fit. A sentence that fits the context
but needs more than ``max_new_frames`` (an operator's cap, below the context) goes alone,
capped. A sentence that cannot fit the context (a long comma-separated sentence, a
paragraph pasted without a sentence end) is cut the same way one level down: at its
clause marks (:func:`clauses`: ``，、,：:`` ...), then at white space (:func:`words`),
and packed back while it fits; only a run with neither that still cannot fit the
context is refused (:class:`SentenceTooLong`, the speech API's 400 ``input_too_long``).
Upstream generates such a sentence as one piece whatever its length (its context is the
prompt plus 2,048 frames); here the context is ``max_model_len`` for both.

How many frames a text needs is estimated from its token count
(:attr:`FrameBudget.frames_per_text_token`, scaled by 1/speed); the default (16 frames =
0.34 s per token) is above ChatTTS's pace at ``[speed_5]`` for English word pieces and
Chinese characters alike, so a piece is not cut short by the frame limit.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

P = TypeVar("P")

_UPSTREAM_SENTENCE_END = re.compile(r"(?<=。)|(?<=\.\s)")
_SENTENCE_END = re.compile(r"(?<=[。！？；…!?;\n])|(?<=\.)(?=\s)")
# Clause marks, before and after upstream's punctuation mapping (its zh pass turns ":;()-" into "，").
_CLAUSE_END = re.compile(r"(?<=[，、,：:（）()《》〈〉「」『』【】“”\"—－\-])")
_WORD_END = re.compile(r"(?<=\s)(?=\S)")


def upstream_pieces(text: str) -> list[str]:
    """Upstream's cut; pieces with nothing but white space are dropped (upstream would
    synthesize an empty prompt for a blank line)."""
    parts = text.split("\n") if "\n" in text else _UPSTREAM_SENTENCE_END.split(text)
    return [p for p in parts if p.strip()]


def sentences(text: str) -> list[str]:
    """Cut after every sentence end; joining the result gives ``text`` back."""
    return [s for s in _SENTENCE_END.split(text) if s]


def clauses(text: str) -> list[str]:
    """Cut after every clause mark (comma, enumeration comma, colon, dash, bracket, quote); joins back."""
    return [s for s in _CLAUSE_END.split(text) if s]


def words(text: str) -> list[str]:
    """Cut before every word after white space; joins back."""
    return [s for s in _WORD_END.split(text) if s]


_FINER = (clauses, words)  # how a part that cannot fit the context is cut next, in order


@dataclass(frozen=True)
class FrameBudget:
    max_model_len: int
    max_new_frames: int
    frames_per_text_token: float = 16.0

    def frames_needed(self, text_tokens: int, speed: float = 1.0) -> int:
        return max(1, math.ceil(self.frames_per_text_token * text_tokens / speed))

    def fits(self, prompt_tokens: int, text_tokens: int, speed: float = 1.0) -> bool:
        """Within the context and within the per-piece frame cap."""
        frames = self.frames_needed(text_tokens, speed)
        return frames <= self.max_new_frames and self.fits_context(prompt_tokens, text_tokens, speed)

    def fits_context(self, prompt_tokens: int, text_tokens: int, speed: float = 1.0) -> bool:
        return prompt_tokens + self.frames_needed(text_tokens, speed) < self.max_model_len

    def max_text_tokens(self, speed: float = 1.0, fixed_tokens: int = 4) -> int:
        """About the most text tokens one piece holds: with its prompt's ``fixed_tokens`` (``[Stts]``, speaker,
        speed, ``[Ptts]``) and its budgeted frames within the context (what the 400 ``input_too_long`` says)."""
        per_token = 1 + self.frames_per_text_token / speed
        return max(0, math.floor((self.max_model_len - 1 - fixed_tokens) / per_token))

    def max_frames(self, prompt_tokens: int) -> int:
        """Frames a piece may generate (its prompt and frames within the context)."""
        return min(self.max_new_frames, self.max_model_len - prompt_tokens - 1)


class SentenceTooLong(ValueError):
    """A run without sentence end, clause mark or white space that cannot fit the context alone."""

    def __init__(self, sentence: str):
        super().__init__(f"a run of {len(sentence)} characters without punctuation or white space is too long "
                         f"to synthesize in one piece: {sentence[:40]!r}...")
        self.sentence = sentence


@dataclass(frozen=True)
class Planner(Generic[P]):
    """``prepare(text)`` -> a piece (prompt built), or None when nothing is left to say
    (normalization dropped every character); ``fits(piece)`` -> within the budget;
    ``possible(piece)`` -> a sentence that does not fit may still go alone (default: never)."""

    prepare: Callable[[str], P | None]
    fits: Callable[[P], bool]
    possible: Callable[[P], bool] = lambda piece: False

    def plan(self, text: str) -> list[P]:
        out: list[P] = []
        for raw in upstream_pieces(text):
            piece = self.prepare(raw)
            if piece is None:
                continue
            out += [piece] if self.fits(piece) else self._pack(sentences(raw))
        return out

    def _pack(self, parts: Sequence[str], finer: tuple = _FINER) -> list[P]:
        out: list[P] = []
        start = 0
        while start < len(parts):
            best, end = None, start
            # Grow the group part by part while it fits (a longer group re-tokenizes,
            # so normalization across the joints stays what one piece would get).
            for stop in range(start + 1, len(parts) + 1):
                candidate = self.prepare("".join(parts[start:stop]))
                if candidate is not None and not self.fits(candidate):
                    break
                best, end = candidate, stop
            if end == start:
                alone = self.prepare(parts[start])
                if self.possible(alone):
                    best, end = alone, start + 1
                else:
                    # It cannot fit the context: cut it at its clause marks, else its white space.
                    level = next((i for i, cut in enumerate(finer) if len(cut(parts[start])) > 1), None)
                    if level is None:
                        raise SentenceTooLong(parts[start])
                    out += self._pack(finer[level](parts[start]), finer[level + 1:])
                    start += 1
                    continue
            if best is not None:
                out.append(best)
            start = end
        return out
