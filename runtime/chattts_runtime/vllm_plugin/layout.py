"""How ChatTTS frames travel through vLLM as token ids (pure: numpy, no torch, no vLLM).

vLLM generates one token per step and hands back only token ids (and, on request,
logprobs). A ChatTTS step makes a *frame* of ``num_vq`` codes (626 values each). The
model plugin therefore lays out one vocabulary over three ranges::

    [0, T)                      text prompt tokens (the checkpoint's tokenizer)
    [T + 0*A, T + 1*A)          codebook 0: the token vLLM samples and feeds back
    [T + k*A, T + (k+1)*A)      codebook k >= 1: "carrier" ids, k = 1..num_vq-1

with T = num_text_tokens and A = num_audio_tokens. The model chooses the whole frame
itself (ChatTTS sampling, see ``model.py``) and returns logits that are -inf everywhere
except: the chosen codebook-0 id (highest) and one carrier id per other codebook (next
highest). vLLM's greedy sampler then emits the codebook-0 id as the token, and with
``logprobs=num_vq`` and ``logprobs_mode=raw_logits`` the top entries name the carriers,
so the client reads the full frame from the ordinary output stream. Any code equal to
the end code (A - 1) makes the model emit codebook 0's end code, which is the stop token.

On the Decoder path a request also needs the GPT's hidden state of every frame, and vLLM
returns nothing per token but ids and logprobs. The model then writes the hidden state into
the same row: logit ``d`` (a text id, never generated in the audio pass) holds
``hidden[d]`` for ``d < hidden_size``, and the request asks for ``num_vq + hidden_size``
logprobs, which are exactly the row's finite entries. Raw float32 logits travel unchanged,
so the client reads the hidden state bit for bit. The chosen id's logit is the largest
float32 below infinity, so it stays the argmax whatever the hidden values are.

Refine-text requests use the text range only: the chosen id *is* the text token.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# The vLLM architecture name of the ChatTTS GPT (``hf_overrides.architectures``).
ARCHITECTURE = "ChatTTSForAudioCodes"
# Logit values the model writes: the chosen codebook-0 id, then the carriers.
CHOSEN_LOGIT = 3.0e38  # above any hidden value carried beside it (float32 max is 3.4e38)
CARRIER_LOGIT = 1.0


class FrameDecodeError(ValueError):
    """A step's output does not carry a complete frame (wrong engine settings or a bug)."""


@dataclass(frozen=True)
class TokenLayout:
    text_tokens: int
    audio_tokens: int
    num_vq: int

    def __post_init__(self) -> None:
        if self.text_tokens < 1 or self.audio_tokens < 2 or self.num_vq < 1:
            raise ValueError(f"invalid token layout {self}")

    @classmethod
    def from_sizes(cls, gpt) -> "TokenLayout":
        """From ``chattts_runtime.model.config.GPTSizes``."""
        return cls(gpt.num_text_tokens, gpt.num_audio_tokens, gpt.num_vq)

    @property
    def vocab_size(self) -> int:
        return self.text_tokens + self.num_vq * self.audio_tokens

    @property
    def eos_code(self) -> int:
        return self.audio_tokens - 1

    @property
    def stop_token(self) -> int:
        """The token id that ends generation: codebook 0's end code."""
        return self.code_token(0, self.eos_code)

    def code_token(self, book: int, code: int) -> int:
        if not 0 <= book < self.num_vq or not 0 <= code < self.audio_tokens:
            raise ValueError(f"codebook {book} code {code} is outside the layout")
        return self.text_tokens + book * self.audio_tokens + code

    def split(self, token: int) -> tuple[int, int]:
        """A code token id -> (codebook, code)."""
        offset = token - self.text_tokens
        if not 0 <= offset < self.num_vq * self.audio_tokens:
            raise FrameDecodeError(f"token {token} is not an audio code")
        return divmod(offset, self.audio_tokens)

    def hidden_logprobs(self, hidden_size: int) -> int:
        """Logprobs a Decoder-path request asks for: the carriers and the hidden state."""
        if hidden_size > self.text_tokens:
            raise ValueError(f"hidden size {hidden_size} exceeds the {self.text_tokens} text ids that carry it")
        return self.num_vq + hidden_size

    def decode_frame(self, token: int, ranked_ids: Iterable[int]) -> tuple[int, ...]:
        """The sampled token and a step's logprob ids -> the frame's ``num_vq`` codes (text ids,
        which carry a hidden state, are skipped)."""
        book, code = self.split(token)
        if book != 0:
            raise FrameDecodeError(f"sampled token {token} is a carrier of codebook {book}, not codebook 0")
        codes: list[int | None] = [code] + [None] * (self.num_vq - 1)
        for tid in ranked_ids:
            if tid == token or tid < self.text_tokens:
                continue
            b, c = self.split(tid)
            if b == 0:
                continue
            if codes[b] is not None and codes[b] != c:
                raise FrameDecodeError(f"two carriers for codebook {b} in one step")
            codes[b] = c
        if any(c is None for c in codes):
            raise FrameDecodeError(f"step output lacks carriers for codebooks "
                                   f"{[i for i, c in enumerate(codes) if c is None]}")
        return tuple(int(c) for c in codes)  # type: ignore[arg-type]

    def decode_hidden(self, ids: Sequence[int], values: Sequence[float], hidden_size: int) -> np.ndarray:
        """A step's logprob entries (ids, raw logits) -> the float32 hidden state they carry (vectorised:
        this runs for every frame of every Decoder-path request in the API process)."""
        ids_arr = np.asarray(ids, np.int64)
        mask = ids_arr < hidden_size
        hidden = np.zeros(hidden_size, np.float32)
        hidden[ids_arr[mask]] = np.asarray(values, np.float32)[mask]
        found = np.unique(ids_arr[mask]).size
        if found != hidden_size:
            seen = np.zeros(hidden_size, bool)
            seen[ids_arr[mask]] = True
            raise FrameDecodeError(f"step output lacks {hidden_size - found} of {hidden_size} hidden values "
                                   f"(first: {int(np.flatnonzero(~seen)[0])}): the request must ask for "
                                   f"{self.num_vq + hidden_size} logprobs")
        return hidden
