"""The logits processor that tells the ChatTTS model which request sits in which batch row.

vLLM's model ``forward`` sees token ids and positions only. Logits processors are the
supported place where vLLM reports, before every forward pass, which requests joined,
left or moved within the persistent batch, with their ``SamplingParams``. This one keeps
:class:`~chattts_runtime.vllm_plugin.frames.FrameBook` in step with that batch; it does
not change logits (the model already writes the chosen frame into them).

Importing this module also registers the model architecture, so a worker process that
loads the processor knows the model even where the package's entry point is missing.
"""
from __future__ import annotations

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from chattts_runtime.vllm_plugin import register
from chattts_runtime.vllm_plugin.frames import TrackError, frame_book, parse_payload

register()


class ChatTTSBatchTracker(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        # Runs in the front end: a request without our payload fails with a clear 400.
        try:
            parse_payload(sampling_params.extra_args)
        except TrackError as err:
            raise ValueError(str(err)) from None

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.book = frame_book()

    def is_argmax_invariant(self) -> bool:
        return True  # never changes logits; vLLM still calls update_state every step

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        book = self.book
        for index in batch_update.removed:
            book.remove(index)
        for index, params, prompt_ids, _output_ids in batch_update.added:
            book.remove(index)  # an added request may replace one at the same index
            book.add(index, params.extra_args if params is not None else None,
                     len(prompt_ids) if prompt_ids is not None else 0)
        for src, dst, direction in batch_update.moved:
            book.move(src, dst, swap=direction == MoveDirectionality.SWAP)
        book.resize(batch_update.batch_size)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
