"""Per-request frame state inside vLLM's worker process.

vLLM feeds the model token ids only; a ChatTTS step needs the previous frame's four
codes (their embeddings are summed) and the request's sampling settings, speaker
vector and frame history (repetition penalty). This module keeps that state, keyed
by the request, in the worker process:

* the logits processor (``logits.py``), which vLLM tells about every request that
  joins, leaves or moves within the running batch, keeps ``FrameBook.rows`` (batch
  row -> :class:`RequestTrack`) current before each forward pass;
* the model (``model.py``) reads a row's frames to embed its generated positions and
  appends the frame it chooses at each step.

Tracks outlive their batch row: a request preempted by vLLM (KV cache full) is
recomputed later from its token ids, and its frames must still be here then. Rows
that leave the batch are parked in a bounded LRU; a track evicted from it while its
request still waits is reported by name and that request is ended (never fed wrong codes).
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from chattts_runtime.model.gpt import unit_speaker
from chattts_runtime.model.sampling import SamplingParams, new_generator

log = logging.getLogger(__name__)

# Key of the per-request payload in vLLM's SamplingParams.extra_args.
EXTRA_ARGS_KEY = "chattts"
# Finished or preempted tracks kept for a later resume (each holds its frames only).
PARKED_TRACKS = 4096


class TrackError(ValueError):
    pass


@dataclass
class _RequestView:
    """The request's sampling parameters (``model.sampling.sample_tokens`` reads them from the track)."""

    params: SamplingParams


@dataclass(eq=False)
class RequestTrack:
    key: str
    prompt_len: int
    request: _RequestView
    speaker: torch.Tensor | None = None  # float32 [hidden], L2-normalised at the speaker token
    speaker_token_id: int | None = None
    # Refine-text: the text head chooses one text id per step (frames hold [1] ids) and generation
    # ends at end_id; else audio frames of num_vq codes.
    text: bool = False
    end_id: int | None = None
    want_hidden: bool = False  # Decoder path: each step's output row also carries the hidden state
    # A voice sample's codes after the text (upstream's spk_smp): prompt positions from text_len on are
    # frames; their token ids carry codebook 0, these rows every codebook.
    text_len: int | None = None
    sample_codes: np.ndarray | None = None  # int64 [T, num_vq]
    frames: list[np.ndarray] = field(default_factory=list)  # accepted frames, int64 [num_vq] (or [1])
    generator: torch.Generator | None = None
    # Set by the forward pass: this step ends at the frontier, so it produces frames[len(frames)].
    sampling: bool = False
    broken: str | None = None  # why this request can no longer be served correctly

    @property
    def params(self) -> SamplingParams:
        return self.request.params


def request_payload(*, key: str, params: SamplingParams, speaker: np.ndarray | None,
                    speaker_token_id: int | None, text_end_id: int | None = None,
                    want_hidden: bool = False, text_len: int | None = None,
                    sample_codes: np.ndarray | None = None) -> dict[str, Any]:
    """The ``extra_args`` entry the engine attaches to each vLLM request (msgpack-friendly).

    ``text_end_id`` set: a refine-text request (text head, ends at that id); ``want_hidden``:
    an audio request on the Decoder path; ``sample_codes`` ``[T, num_vq]``: a voice sample's
    frames after the prompt's first ``text_len`` (text) positions."""
    return {EXTRA_ARGS_KEY: {
        "text_end_id": text_end_id, "want_hidden": want_hidden,
        "key": key,
        "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
        "repetition_penalty": params.repetition_penalty, "repetition_window": params.repetition_window,
        "max_new_frames": params.max_new_frames, "min_new_frames": params.min_new_frames,
        "seed": params.seed,
        "speaker": None if speaker is None else [float(v) for v in np.asarray(speaker, np.float32)],
        "speaker_token_id": speaker_token_id,
        "text_len": text_len,
        "sample_codes": None if sample_codes is None else np.asarray(sample_codes, np.int64).tolist(),
    }}


