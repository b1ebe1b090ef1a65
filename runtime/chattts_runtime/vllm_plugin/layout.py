"""How ChatTTS frames travel through vLLM as token ids (pure Python, no torch, no vLLM).

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
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The vLLM architecture name of the ChatTTS GPT (``hf_overrides.architectures``).
ARCHITECTURE = "ChatTTSForAudioCodes"
# Logit values the model writes: the chosen codebook-0 id, then the carriers.
CHOSEN_LOGIT = 2.0
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

    def decode_frame(self, token: int, ranked_ids: Iterable[int]) -> tuple[int, ...]:
        """The sampled token and a step's logprob ids -> the frame's ``num_vq`` codes."""
        book, code = self.split(token)
        if book != 0:
            raise FrameDecodeError(f"sampled token {token} is a carrier of codebook {book}, not codebook 0")
        codes: list[int | None] = [code] + [None] * (self.num_vq - 1)
        for tid in ranked_ids:
            if tid == token:
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
