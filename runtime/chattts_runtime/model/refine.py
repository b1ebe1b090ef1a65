"""Refine-text, as upstream's default ``Chat.infer(skip_refine_text=False)`` runs it.

Before the audio pass, the GPT's *text* head rewrites the (normalized) input: it inserts
ChatTTS's prosody tokens (``[uv_break]``, ``[laugh]``, ``[lbreak]``...). The prompt is::

    [Sbreak]<text>[Pbreak]<controls>          e.g. controls = [oral_2][laugh_0][break_6]

embedded with ``emb_text`` at every position; each step feeds the sampled text token back
through ``emb_text``; generation ends at ``[Ebreak]`` (not part of the output). Of the
generated ids, those ``>= id([break_0])`` (the control-token block at the end of the official
vocabulary) are dropped; the rest is decoded (WordPiece, special tokens kept) into the text the
audio pass reads. Sampling defaults are upstream's ``RefineTextParams``: temperature 0.7,
top-p 0.7, top-k 20, no repetition penalty, at most 384 new tokens, and no prompt controls.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from chattts_runtime.model.sampling import SamplingParams

ORAL_LEVELS, LAUGH_LEVELS, BREAK_LEVELS = 10, 3, 8  # [oral_0..9], [laugh_0..2], [break_0..7]
REFINE_START, REFINE_PROMPT, REFINE_END = "[Sbreak]", "[Pbreak]", "[Ebreak]"


def upstream_refine_sampling(**overrides) -> SamplingParams:
    """Upstream's ``RefineTextParams`` sampling (``max_new_frames`` counts text tokens here)."""
    values = dict(temperature=0.7, top_p=0.7, top_k=20, repetition_penalty=1.0, max_new_frames=384,
                  min_new_frames=1)  # min 1: upstream regenerates an empty result (ensure_non_empty)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return SamplingParams(**values)


@dataclass(frozen=True)
class RefineParams:
    """One refine pass: the prompt controls (None = not in the prompt) and its sampling."""

    oral: int | None = None
    laugh: int | None = None
    break_: int | None = None
    sampling: SamplingParams = field(default_factory=upstream_refine_sampling)

    def __post_init__(self) -> None:
        for name, value, levels in (("oral", self.oral, ORAL_LEVELS), ("laugh", self.laugh, LAUGH_LEVELS),
                                    ("break", self.break_, BREAK_LEVELS)):
            if value is not None and not 0 <= value < levels:
                raise ValueError(f"{name} must be between 0 and {levels - 1}; got {value}")

    @property
    def controls(self) -> str:
        """The ``[oral_k][laugh_k][break_k]`` prompt (upstream's ``RefineTextParams.prompt``)."""
        parts = [(self.oral, "oral"), (self.laugh, "laugh"), (self.break_, "break")]
        return "".join(f"[{name}_{level}]" for level, name in parts if level is not None)


def refine_prompt(text: str, controls: str) -> str:
    """Upstream's ``Speaker.decorate_text_prompts``: the text as it is, break tokens typed in it included
    (upstream removes none; a user's ``[Pbreak]`` or ``[Ebreak]`` reaches the model there too)."""
    return f"{REFINE_START}{text}{REFINE_PROMPT}{controls}"


def refined_text(tokenizer, generated) -> str:
    """Refine's generated ids -> the text the audio pass reads, as upstream's ``Chat._infer``: the ids below
    ``[break_0]`` (the control levels, last in the official vocabulary) decoded, control tokens kept."""
    break_0 = tokenizer.token_id("[break_0]")
    return tokenizer.decode([t for t in generated if t < break_0])