def parse_payload(extra_args: dict[str, Any] | None) -> dict[str, Any]:
    payload = (extra_args or {}).get(EXTRA_ARGS_KEY)
    if not isinstance(payload, dict) or not isinstance(payload.get("key"), str):
        raise TrackError(f"ChatTTS requests need SamplingParams.extra_args[{EXTRA_ARGS_KEY!r}] "
                         f"with a 'key' (use chattts_runtime.engines.vllm_engine)")
    return payload


def new_track(payload: dict[str, Any], prompt_len: int) -> RequestTrack:
    params = SamplingParams(
        temperature=_temperature(payload["temperature"]), top_p=float(payload["top_p"]), top_k=int(payload["top_k"]),
        repetition_penalty=float(payload["repetition_penalty"]),
        repetition_window=int(payload["repetition_window"]),
        max_new_frames=int(payload["max_new_frames"]), min_new_frames=int(payload["min_new_frames"]),
        seed=payload.get("seed"))
    speaker = None
    if payload.get("speaker") is not None:
        # As the reference model does at the [spk_emb] position.
        speaker = unit_speaker(torch.tensor(payload["speaker"], dtype=torch.float32))
    end_id = payload.get("text_end_id")
    track = RequestTrack(key=payload["key"], prompt_len=prompt_len, request=_RequestView(params),
                         speaker=speaker, speaker_token_id=payload.get("speaker_token_id"),
                         text=end_id is not None, end_id=None if end_id is None else int(end_id),
                         want_hidden=bool(payload.get("want_hidden")))
    if payload.get("sample_codes") is not None:
        track.text_len = int(payload["text_len"])
        track.sample_codes = np.asarray(payload["sample_codes"], np.int64)
    # Same seeding as the reference engine, so a seeded request samples the same codes.
    track.generator = new_generator(params)
    return track


def _temperature(value: Any) -> float | tuple[float, ...]:
    """One temperature, or one per codebook (msgpack turns the tuple into a list)."""
    return tuple(float(t) for t in value) if isinstance(value, (list, tuple)) else float(value)


class FrameBook:
    """Tracks by request key, and the current batch rows (maintained by the logits processor)."""

    def __init__(self, parked_capacity: int = PARKED_TRACKS):
        self.active: dict[str, RequestTrack] = {}
        self.parked: OrderedDict[str, RequestTrack] = OrderedDict()
        self.parked_capacity = parked_capacity
        self.rows: list[RequestTrack | None] = []

    def _row(self, index: int) -> RequestTrack | None:
        return self.rows[index] if index < len(self.rows) else None

    def _set_row(self, index: int, track: RequestTrack | None) -> None:
        if index >= len(self.rows):
            self.rows.extend([None] * (index + 1 - len(self.rows)))
        self.rows[index] = track

    def add(self, index: int, extra_args: dict[str, Any] | None, prompt_len: int) -> RequestTrack:
        payload = parse_payload(extra_args)
        key = payload["key"]
        track = self.active.get(key) or self.parked.pop(key, None)
        if track is None:
            track = new_track(payload, prompt_len)
        self.active[key] = track
        self._set_row(index, track)
        return track

    def remove(self, index: int) -> None:
        track = self._row(index)
        if track is None:
            return
        self._set_row(index, None)
        if not any(t is track for t in self.rows):  # not also sitting at another index mid-update
            self.active.pop(track.key, None)
            self.parked[track.key] = track
            while len(self.parked) > self.parked_capacity:
                self.parked.popitem(last=False)

    def move(self, src: int, dst: int, swap: bool) -> None:
        a, b = self._row(src), self._row(dst)
        self._set_row(dst, a)
        self._set_row(src, b if swap else None)

    def resize(self, batch_size: int) -> None:
        del self.rows[batch_size:]


_BOOK: FrameBook | None = None


def frame_book() -> FrameBook:
    """The worker process's book (one engine per process; each TP rank has its own)."""
    global _BOOK
    if _BOOK is None:
        _BOOK = FrameBook()
    return _BOOK
