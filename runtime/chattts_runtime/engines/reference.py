"""The PyTorch reference engine: continuous batching over one KV cache, frames streamed out.

One worker thread owns the model. Each iteration it admits waiting requests (up to
``max_num_seqs`` running), prefills each newcomer alone (its first frame comes out of
the prefill), then runs one decode step for every running request together. Rows join
and leave the batch between steps, so a new request waits at most one step plus the
prefills ahead of it. Frames go to the request's asyncio queue as soon as they exist.

Torch releases the GIL inside kernels, so the event loop (HTTP, metrics) stays live
while the worker computes. The request side (waiting queue, streams, aborts, the worker
thread) is ``engines.plumbing``'s, shared with the graph engine.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import numpy as np
import torch

from chattts_runtime.engines.base import (
    Engine, FrameChunk, NullObserver, SchedulerObserver, SynthesisRequest)
from chattts_runtime.engines.kvcache import BatchKVCache
from chattts_runtime.engines.plumbing import RequestPlumbing, check_prompt_fits
from chattts_runtime.engines.schedule import Waiting, plan_admission, take
from chattts_runtime.model.sampling import new_generator, sample_tokens

log = logging.getLogger(__name__)


@dataclass
class _Sequence:
    request: SynthesisRequest
    generator: torch.Generator | None = None
    frames: list[np.ndarray] = field(default_factory=list)
    last_codes: torch.Tensor | None = None  # [num_vq] long, fed at the next step
    position: int = 0  # position id of the next input
    done: bool = False

    @property
    def params(self):
        return self.request.params


class ReferenceEngine(Engine):
    name = "reference"

    def __init__(self, model, *, max_num_seqs: int = 64, max_waiting: int = 256,
                 max_model_len: int = 2048, observer: SchedulerObserver | None = None,
                 next_piece_grace: float = 1.0):
        if next_piece_grace < 0:
            raise ValueError("next_piece_grace must be >= 0")
        self.model = model
        # How long a later piece of a playing response may wait behind others' first-audio work.
        self.next_piece_grace = next_piece_grace
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting
        self.max_model_len = max_model_len
        self.observer = observer or NullObserver()
        sizes = model.sizes.gpt
        self._eos = sizes.audio_eos
        # The waiting queue, streams, aborts and worker thread (shared with the graph engine).
        self.requests = RequestPlumbing(max_waiting=max_waiting, num_vq=sizes.num_vq,
                                        request_id=lambda seq: seq.request.request_id)
        self._running: list[_Sequence] = []
        self._cache = self._new_cache()
        self.steps = 0

    def _new_cache(self, rows: int = 0) -> BatchKVCache:
        g = self.model.sizes.gpt
        return BatchKVCache(g.num_hidden_layers, g.num_key_value_heads, g.head_dim, self.model.gpt.dtype,
                            self.model.device, rows=rows)

    # -- the event-loop side -------------------------------------------------------------

    async def start(self) -> None:
        self.requests.bind_loop()
        self.start_worker()

    def start_worker(self) -> None:
        """Start the worker thread (``start`` does this for the event loop's streams)."""
        self.requests.start_worker(self._worker, f"chattts-{self.name}-engine")

    def stop_worker(self) -> None:
        self.requests.stop_worker()

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_worker)
        self.requests.close_streams()

    @property
    def num_waiting(self) -> int:
        return self.requests.num_waiting

    @property
    def num_running(self) -> int:
        return len(self._running)

    def describe(self) -> dict:
        return {"engine": self.name, "max_num_seqs": self.max_num_seqs, "max_waiting": self.max_waiting,
                "max_model_len": self.max_model_len}

    def submit(self, request: SynthesisRequest) -> AsyncIterator[FrameChunk]:
        return self.requests.submit(request, self.enqueue, self.abort)

    def enqueue(self, request: SynthesisRequest) -> None:
        """Queue a request whose frames go to ``requests.emit`` (``submit`` adds the stream around it)."""
        check_prompt_fits(request, self.max_model_len)
        self.requests.add(_Sequence(request, generator=new_generator(request.params)))

    def abort(self, request_id: str) -> None:
        self.requests.abort(request_id)

    # -- the worker thread ---------------------------------------------------------------

    def _worker(self) -> None:
        with torch.inference_mode():
            while True:
                with self.requests.cond:
                    if not self.requests.wait_for_work(lambda: bool(self._running)):
                        return
                    aborted = self.requests.take_aborted()
                    admitted = self._admit(self.max_num_seqs - len(self._running))
                events: list[tuple[str, FrameChunk]] = []
                try:
                    for seq in self._running:
                        if seq.request.request_id in aborted:
                            seq.done = True
                            events.append((seq.request.request_id, self._final(seq, "aborted")))
                    self._drop_finished()
                    if admitted:
                        self._prefill(admitted, events)
                    self._drop_finished()
                    if self._running:
                        self._decode_step(events)
                        self._drop_finished()
                except Exception as err:  # keep serving: fail what was in flight, start clean
                    log.exception("generation step failed")
                    for seq in self._running + [s for s in admitted if s not in self._running]:
                        if not seq.done:
                            seq.done = True
                            events.append((seq.request.request_id,
                                           FrameChunk(self._empty(), finished=True, finish_reason="error",
                                                      error=str(err))))
                    self._running = []
                    self._cache = self._new_cache()
                if events and not self.requests.emit(events):
                    return

    def _admit(self, free: int) -> list[_Sequence]:
        """Waiting requests for up to ``free`` rows, first-audio work first (``engines.schedule``)."""
        waiting = self.requests.waiting
        if free <= 0 or not waiting:
            return []
        plan = plan_admission([Waiting(s.request.arrival, s.request.stage) for s in waiting], (),
                              free_slots=free, text_room=0, now=time.monotonic(),
                              next_piece_grace=self.next_piece_grace)
        admitted, left = take(list(waiting), plan.audio)
        self.requests.waiting = collections.deque(left)
        return admitted

    def _empty(self) -> np.ndarray:
        return np.zeros((0, self.model.sizes.gpt.num_vq), np.int64)

    def _final(self, seq: _Sequence, reason: str) -> FrameChunk:
        return FrameChunk(self._empty(), None, finished=True, finish_reason=reason)

    def _drop_finished(self) -> None:
        keep = [i for i, s in enumerate(self._running) if not s.done]
        if len(keep) != len(self._running):
            self._cache.keep_rows(keep)
            self._running = [self._running[i] for i in keep]

    def _prefill(self, seqs: list[_Sequence], events: list[tuple[str, FrameChunk]]) -> None:
        """Run the prompts of newly admitted requests together (left-padded), sample their first frames."""
        now = time.monotonic()
        for seq in seqs:
            self.observer.on_scheduled(seq.request, now - seq.request.arrival)
        model = self.model
        dev = model.device
        embeds = [model.gpt.prompt_embeds(s.request.prompt_ids,
                                          torch.from_numpy(s.request.speaker) if s.request.speaker is not None
                                          else None, model.tokenizer.spk_emb_id)[0] for s in seqs]
        embeds = [e if s.request.prompt_codes is None else
                  torch.cat((e, model.gpt.embed.embed_codes(torch.from_numpy(s.request.prompt_codes).to(dev)).to(e.dtype)))
                  for s, e in zip(seqs, embeds)]
        t = max(e.shape[0] for e in embeds)
        batch = torch.zeros(len(seqs), t, embeds[0].shape[-1], dtype=embeds[0].dtype, device=dev)
        valid = torch.zeros(len(seqs), t, dtype=torch.bool, device=dev)
        positions = torch.zeros(len(seqs), t, dtype=torch.long, device=dev)
        for row, e in enumerate(embeds):
            n = e.shape[0]
            batch[row, t - n:] = e
            valid[row, t - n:] = True
            positions[row, t - n:] = torch.arange(n, device=dev)
        cache = self._new_cache(rows=len(seqs))
        padded = None if bool(valid.all()) else valid
        hidden = model.gpt.forward_step(batch, positions, cache, new_valid=padded)[:, -1]
        self.observer.on_step(len(seqs))
        for seq, e in zip(seqs, embeds):
            seq.position = e.shape[0]
        self._running.extend(seqs)
        self._cache.add_rows(cache)
        self._accept_all(seqs, sample_tokens(model.gpt.embed.code_logits(hidden), seqs, self._eos), hidden, events)

    def _decode_step(self, events: list[tuple[str, FrameChunk]]) -> None:
        model = self.model
        seqs = self._running
        codes = torch.stack([s.last_codes for s in seqs]).to(model.device)
        embeds = model.gpt.embed.embed_codes(codes).unsqueeze(1)
        positions = torch.tensor([[s.position] for s in seqs], device=model.device)
        hidden = model.gpt.forward_step(embeds, positions, self._cache)[:, 0]
        self.steps += 1
        self.observer.on_step(len(seqs))
        for seq in seqs:
            seq.position += 1
        self._accept_all(seqs, sample_tokens(model.gpt.embed.code_logits(hidden), seqs, self._eos), hidden, events)

    def _accept_all(self, seqs: list[_Sequence], codes: torch.Tensor, hidden: torch.Tensor,
                    events: list[tuple[str, FrameChunk]]) -> None:
        codes_cpu = codes.cpu()  # one device->host copy per step, not one per row
        ended = (codes_cpu == self._eos).any(dim=1).tolist()
        frames = codes_cpu.numpy().astype(np.int64)
        hidden_cpu = hidden.float().cpu().numpy() if any(s.request.want_hidden for s in seqs) else None
        for row, seq in enumerate(seqs):
            rid = seq.request.request_id
            if ended[row]:
                seq.done = True
                events.append((rid, self._final(seq, "eos")))
                continue
            frame = frames[row]
            seq.frames.append(frame)
            seq.last_codes = codes_cpu[row]
            length_done = (len(seq.frames) >= seq.request.params.max_new_frames
                           or seq.position + 1 > self.max_model_len)
            hid = hidden_cpu[row][None] if seq.request.want_hidden else None
            seq.done = length_done
            events.append((rid, FrameChunk(frame[None], hid, finished=length_done,
                                           finish_reason="length" if length_done else None)))
