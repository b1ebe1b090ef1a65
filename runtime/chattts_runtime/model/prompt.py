"""Text -> prompt token ids, as ChatTTS builds them for audio-code generation.

The checkpoint's ``asset/tokenizer`` is a BERT-style WordPiece tokenizer
(``BertTokenizerFast``: ``tokenizer.json`` + ``tokenizer_config.json`` +
``special_tokens_map.json``) whose vocabulary holds ChatTTS's control tokens.
A code-generation prompt is::

    [Stts][spk_emb][speed_K]<text>[Ptts]     (with a speaker vector)
    [Stts][empty_spk][speed_K]<text>[Ptts]   (without)

tokenized with ``add_special_tokens=False`` (no [CLS]/[SEP]). Every prompt position is
embedded with ``emb_text``; the ``[spk_emb]`` position's embedding is replaced by the
L2-normalised speaker vector. ``[speed_K]`` (K = 0..9, 5 = normal) is ChatTTS's speed
control; the speech API maps OpenAI's ``speed`` onto it (see :func:`speed_token`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chattts_runtime.model.config import CheckpointError

CONTROL_TOKENS = ("[Stts]", "[Ptts]", "[spk_emb]", "[empty_spk]", "[Sbreak]", "[Pbreak]", "[Ebreak]",
                  "[uv_break]", "[laugh]", "[lbreak]",
                  *(f"[speed_{i}]" for i in range(10)), *(f"[break_{i}]" for i in range(8)),
                  *(f"[laugh_{i}]" for i in range(3)), *(f"[oral_{i}]" for i in range(10)))
REQUIRED_TOKENS = ("[Stts]", "[Ptts]", "[spk_emb]", "[empty_spk]")


def speed_token(speed: float) -> str:
    """OpenAI speed (0.25..4.0, 1.0 = normal) -> ChatTTS ``[speed_K]`` (0..9, 5 = normal)."""
    level = round(5 * speed)
    return f"[speed_{max(0, min(9, level))}]"


def upstream_text(text: str) -> str:
    """The text as upstream's ``Speaker.decorate_code_prompts`` puts it in a code prompt: ``[Stts]``, then
    ``[spk_emb]``, then ``[empty_spk]`` removed, one after the other (so a nested ``[spk_[empty_spk]emb]``
    leaves a ``[spk_emb]`` whose position then carries the speaker, as upstream's), then stripped. Nothing
    else is removed: a ``[Ptts]`` or any other control token typed or refined into the text stays, as there
    (its issue 459: refined text that begins with control tokens)."""
    for token in ("[Stts]", "[spk_emb]", "[empty_spk]"):
        text = text.replace(token, "")
    return text.strip()


@dataclass(frozen=True)
class Prompt:
    input_ids: tuple[int, ...]
    text_tokens: int  # ids that came from the user's text (for accounting)


class PromptTokenizer:
    def __init__(self, tokenizer_dir: str | Path):
        from transformers import BertTokenizerFast  # noqa: PLC0415

        path = Path(tokenizer_dir)
        if not (path / "tokenizer.json").exists():
            raise CheckpointError(f"missing {path / 'tokenizer.json'}")
        self._tok = BertTokenizerFast.from_pretrained(str(path))
        vocab = self._tok.get_vocab()
        missing = [t for t in REQUIRED_TOKENS if t not in vocab]
        if missing:
            raise CheckpointError(f"{path}: tokenizer lacks the control tokens {missing}")
        self.vocab_size = len(self._tok)
        self.spk_emb_id = vocab["[spk_emb]"]
        self._has_speed = all(f"[speed_{i}]" in vocab for i in range(10))
        self._unk_id = self._tok.unk_token_id
        self._known: dict[str, bool] = {}
        self._fixed: dict[str, tuple[int, ...]] = {}  # the control-token head and tail (a few strings)

    def knows_character(self, char: str) -> bool:
        """Whether ``char`` alone tokenizes without [UNK] (the checkpoint's vocabulary decides)."""
        known = self._known.get(char)
        if known is None:
            ids = self._tok.encode(char, add_special_tokens=False)
            known = bool(ids) and self._unk_id not in ids
            if len(self._known) < 65536:  # bounded: requests choose the characters
                self._known[char] = known
        return known

    def build(self, text: str, *, with_speaker: bool, speed: float = 1.0, sample_text: str = "") -> Prompt:
        """Upstream's code prompt ``[Stts][spk_emb]<sample_text>[speed_k]<text>[Ptts]`` (``[empty_spk]``
        without a speaker), its strings built as ``Speaker.decorate_code_prompts`` builds them: ``text`` as
        :func:`upstream_text` leaves it, ``sample_text`` (the transcript of a reference clip, upstream's
        ``txt_smp``) as it is; the clip's codes follow the prompt.

        Tokenized in segments that end and start at a control token: the tokenizer splits its input at
        added tokens before anything else, so the ids are those of the whole string (the parity tier
        compares them with upstream's) and the fixed segments are tokenized once."""
        speaker_tag = "[spk_emb]" if with_speaker else "[empty_spk]"
        body = self._encode(upstream_text(text))
        head = self._encode_fixed(f"[Stts]{speaker_tag}")
        if sample_text:
            head += self._encode(sample_text)
        if self._has_speed:
            head += self._encode_fixed(speed_token(speed))
        return Prompt(head + body + self._encode_fixed("[Ptts]"), len(body))

    def _encode(self, text: str) -> tuple[int, ...]:
        # The Rust tokenizer itself: the same ids as ``encode(add_special_tokens=False)``
        # without the wrapper's per-call cost (long inputs tokenize every piece, some twice).
        return tuple(self._tok.backend_tokenizer.encode(text, add_special_tokens=False).ids)

    def _encode_fixed(self, text: str) -> tuple[int, ...]:
        ids = self._fixed.get(text)
        if ids is None:
            ids = self._fixed[text] = self._encode(text)
        return ids

    # -- refine-text (model/refine.py) ------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Plain ids of ``text`` (control tokens kept whole, no [CLS]/[SEP])."""
        return list(self._encode(text))

    def decode(self, ids) -> str:
        """Ids back to text as upstream decodes refined text (special tokens kept)."""
        return self._tok.batch_decode([list(ids)], skip_special_tokens=False, clean_up_tokenization_spaces=None)[0]

    def token_id(self, token: str) -> int | None:
        return self._tok.get_vocab().get(token)
