"""The text front-end of a request: normalize, cut into pieces, build each piece's prompt.

``FrontEnd.pieces(text)`` is what the speech service calls; every stage it uses is a
pure function in :mod:`normalize` / :mod:`split`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
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
                                      known_character=known, grammar_dir=text.normalizer_grammars)
        budget = FrameBudget(config.engine.max_model_len, config.generation.max_new_frames,
                             text.frames_per_text_token)
        return cls(tokenizer, normalizer, budget)

    def pieces(self, text: str, *, normalize: bool = True, lang: Language | None = None,
               with_speaker: bool = True, speed: float = 1.0, voice_from_first: bool = False) -> list[TextPiece]:
        """Raises :class:`NothingToSay`, or ``split.SentenceTooLong`` for a run without sentence end, clause mark
        or white space that alone cannot fit the context.

        ``voice_from_first``: every piece of a long input will also hold the first piece's text and
        audio (its voice sample, ``SpeechService.voice_from_first_piece``) in its context. When some
        piece would not fit beside the first one's text and budgeted frames, the input is planned
        again in half the context: then the first piece, and beside it any other, always fit."""
        planned = self._plan(text, self.budget, normalize, lang, with_speaker, speed)
        if voice_from_first and len(planned) > 1:
            first = planned[0].prompt
            reserve = self.budget.frames_needed(first.text_tokens, speed) + first.text_tokens
            if not all(self.budget.fits(len(p.prompt.input_ids) + reserve, p.prompt.text_tokens, speed)
                       for p in planned):
                half = replace(self.budget, max_model_len=self.budget.max_model_len // 2)
                planned = self._plan(text, half, normalize, lang, with_speaker, speed)
        return planned

    def _plan(self, text: str, budget: FrameBudget, normalize: bool, lang: Language | None, with_speaker: bool,
              speed: float) -> list[TextPiece]:
        # The planner asks again for texts it tried (a paragraph's lone sentence, as a group and then
        # alone): each is normalized and tokenized once per plan. Pieces are frozen, so sharing is safe.
        prepared: dict[str, TextPiece | None] = {}

        def prepare(raw: str) -> TextPiece | None:
            if raw not in prepared:
                prepared[raw] = prepare_once(raw)
            return prepared[raw]

        def prepare_once(raw: str) -> TextPiece | None:
            said = self.normalizer(raw, lang=lang) if normalize else raw
            if not said.strip():
                return None
            prompt = self.tokenizer.build(said, with_speaker=with_speaker, speed=speed)
            if prompt.text_tokens == 0:
                return None
            return TextPiece(said, prompt, budget.max_frames(len(prompt.input_ids)))

        def fits(piece: TextPiece) -> bool:
            return budget.fits(len(piece.prompt.input_ids), piece.prompt.text_tokens, speed)

        def possible(piece: TextPiece) -> bool:
            return budget.fits_context(len(piece.prompt.input_ids), piece.prompt.text_tokens, speed)

        planned = Planner(prepare, fits, possible).plan(text)
        if not planned:
            raise NothingToSay("input has nothing to synthesize after text normalization (digits, symbols and "
                               "emoji are dropped as upstream ChatTTS does; spell them out or send normalize: false)")
        return planned
