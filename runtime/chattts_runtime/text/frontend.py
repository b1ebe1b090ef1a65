"""The text front-end of a request: normalize, cut into pieces, build each piece's prompt.

``FrontEnd.pieces(text)`` is what the speech service calls; every stage it uses is a
pure function in :mod:`normalize` / :mod:`split`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chattts_runtime.model.prompt import Prompt, PromptTokenizer
from chattts_runtime.text.normalize import Language, TextNormalizer, build_normalizer
from chattts_runtime.text.split import FrameBudget, Planner


class NothingToSay(ValueError):
    """Normalization left no text to synthesize."""


@dataclass(frozen=True)
class TextPiece:
    text: str      # what the tokenizer read (normalized unless normalization was off)
    prompt: Prompt
    max_frames: int


class FrontEnd:
    def __init__(self, tokenizer: PromptTokenizer, normalizer: TextNormalizer, budget: FrameBudget):
        self.tokenizer, self.normalizer, self.budget = tokenizer, normalizer, budget

    @classmethod
    def from_config(cls, config, tokenizer: PromptTokenizer) -> "FrontEnd":
        text = config.text
        known = tokenizer.knows_character if text.drop_unknown_characters else None
        normalizer = build_normalizer(Path(config.model.path), homophones_map=text.homophones_map,
                                      homophones=text.homophones, language_normalizers=text.language_normalizers,
                                      known_character=known)
        budget = FrameBudget(config.engine.max_model_len, config.generation.max_new_frames,
                             text.frames_per_text_token)
        return cls(tokenizer, normalizer, budget)

    def pieces(self, text: str, *, normalize: bool = True, lang: Language | None = None,
               with_speaker: bool = True, speed: float = 1.0) -> list[TextPiece]:
        """Raises :class:`NothingToSay`, or ``split.SentenceTooLong`` for a sentence beyond the budget."""

        def prepare(raw: str) -> TextPiece | None:
            said = self.normalizer(raw, lang=lang) if normalize else raw
            if not said.strip():
                return None
            prompt = self.tokenizer.build(said, with_speaker=with_speaker, speed=speed)
            if prompt.text_tokens == 0:
                return None
            return TextPiece(said, prompt, self.budget.max_frames(len(prompt.input_ids)))

        def fits(piece: TextPiece) -> bool:
            return self.budget.fits(len(piece.prompt.input_ids), piece.prompt.text_tokens, speed)

        def possible(piece: TextPiece) -> bool:
            return self.budget.fits_context(len(piece.prompt.input_ids), piece.prompt.text_tokens, speed)

        planned = Planner(prepare, fits, possible).plan(text)
        if not planned:
            raise NothingToSay("input has nothing to synthesize after text normalization (digits, symbols and "
                               "emoji are dropped as upstream ChatTTS does; spell them out or send normalize: false)")
        return planned
