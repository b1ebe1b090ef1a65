"""Refine-text generation with the GPT's text head (see ``model/refine.py`` for what it is).

Here: one request at a time over its own KV cache, on the caller's thread (the speech service runs
it in a worker thread of its own, never on the event loop), for engines that do not refine
themselves; the graph engine runs the same prompts batched in slots of its own
(``Engine.refine_text``) and :meth:`TextRefiner.read` turns either's ids into text. Sampling is ``model.sampling``'s, with
one text "codebook": the same order and limits as upstream, greedy when ``temperature == 0``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from chattts_runtime.engines.kvcache import BatchKVCache
from chattts_runtime.model.refine import REFINE_END, RefineParams, refine_prompt, refined_text
from chattts_runtime.model.sampling import SamplingParams, new_generator, sample_tokens


class RefineError(ValueError):
    """The checkpoint's tokenizer lacks refine-text's control tokens."""


@dataclass
class _TextRow:
    params: SamplingParams
    frames: list = field(default_factory=list)  # generated text ids, each [1]
    generator: torch.Generator | None = None


@dataclass(frozen=True)
class RefinedText:
    text: str  # what the audio pass reads
    token_ids: tuple[int, ...]  # generated ids before the control-token filter (the parity tier compares them)
    prompt_tokens: int


class TextRefiner:
    def __init__(self, model, *, max_model_len: int):
        tok = model.tokenizer
        self.model = model
        self.max_model_len = max_model_len
        self.end_id = tok.token_id(REFINE_END)
        self.break_0 = tok.token_id("[break_0]")
        missing = [t for t, i in ((REFINE_END, self.end_id), ("[break_0]", self.break_0),
                                  ("[Sbreak]", tok.token_id("[Sbreak]")), ("[Pbreak]", tok.token_id("[Pbreak]")))
                   if i is None]
        if missing:
            raise RefineError(f"the checkpoint's tokenizer lacks {missing}: refine-text is not available")

    def prompt_ids(self, text: str, params: RefineParams) -> list[int]:
        return self.model.tokenizer.encode(refine_prompt(text, params.controls))

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        """Text ids after the prompt, up to (not including) ``[Ebreak]`` or ``max_new_frames``."""
        gpt = self.model.gpt
        dev = self.model.device
        s = gpt.sizes
        cache = BatchKVCache(s.num_hidden_layers, s.num_key_value_heads, s.head_dim, gpt.dtype, dev, rows=1)
        ids = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
        positions = torch.arange(len(prompt_ids), device=dev)[None]
        hidden = gpt.forward_step(gpt.embed.emb_text(ids)[None], positions, cache)[:, -1]
        row = _TextRow(params, generator=new_generator(params))
        position = len(prompt_ids)
        while len(row.frames) < params.max_new_frames and position < self.max_model_len:
            logits = gpt.embed.head_text(hidden.float())[:, None, :]  # [1, 1, V]
            token = int(sample_tokens(logits, [row], self.end_id)[0, 0])
            if token == self.end_id:
                break
            row.frames.append(np.array([token]))
            step = torch.tensor([[token]], device=dev)
            hidden = gpt.forward_step(gpt.embed.emb_text(step), torch.tensor([[position]], device=dev), cache)[:, 0]
            position += 1
        return [int(f[0]) for f in row.frames]

    def refine(self, text: str, params: RefineParams) -> RefinedText:
        prompt = self.prompt_ids(text, params)
        return self.read(self.generate(prompt, params.sampling), len(prompt))

    def read(self, generated: list[int], prompt_tokens: int) -> RefinedText:
        """The text the audio pass reads from refine's generated ids (here or by an engine that refines)."""
        return RefinedText(refined_text(self.model.tokenizer, generated), tuple(generated), prompt_tokens)
