"""The graph engine: a static slot KV cache, CUDA graphs for every step, audio decoded in the loop.

Why: the reference engine is host-bound on a GPU (hundreds of small launches per step,
a KV cache that is re-packed whenever a request joins or leaves, per-row Python
sampling). Here every running request owns a *slot*: a fixed row of a preallocated KV
cache ``[slots, kv_heads, max_model_len, head_dim]`` plus per-slot sampling state and
frame history on the device. Three kinds of work are captured once and replayed:

* a decode step for slots ``[0, batch bucket)`` over KV columns ``[0, length bucket)``,
  with sampling of the 4 code heads (temperature, repetition penalty, top-k, top-p,
  min-frames, uniforms from a counter hash) inside the graph; sampled codes are written
  straight back into the next step's input buffer. Refine-text jobs are slots too: a step
  "mixed" with them embeds their text tokens and samples the text head for those rows
  (upstream's refine pass, same trunk, same launch); from 128 rows the step attends with
  the ragged kernel of :mod:`~chattts_runtime.engines.attention`;
* a prefill of up to ``prefill_rows`` newcomers (prompt embedding with the speaker
  vector and any voice-sample codes after the text, sampling parameters loaded into their
  slots, first frame sampled), per (newcomer bucket, prompt-length bucket); one
  host->device copy feeds it (a second one only when a newcomer carries a voice sample);
* for ``want_audio`` streams, the DVAE + Vocos decode of audio windows gathered from the
  slots' frame history, per (window bucket, window length), on a second CUDA stream so
  it overlaps the GPT steps.

The host loop launches step ``t+1`` before it reads step ``t``'s codes (one step of
lag) and handles those codes with array operations over all slots; Python runs per
request only when a chunk is due or a request ends. Free slots inside the batch range
compute rows nobody reads (their writes stay in their own slot and are overwritten by
the next prefill); one extra *scratch* slot absorbs the padding rows of prefills.

Frames or audio reach a stream in chunks: frames every ``emit_frames``; audio on the
schedule of :class:`~chattts_runtime.audio_io.StreamWindows`, which the speech API's own
decoder follows too, so both give the same samples. Measured on an H200:
bench/results/runtime-h200-*-summary.md.

On CPU the same code runs eagerly (no capture, no second stream): the equality tests
against the reference engine (greedy, float32) exercise exactly the slot, cache,
prefill, sampling and windowing logic served on the GPU. Greedy output equals the
reference engine's; sampled output is reproducible per seed here but uses other random
draws than the reference (a device-side hash instead of a CPU generator per request).

On CUDA a decode step's trunk runs through ``engines.fused`` (9 launches a layer instead of ~44:
the step was bound by its launches). The rows that stand before a response's first audio (refine
rows, first-piece voice passes) get *first-audio substeps*: after a full step, up to
``first_audio_substeps`` more steps over those rows alone, gathered from wherever their slots sit
(the ragged attention reads their columns in place), as many as keep full steps, which every
playing stream rides, at ``playing_realtime`` times real time.

Where the parts live: the device buffers and the captured steps in ``engines.graph_steps``;
the host-side decisions (which slot a newcomer takes, which slots the next step covers at
which buckets, what a step's output means per slot) in the pure ``engines.slots``, with
``engines.schedule`` deciding which waiting work starts; the request side (queue, streams,
aborts, worker thread) in ``engines.plumbing``, as the reference engine's. This module is
the worker loop that ties them together, plus graph capture and the audio windows' launches.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from chattts_runtime.audio_io import StreamWindows, unsent_samples
from chattts_runtime.engines.base import (
    Engine, EngineError, FrameChunk, NullObserver, SchedulerObserver, SynthesisRequest, TextJobs)
from chattts_runtime.engines.graph_steps import (
    MAX_REPETITION_WINDOW, PF_META, SlotState, decode_step, decode_windows, pack_prefill,
    prefill_step)
from chattts_runtime.engines.plumbing import RequestPlumbing, check_prompt_fits
from chattts_runtime.engines.schedule import Stage, Waiting, plan_admission, take
from chattts_runtime.engines.slots import (
    STAGE_NAMES, FrameBook, LoopStats, RefineBook, SlotTable, SubstepPace, TextJob, WindowHold, bucket_sizes,
    gather_open, pick_bucket, substep_batch, text_widths_for)
from chattts_runtime.model.config import SAMPLE_RATE
from chattts_runtime.model.refine import REFINE_END
from chattts_runtime.model.sampling import SamplingParams, new_generator

log = logging.getLogger(__name__)

_STAGE_INDEX = {name: i for i, name in enumerate(STAGE_NAMES)}


@dataclass
class _Slotted:
    """An audio request, waiting (``slot`` -1) or in its slot."""

    request: SynthesisRequest
    generator: torch.Generator | None = None  # its seed (counter_uniforms), when it samples
    position: int = 0  # position id of its next input
    done: bool = False
    slot: int = -1
    sent: int = 0  # frames handed out (frames path) or whose audio was sent (audio path)
    codes_sent: int = 0  # audio path: frames whose codes were handed out (the audio lags by the lookahead)
    samples_sent: int = 0  # audio path: samples handed out
    hidden: list[np.ndarray] = field(default_factory=list)  # want_hidden rows not handed out yet
    aborted: bool = False
    pending_window: "_Window | None" = None  # due this iteration, not launched yet
    held: int = 0  # its windows waiting in the engine's WindowHold
    first_audio_at: float | None = None  # when its first samples were handed out (monotonic)


@dataclass
class _Output:
    """Codes of one launched step or prefill on their way to the host."""

    slots: np.ndarray  # slot of each row read
    epochs: np.ndarray  # the slots' epochs at launch: a slot reused since then is skipped
    rows: np.ndarray  # row of each slot in ``codes``
    codes: torch.Tensor
    hidden: torch.Tensor | None
    ready: object = None  # a CUDA event, or None on CPU

    def fetch(self) -> tuple[np.ndarray, np.ndarray | None]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.codes.numpy(), (self.hidden.float().numpy() if self.hidden is not None else None)


@dataclass
class _Window:
    """One stream's audio window: frames ``[start, end)``; ``final`` ends the stream after it."""

    seq: _Slotted
    start: int
    end: int
    codes: np.ndarray  # the frames new in this window (handed out with its audio)
    final: str | None = None
    sent_before: int = 0  # the stream's frames whose audio was sent before this window
    through: int = 0  # its audio is sent up to this frame (the windows' lookahead before its end)
    codes_before: int = 0  # the stream's frames whose codes were handed out before this window
    due_at: float = 0.0  # time.monotonic() when a step made it due (its audio's lag is counted from there)


@dataclass
class _AudioBatch:
    """Windows of one length decoded together (or only end-of-stream markers), in launch order."""

    windows: list[_Window]
    audio: torch.Tensor | None = None  # [rows, samples] on the host once ``ready``
    ready: object = None

    def done(self, block: bool) -> bool:
        if self.ready is None:
            return True
        if block:
            self.ready.synchronize()
            return True
        return self.ready.query()


class GraphEngine(Engine):
    """Continuous batching over static slots with graph-replayed steps (see the module docstring).

    The request side (submit, abort, streams, the worker thread) is ``engines.plumbing``'s, as the
    reference engine's is.
    """

    name = "graph"
    decodes_audio = True
    refines_text = True

    def __init__(self, model, *, max_num_seqs: int = 64, max_waiting: int = 256, max_model_len: int = 2048,
                 observer: SchedulerObserver | None = None, emit_frames: int = 4, use_graphs: bool | None = None,
                 gil_switch_interval: float | None = 0.001, admit_interval: float | None = None,
                 windows: StreamWindows | None = None, prefill_rows: int = 32, prefill_max_len: int = 512,
                 audio_rows: int = 64, pad_shapes: bool | None = None, decode_attention: str = "auto",
                 refine_rows: int = 64, next_piece_grace: float = 1.0, stats_interval: float | None = 10.0,
                 decode_kernels: str = "auto", first_audio_substeps: int = 4, playing_realtime: float = 3.0,
                 audio_batch_rows: int = 16, audio_hold: float = 0.03, audio_min_lead: float = 0.3,
                 decode_priority: str = "high"):
        if next_piece_grace < 0:
            raise ValueError("next_piece_grace must be >= 0")
        # Every stats_interval seconds of work, one log line of where the rows and the worker's time went
        # (engines.slots.LoopStats); None: never.
        self.stats_interval = stats_interval
        self._stats = LoopStats()
        # First-audio substeps: refine rows and voice passes are stepped again, gathered from their slots,
        # between full steps, as often as keeps full steps at playing_realtime x real time
        # (engines.slots.SubstepPace).
        self._pace = SubstepPace(first_audio_substeps, playing_realtime, SAMPLE_RATE / model.sizes.samples_per_frame)
        self.model = model
        # How long a later piece of a playing response may wait behind others' first-audio work.
        self.next_piece_grace = next_piece_grace
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting
        self.max_model_len = max_model_len
        self.observer = observer or NullObserver()
        self._eos = model.sizes.gpt.audio_eos
        self.requests = RequestPlumbing(max_waiting=max_waiting, num_vq=model.sizes.gpt.num_vq,
                                        request_id=lambda seq: seq.request.request_id)
        self.steps = self.substeps = 0  # decode steps launched (substeps: first-audio substeps among them)
        if emit_frames < 1:
            raise ValueError("emit_frames must be >= 1")
        if prefill_rows < 1 or audio_rows < 1:
            raise ValueError("prefill_rows and audio_rows must be >= 1")
        self.emit_frames = emit_frames
        self.windows = windows or StreamWindows()
        # The loop thread shares the GIL with the event loop; at the default 5 ms switch interval
        # a step that is ready waits up to a whole GPU step or more for the GIL. None leaves the
        # interpreter's setting alone (it is process-wide).
        self.gil_switch_interval = gil_switch_interval
        self.cuda = model.device.type == "cuda"
        self.use_graphs = self.cuda if use_graphs is None else use_graphs
        if self.use_graphs and not self.cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        # Prefills and audio windows padded to the captured shapes (scratch-slot rows, padded prompts).
        # Always with graphs; on CPU optional, so tests run the exact shapes the GPU replays.
        self.pad_shapes = self.use_graphs if pad_shapes is None else pad_shapes
        # While others decode, newcomers are gathered for up to admit_interval seconds and prefilled
        # together (each prefill is one more graph on the GPU's critical path); an idle engine
        # admits at once. Default: 20 ms on CUDA, 0 on CPU.
        self.admit_interval = (0.02 if self.cuda else 0.0) if admit_interval is None else admit_interval
        if self.admit_interval < 0:
            raise ValueError("admit_interval must be >= 0")
        # Past 64 rows, buckets every 32: a step over 160 slots should not pay for 256.
        self.batch_buckets = bucket_sizes(max_num_seqs, step=32)
        # KV lengths: doubling up to 512, then every 256 (a batch at 1,100 positions should not attend
        # over 2,048; long requests make attention the larger part of a step).
        self.length_buckets = bucket_sizes(max_model_len, smallest=min(128, max_model_len), step=256)
        self.prefill_rows = min(prefill_rows, max_num_seqs)
        self.prefill_row_buckets = bucket_sizes(self.prefill_rows)
        # Longer prompts are prefilled eagerly (same code, exact shape).
        self.prefill_length_buckets = bucket_sizes(min(prefill_max_len, max_model_len),
                                                   smallest=min(32, max_model_len))
        self.audio_rows = audio_rows
        self.audio_row_buckets = bucket_sizes(audio_rows)
        # Windows of streams whose listeners are audio_min_lead seconds ahead wait up to audio_hold seconds
        # for others of their shape, up to audio_batch_rows in a launch (engines.slots.WindowHold).
        self._hold = WindowHold(min(audio_batch_rows, audio_rows), audio_hold, audio_min_lead)
        # On CUDA the worker's launches (steps, prefills) go to a stream of the device's highest priority, the
        # audio windows to one of the lowest: when both have blocks waiting, the SMs take the decode step's
        # first (the audio has its listener's lead to spare). normal: both at the default priority.
        if decode_priority not in ("high", "normal"):
            raise ValueError(f"decode_priority must be high or normal, not {decode_priority!r}")
        self.decode_priority = decode_priority
        self.audio_lengths = [n for n in self.windows.regular_shapes() if n <= max_model_len]
        # The Decoder path (hidden states -> audio) in the loop too, when the checkpoint has a Decoder.
        self.hidden_audio = getattr(model, "decoder", None) is not None
        self.audio_paths = (False, True) if self.hidden_audio else (False,)
        # Refine-text jobs take slots of the same cache (max_num_seqs counts both kinds) and step in the
        # same launch as the audio rows (SlotState); at most refine_rows of them at once.
        if refine_rows < 1:
            raise ValueError("refine_rows must be >= 1")
        self.refine_rows = min(refine_rows, max_num_seqs)
        # The text head of a mixed step reads 8, 16, ... refine_rows entries of its index, the fewest that
        # hold the refine rows: sampling a 21k-token vocabulary for 64 rows when 5 ride costs ~0.5 ms a step.
        self.text_widths = bucket_sizes(self.refine_rows, smallest=min(8, self.refine_rows))
        self._refine = RefineBook()
        self._refine_end = model.tokenizer.token_id(REFINE_END)  # None: no refine-text on this checkpoint
        self._text_jobs = TextJobs()
        self.ragged_from = self._ragged_threshold(decode_attention)  # smallest batch bucket on the ragged kernel, or None
        self.decode_kernels = decode_kernels
        self.fused_decode = self._fused_choice(decode_kernels)  # decode steps through engines.fused's kernels
        self._state: SlotState | None = None
        # A substep is at most half as wide as the full step it follows (engines.slots.substep_batch).
        self.substep_buckets = [b for b in self.batch_buckets if 2 * b <= max_num_seqs] if first_audio_substeps else []
        # Decode graphs per (batch, length, text width: 0 without refine rows, gathered: a first-audio substep);
        # prefills per (rows, length, text).
        self._graphs: dict[tuple[int, int, int, bool], torch.cuda.CUDAGraph] = {}
        self._prefill_graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self._audio_graphs: dict[tuple[bool, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._audio_stream = None
        self._speaker_token = getattr(model.tokenizer, "spk_emb_id", None)
        self._samples_per_frame = model.sizes.samples_per_frame
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self.capture_seconds = 0.0
        # Host side of the slots (engines.slots; index = slot, the last one is the scratch slot).
        self._running: dict[int, _Slotted] = {}
        self._slots = SlotTable(max_num_seqs)
        self._frames = FrameBook(max_num_seqs, max_model_len, model.sizes.gpt.num_vq)
        self._stage_of = np.zeros(max_num_seqs + 1, np.int64)  # each audio slot's Stage, as STAGE_NAMES' index
        self._audio_fifo: collections.deque[_AudioBatch] = collections.deque()

    def _ragged_threshold(self, choice: str) -> int | None:
        """``decode_attention`` -> the smallest batch bucket stepped with the ragged Triton kernel (None: none).
        ragged: every batch; padded: none (masked SDPA over the bucket); auto: on CUDA with Triton, from
        ``attention.MIN_RAGGED_BATCH`` rows (below it SDPA is as fast, bench/results/attention-sweep-*)."""
        from chattts_runtime.engines import attention  # noqa: PLC0415

        if choice == "padded":
            return None
        if choice == "ragged":
            if not self.cuda or not attention.available():
                raise ValueError("decode_attention: ragged needs a CUDA device and Triton")
            return 1
        if choice != "auto":
            raise ValueError(f"decode_attention must be auto, ragged or padded, not {choice!r}")
        return attention.MIN_RAGGED_BATCH if self.cuda and attention.available() else None

    def _fused_choice(self, choice: str) -> bool:
        """``decode_kernels`` -> whether decode steps run ``engines.fused``'s trunk. fused: always (a CUDA
        device and Triton, or Triton's interpreter on CPU: the tests); modules: the Llama modules as the
        prefill runs them; auto: fused on CUDA with Triton when the checkpoint's body allows it."""
        from chattts_runtime.engines import attention, fused  # noqa: PLC0415

        if choice == "modules":
            return False
        if choice not in ("auto", "fused"):
            raise ValueError(f"decode_kernels must be auto, fused or modules, not {choice!r}")
        usable = self.cuda and attention.available()
        reason = fused.fusable(self.model.gpt.llama)
        if choice == "auto":
            return usable and reason is None
        if not (usable or (fused.interpreted() and attention.available())):
            raise ValueError("decode_kernels: fused needs a CUDA device and Triton")
        if reason is not None:
            raise ValueError(f"decode_kernels: fused cannot run this checkpoint: {reason}")
        return True

    def _ragged(self, batch: int, gathered: bool = False) -> bool:
        """Whether a step attends with the ragged kernel: from ``ragged_from`` rows, and at every size for a
        gathered step (it reads its rows' columns in place, where the masked path would copy them)."""
        return self.ragged_from is not None and (gathered or batch >= self.ragged_from)

    def describe(self) -> dict:
        return {"engine": self.name, "max_num_seqs": self.max_num_seqs, "max_waiting": self.max_waiting,
                "max_model_len": self.max_model_len, "cuda_graphs": self.use_graphs,
                "graphs": len(self._graphs) + len(self._prefill_graphs) + len(self._audio_graphs),
                "decode_graphs": len(self._graphs), "prefill_graphs": len(self._prefill_graphs),
                "audio_graphs": len(self._audio_graphs),
                "refine_graphs": sum(k[2] > 0 for k in self._graphs) + sum(k[2] for k in self._prefill_graphs),
                "substep_graphs": sum(k[3] for k in self._graphs),
                "decode_attention": ("padded" if self.ragged_from is None
                                     else f"ragged from {self.ragged_from} rows"), "refine_rows": self.refine_rows,
                "decode_kernels": "fused" if self.fused_decode else "modules",
                "first_audio_substeps": self._pace.most,
                "audio_batch_rows": self._hold.rows, "decode_priority": self.decode_priority, "audio_hold_ms": round(self._hold.hold * 1000, 1),
                "audio_decoders": ["dvae", "decoder"] if self.hidden_audio else ["dvae"],
                "emit_frames": self.emit_frames,
                "capture_seconds": round(self.capture_seconds, 2)}

    @property
    def num_running(self) -> int:
        return len(self._running)

    def submit(self, request: SynthesisRequest):
        if request.params.uniform_temperature is None:
            raise EngineError("the graph engine samples every codebook at one temperature; "
                              "per-codebook temperatures need the reference engine")
        if request.params.repetition_window > MAX_REPETITION_WINDOW:
            raise EngineError(f"repetition_window {request.params.repetition_window} exceeds "
                              f"{MAX_REPETITION_WINDOW} (graph engine)")
        if request.want_audio and request.want_hidden and not self.hidden_audio:
            raise EngineError("want_audio with want_hidden decodes hidden states, and this checkpoint has no Decoder")
        return self.requests.submit(request, self.enqueue, self.abort)

    def enqueue(self, request: SynthesisRequest) -> None:
        """Queue a request whose chunks go to ``requests.emit`` (``submit`` adds the stream around it)."""
        check_prompt_fits(request, self.max_model_len)
        self.requests.add(_Slotted(request, generator=new_generator(request.params)))

    def abort(self, request_id: str) -> None:
        self.requests.abort(request_id)

    @property
    def num_waiting(self) -> int:
        return self.requests.num_waiting

    async def start(self) -> None:
        self.requests.bind_loop()
        await asyncio.to_thread(self.start_worker)

    def stop_worker(self) -> None:
        self.requests.stop_worker()

    def start_worker(self) -> None:
        """Start the worker and wait until its graphs are captured (raises what set-up raised)."""
        if self.gil_switch_interval is not None and self.cuda:
            import sys  # noqa: PLC0415

            sys.setswitchinterval(min(sys.getswitchinterval(), self.gil_switch_interval))
        self.requests.start_worker(self._worker, f"chattts-{self.name}-engine")
        self._ready.wait()
        if self._start_error is not None:
            raise EngineError(f"graph engine failed to start: {self._start_error}") from self._start_error

    # -- set-up (worker thread) --------------------------------------------------------------

    def _setup(self) -> None:
        self.model.gpt.embed.fuse_weight_norm()  # no re-normalisation inside the graphs
        self._state = SlotState(self.model.gpt, self.max_num_seqs, self.max_model_len, self.model.device,
                                self.prefill_rows, self.audio_rows, hidden_audio=self.hidden_audio,
                                text_rows=self.refine_rows)
        if self.fused_decode:
            self._fuse_trunk()
        self._probe_substeps()
        if self.cuda:
            self._audio_stream = torch.cuda.Stream(device=self.model.device)
        if self.use_graphs:
            began = time.monotonic()
            self._capture_all()
            self.capture_seconds = time.monotonic() - began
            log.info("captured %d decode, %d prefill and %d audio graphs in %.1f s (decode attention: %s; "
                     "decode kernels: %s)", len(self._graphs), len(self._prefill_graphs), len(self._audio_graphs),
                     self.capture_seconds, self.describe()["decode_attention"], self.describe()["decode_kernels"])
        self._state.reset_sampling()

    def _fuse_trunk(self) -> None:
        """Decode steps through ``engines.fused``: one eager step builds its kernels before any capture. Under
        ``auto`` a failure there (a Triton that cannot build them) leaves the modules, with the error logged."""
        from chattts_runtime.engines.fused import fuse_trunk  # noqa: PLC0415  (Triton)

        state = self._state
        try:
            state.trunk = fuse_trunk(self.model.gpt)
            decode_step(self.model.gpt, state, 1, self.length_buckets[0], self._eos)  # slot 0; reset after set-up
        except Exception:
            if self.decode_kernels == "fused":
                raise
            log.exception("the fused decode kernels failed to run: decode steps run the modules")
            state.trunk = None
            self.fused_decode = False

    def _probe_substeps(self) -> None:
        """One eager gathered step (on the scratch slot) before any capture: first-audio substeps need the decode
        kernels to index the cache by each row's slot. Should that fail, the engine serves without substeps,
        with the error logged and ``describe()`` saying 0 of them, rather than not at all."""
        if not self._pace.most:
            return
        try:
            decode_step(self.model.gpt, self._state, 1, self.length_buckets[0], self._eos, None, self._ragged(1, True),
                        None, gathered=True)
        except Exception:
            log.exception("a gathered decode step failed to run: first-audio substeps are off")
            self._pace.most = 0
            self.substep_buckets = []

    def _capture(self, stream, pool, fn):
        """Warm ``fn`` up on ``stream`` (kernels chosen, workspaces made), then capture it there."""
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            out = fn()
        return graph, out

    def _capture_all(self) -> None:
        gpt, state, eos = self.model.gpt, self._state, self._eos
        # GPT graphs run one at a time on the main stream and share a pool; audio graphs run
        # concurrently with them on their own stream, so they get a pool of their own.
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device=self.model.device)
        state.park_prefill_rows()  # capture with every row on the scratch slot
        end = self._refine_end
        kinds = (False, True) if end is not None else (False,)  # audio only; with refine-text rows
        # Largest first, so smaller graphs reuse the shared pool's blocks.
        steps = [(batch, False) for batch in self.batch_buckets] + [(batch, True) for batch in self.substep_buckets]
        for batch, gathered in sorted(steps, reverse=True):
            widths = [0, *text_widths_for(self.text_widths, batch)] if end is not None else [0]
            for length in reversed(self.length_buckets):
                for width in reversed(widths):
                    self._graphs[(batch, length, width, gathered)], _ = self._capture(side, pool, lambda: decode_step(
                        gpt, state, batch, length, eos, end if width else None, self._ragged(batch, gathered),
                        width or None, gathered))
        for rows in reversed(self.prefill_row_buckets):
            for length in reversed(self.prefill_length_buckets):
                for text in kinds:
                    self._prefill_graphs[(rows, length, text)], _ = self._capture(side, pool, lambda: prefill_step(
                        gpt, state, rows, length, eos, self._speaker_token, end if text else None))
        audio_pool = torch.cuda.graph_pool_handle()
        try:
            for hidden in self.audio_paths:
                for rows in reversed(self.audio_row_buckets):
                    for frames in reversed(self.audio_lengths):
                        self._audio_graphs[(hidden, rows, frames)] = self._capture(
                            self._audio_stream, audio_pool,
                            lambda: decode_windows(self.model, state, rows, frames, hidden))
        except RuntimeError:  # an audio model that cannot be captured still serves, eagerly
            log.exception("audio decode could not be captured; audio windows run eagerly")
            self._audio_graphs.clear()
        torch.cuda.synchronize()

    # -- the worker thread -------------------------------------------------------------------

    def _worker(self) -> None:
        with torch.inference_mode(), self._worker_stream():
            try:
                self._setup()
            except BaseException as err:  # noqa: BLE001  (reported to start())
                log.exception("graph engine set-up failed")
                self._start_error = err
                self._ready.set()
                return
            self._ready.set()
            # Launched steps and prefills not read yet: (is refine-text, output).
            in_flight: list[tuple[bool, _Output]] = []
            refine = self._refine
            while True:
                with self.requests.cond:
                    asleep = time.monotonic()
                    if not self.requests.wait_for_work(lambda: bool(
                            self._running or in_flight or self._audio_fifo or self._hold or refine.waiting
                            or refine.running)):
                        return
                    self._stats.slept(time.monotonic() - asleep)
                    aborted = self.requests.take_aborted()
                    if aborted:
                        refine.waiting = type(refine.waiting)(j for j in refine.waiting if j.job_id not in aborted)
                    admitted, text_admitted = self._admit()
                events: list[tuple[str, FrameChunk]] = []
                windows: list[_Window] = []
                try:
                    for seq in list(self._running.values()):
                        if seq.request.request_id in aborted:
                            self._finish(seq, "aborted", events, windows)
                    for job in list(refine.running.values()):
                        if job.job_id in aborted:
                            self._end_text(job, "aborted")
                    launched: list[tuple[bool, _Output]] = []
                    for first in range(0, len(text_admitted), self.prefill_rows):
                        launched.append((True, self._prefill_text(text_admitted[first:first + self.prefill_rows])))
                    for first in range(0, len(admitted), self.prefill_rows):
                        launched.append((False, self._prefill(admitted[first:first + self.prefill_rows])))
                    if self._running or refine.running:
                        launched.extend(self._launch_steps())
                    else:
                        self._pace.idle()
                    # Read the previous iteration's codes while the GPU runs this one.
                    for text, out in in_flight:
                        self._accept_text(out) if text else self._accept(out, events, windows)
                    in_flight = launched
                    if not self._running and not refine.running:  # nothing left to launch: take it all now
                        for text, out in in_flight:
                            self._accept_text(out) if text else self._accept(out, events, windows)
                        in_flight = []
                    idle = not self._running and not in_flight and not refine.running
                    self._launch_audio(windows, idle)
                    while self._audio_fifo and self._audio_fifo[0].done(block=idle):
                        self._hand_out_audio(self._audio_fifo.popleft(), events)
                except Exception as err:  # keep serving: fail what was in flight, start clean
                    log.exception("generation step failed")
                    self._fail_all(err, admitted, windows, events, text_admitted)
                    in_flight = []
                if events and not self.requests.emit(events):
                    return
                self._maybe_report()

    def _worker_stream(self):
        """The stream every launch of the worker goes to (``decode_priority``)."""
        if not self.cuda or self.decode_priority == "normal":
            return contextlib.nullcontext()
        _, highest = torch.cuda.Stream.priority_range()
        return torch.cuda.stream(torch.cuda.Stream(device=self.model.device, priority=highest))

    def _maybe_report(self) -> None:
        stats = self._stats
        if self.stats_interval is None or time.monotonic() - stats.began < self.stats_interval:
            return
        if not stats.steps and not stats.prefills:
            stats.reset()  # idle: nothing to say, and the next report covers only work
            return
        log.info("engine loop: %s", json.dumps(stats.report(), separators=(",", ":")))

    def _empty(self) -> np.ndarray:
        return np.zeros((0, self.model.sizes.gpt.num_vq), np.int64)

    def _fail_all(self, err: Exception, admitted: list, windows: list[_Window],
                  events: list[tuple[str, FrameChunk]], text_admitted: list[TextJob]) -> None:
        """Every request not finished from its stream's point of view ends with the error."""
        for job in {j.job_id: j for j in [*self._refine.running.values(), *text_admitted]}.values():
            self._text_result(job.job_id, None, str(err))
        self._refine.reset()
        seqs = list(self._running.values()) + admitted + [w.seq for w in windows]
        seqs += [w.seq for batch in self._audio_fifo for w in batch.windows]
        seqs += [w.seq for w in self._hold.clear()]
        told = set()
        for seq in seqs:
            rid = seq.request.request_id
            if rid in told or getattr(seq, "aborted", False):
                continue
            told.add(rid)
            seq.done = True
            events.append((rid, FrameChunk(self._empty(), finished=True, finish_reason="error", error=str(err))))
        self._running = {}
        self._audio_fifo.clear()
        self._slots.reset()

    def _admit(self) -> tuple[list[_Slotted], list[TextJob]]:
        """The waiting audio requests and refine-text jobs to start now (``engines.schedule``: first-audio
        work first, later pieces of playing responses after it within their grace); called under the lock."""
        refine, waiting = self._refine, self.requests.waiting
        if not self._slots.free or not (waiting or refine.waiting):
            return [], []
        plan = plan_admission([Waiting(s.request.arrival, s.request.stage) for s in waiting],
                              [j.arrival for j in refine.waiting], free_slots=self._slots.free,
                              text_room=self.refine_rows - len(refine.running), now=time.monotonic(),
                              next_piece_grace=self.next_piece_grace, audio_open=self._admit_now())
        admitted: list[_Slotted] = []
        text_admitted: list[TextJob] = []
        if plan.audio:
            admitted, left = take(list(waiting), plan.audio)
            self.requests.waiting = collections.deque(left)
        if plan.text:
            text_admitted, left = take(list(refine.waiting), plan.text)
            refine.waiting = collections.deque(left)
        return admitted, text_admitted

    def _admit_now(self) -> bool:
        waiting = self.requests.waiting
        return gather_open(len(waiting), waiting[0].request.arrival if waiting else None,
                           streaming=bool(self._running), prefill_rows=self.prefill_rows,
                           admit_interval=self.admit_interval, now=time.monotonic())

    def _to_host(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is None:
            return None
        if not self.cuda:
            return tensor.clone()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        return host

    def _event(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def _to_device(self, dst: torch.Tensor, src: np.ndarray) -> None:
        host = torch.from_numpy(src)
        if self.cuda:
            host = host.pin_memory()
        dst.copy_(host, non_blocking=self.cuda)

    # -- prefill -------------------------------------------------------------------------------

    def _urgent_slots(self) -> np.ndarray:
        """The slots a first-audio substep steps: refine rows and first-piece voice passes."""
        return self._slots.text | (self._slots.audio & (self._stage_of == _STAGE_INDEX["voice"]))

    def _prefill(self, slotted: list[_Slotted]) -> _Output:
        now = time.monotonic()
        state = self._state
        for seq in slotted:
            self.observer.on_scheduled(seq.request, now - seq.request.arrival)
            seq.slot = self._slots.claim()
            self._stage_of[seq.slot] = _STAGE_INDEX[Stage(seq.request.stage).value]
        n = len(slotted)
        rows, length = self._prefill_shape(n, max(s.request.prompt_length for s in slotted))
        meta, floats, sample_codes = pack_prefill(rows, length, self.model.sizes.gpt.hidden_size, state.scratch, [
            (s.slot, s.request.prompt_ids, s.request.params,
             s.generator.initial_seed() if s.generator is not None else 0, s.request.speaker,
             s.request.prompt_codes) for s in slotted], num_vq=self.model.sizes.gpt.num_vq)
        for seq in slotted:
            seq.position = seq.request.prompt_length
        self._run_prefill(rows, length, meta, floats, text=False, sample_codes=sample_codes)
        self.observer.on_step(n)
        self._stats.prefill(n)
        slots = np.array([s.slot for s in slotted], np.int64)
        for seq in slotted:
            self._running[seq.slot] = seq
            req = seq.request
            self._frames.start(seq.slot, limit=min(req.params.max_new_frames, self.max_model_len - seq.position + 1),
                               next_emit=self.windows.next_end(0) if req.want_audio else self.emit_frames,
                               want_hidden=req.want_hidden and not req.want_audio,
                               hidden_audio=req.want_hidden and req.want_audio)
        epochs = self._slots.occupy(slots, [s.position for s in slotted], text=False)
        want_hidden = bool(self._frames.want_hidden[slots].any())
        slots_dev = None
        if want_hidden:
            slots_dev = torch.from_numpy(slots).to(self.model.device)
        out = _Output(slots, epochs, np.arange(n), self._to_host(state.prefill_codes[:n]),
                      self._to_host(state.hidden[slots_dev]) if want_hidden else None)
        out.ready = self._event()
        return out

    def _run_prefill(self, rows: int, length: int, meta: np.ndarray, floats: np.ndarray, text: bool,
                     sample_codes: np.ndarray | None = None) -> None:
        """Copy one packed prefill to the device and run it (replayed when that shape was captured)."""
        state = self._state
        # No wait on the audio stream: a slot whose stream's audio windows are still in flight drains
        # (engines.slots.SlotTable.release) and is not claimed before they are done.
        self._to_device(state.prefill_long[:rows, :PF_META + length], meta)
        self._to_device(state.prefill_float[:rows], floats)
        if sample_codes is not None:  # else no row reads it (its text fills its prompt)
            self._to_device(state.prefill_prompt_codes[:rows, :length], sample_codes)
        graph = self._prefill_graphs.get((rows, length, text))
        if graph is not None:
            graph.replay()
        else:
            prefill_step(self.model.gpt, state, rows, length, self._eos, self._speaker_token,
                         self._refine_end if text else None)

    def _prefill_shape(self, n: int, longest: int) -> tuple[int, int]:
        """(rows, prompt length) of a prefill of ``n`` prompts: padded to a captured shape when there is one."""
        rows = pick_bucket(self.prefill_row_buckets, n) if self.pad_shapes else n
        graph_length = next((b for b in self.prefill_length_buckets if b >= longest), None)
        return rows, graph_length if self.pad_shapes and graph_length is not None else longest

    # -- refine-text (slots flagged is_text) ------------------------------------------------------

    def enqueue_text(self, job_id: str, prompt_ids, params: SamplingParams) -> None:
        """Queue a refine-text prompt; its tokens go to ``_text_result`` (``refine_text`` awaits them)."""
        if self._refine_end is None:
            raise EngineError(f"the checkpoint's tokenizer has no {REFINE_END}: refine-text is not available")
        if len(prompt_ids) + 1 > self.max_model_len:
            raise EngineError(f"refine-text prompt of {len(prompt_ids)} tokens does not fit max_model_len "
                              f"{self.max_model_len}")
        if params.uniform_temperature is None or params.repetition_window > MAX_REPETITION_WINDOW:
            raise EngineError("refine-text samples at one temperature over at most "
                              f"{MAX_REPETITION_WINDOW} tokens of repetition window")
        generator = new_generator(params)
        job = TextJob(job_id, tuple(prompt_ids), params, generator.initial_seed() if generator is not None else 0)
        with self.requests.cond:  # refine.waiting is replaced under the lock
            self.requests.add(job, self._refine.waiting)

    async def refine_text(self, job_id: str, prompt_ids, params: SamplingParams, on_wait=None) -> list[int]:
        if not self.requests.started:
            raise EngineError("engine not started")
        return await self._text_jobs.run(job_id, lambda: self.enqueue_text(job_id, prompt_ids, params),
                                         lambda: self.abort(job_id), on_wait)

    def _text_result(self, job_id: str, tokens: list[int] | None, error: str | None,
                     wait: float | None = None) -> None:
        """A refine job ended (worker thread); the engine process replaces this with a pipe message."""
        self.requests.call_on_loop(self._text_jobs.settle, job_id, tokens, error, wait)

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_worker)
        self.requests.close_streams()
        self._text_jobs.fail_all("engine stopped")

    def _prefill_text(self, jobs: list[TextJob]) -> _Output:
        state, host = self._state, self._refine
        now = time.monotonic()
        for job in jobs:
            host.start(job, self._slots.claim(), max_len=self.max_model_len, now=now)
        n = len(jobs)
        rows, length = self._prefill_shape(n, max(len(j.prompt_ids) for j in jobs))
        meta, floats, _ = pack_prefill(rows, length, self.model.sizes.gpt.hidden_size, state.scratch,
                                       [(j.slot, j.prompt_ids, j.params, j.seed, None, None) for j in jobs])
        self._run_prefill(rows, length, meta, floats, text=True)
        self._stats.prefill(n)
        slots = np.array([j.slot for j in jobs], np.int64)
        epochs = self._slots.occupy(slots, [len(j.prompt_ids) for j in jobs], text=True)
        out = _Output(slots, epochs, np.arange(n), self._to_host(state.prefill_codes[:n]), None)
        out.ready = self._event()
        return out

    def _fetch(self, out: _Output) -> tuple[np.ndarray, np.ndarray | None]:
        began = time.perf_counter()
        fetched = out.fetch()
        self._stats.waited(time.perf_counter() - began)
        return fetched

    def _accept_text(self, out: _Output) -> None:
        tokens, _ = self._fetch(out)
        live = self._slots.live(out.slots, out.epochs, text=True)
        for job in self._refine.accept(out.slots[live], tokens[out.rows[live], 0], self._refine_end):
            self._end_text(job, None)

    def _end_text(self, job: TextJob, error: str | None) -> None:
        self._refine.finish(job)
        self._slots.release(job.slot)
        self._text_result(job.job_id, job.tokens, error, job.scheduled_after)

    # -- decode steps ----------------------------------------------------------------------------

    def _launch_steps(self) -> list[tuple[bool, _Output]]:
        """A full decode step, then the first-audio substeps its pace allows (``engines.slots.SubstepPace``):
        gathered steps over the refine rows and voice passes alone; every output in launch order."""
        launched, batch = self._launch_step()
        urgent = np.flatnonzero(self._urgent_slots())
        count = self._pace.full_step(time.monotonic(), len(urgent) > 0)
        if count and substep_batch(len(urgent), self.substep_buckets, batch) is None:
            self._stats.substep_too_wide(len(urgent), pick_bucket(self.batch_buckets, len(urgent)), batch)
            count = 0
        for _ in range(count):
            launched.extend(self._launch_step(urgent)[0])
        return launched

    def _launch_step(self, only: np.ndarray | None = None) -> tuple[list[tuple[bool, _Output]], int]:
        """One decode step over every occupied slot (``only``: a first-audio substep over those slots alone,
        gathered), audio and refine-text rows together, at the smallest captured (batch, length) bucket that
        holds them: replayed when captured, else run eagerly. Returns (is refine-text, output) for each kind
        present (both read the same codes), and the step's batch bucket."""
        state = self._state
        plan = self._slots.next_step(self.batch_buckets, self.length_buckets, self.max_model_len, self.refine_rows,
                                     self.text_widths, only)
        slots, batch, length, mixed = plan.slots, plan.batch, plan.length, plan.mixed
        gathered = plan.gather is not None
        if plan.text_index is not None:
            self._to_device(state.text_index, plan.text_index)
        if gathered:
            self._to_device(state.gather[:batch], plan.gather)
        graph = self._graphs.get((batch, length, plan.text_width, gathered))
        if graph is not None:
            graph.replay()
        else:
            decode_step(self.model.gpt, state, batch, length, self._eos, self._refine_end if mixed else None,
                        self._ragged(batch, gathered), plan.text_width or None, gathered)
        self.steps += 1
        self.substeps += gathered
        self.observer.on_step(len(slots))
        # Each row attends over its cache up to and with its new position (read before it moves on).
        kv_positions = int(self._slots.position[slots].sum()) + len(slots)
        self._slots.stepped(slots)
        audio, text = plan.audio, plan.text
        stage_rows = np.bincount(self._stage_of[audio], minlength=len(STAGE_NAMES))
        stage_rows[_STAGE_INDEX["refine"]] = len(text)
        self._stats.step(batch, stage_rows, substep=gathered, kv_positions=kv_positions, length=length,
                         free=self._slots.free, draining=int(self._slots.draining.sum()))
        want_hidden = bool(self._frames.want_hidden[audio].any())
        # Read back by slot (the step wrote each row's output into its slot's buffers): up to the highest slot.
        top = int(slots[-1]) + 1
        codes = self._to_host(state.codes[:top])
        hidden = self._to_host(state.hidden[:top]) if want_hidden else None
        ready = self._event()
        outputs = []
        if len(audio):
            outputs.append((False, _Output(audio, self._slots.epoch[audio].copy(), audio, codes, hidden, ready)))
        if len(text):
            outputs.append((True, _Output(text, self._slots.epoch[text].copy(), text, codes, None, ready)))
        return outputs, batch

    def _accept(self, out: _Output, events: list[tuple[str, FrameChunk]], windows: list[_Window]) -> None:
        """One step's codes for all its slots at once; Python only for slots with a chunk due or an end."""
        codes, hidden = self._fetch(out)
        slots, rows = out.slots, out.rows
        live = self._slots.live(slots, out.epochs, text=False)
        if not live.all():
            slots, rows = slots[live], rows[live]
        if not len(slots):
            return
        accepted = self._frames.accept(slots, codes[rows], self._eos)
        ended, full = accepted.ended, accepted.full
        if hidden is not None:
            for i in np.flatnonzero(accepted.kept & self._frames.want_hidden[slots]):
                self._running[int(slots[i])].hidden.append(hidden[rows[i]].copy())
        for i in np.flatnonzero(ended | full | accepted.due):
            seq = self._running[int(slots[i])]
            if ended[i]:
                self._finish(seq, "eos", events, windows)
            elif full[i]:
                self._finish(seq, "length", events, windows)
            else:
                self._hand_out(seq, events, windows)

    def _hand_out(self, seq: _Slotted, events, windows: list[_Window], final: str | None = None) -> None:
        """Frames accepted since the last chunk: as codes, or as an audio window for ``want_audio``."""
        book = self._frames
        slot, count = seq.slot, int(book.count[seq.slot])
        if not seq.request.want_audio:
            codes = book.frames[slot, seq.sent:count].copy()
            hidden = np.stack(seq.hidden) if seq.request.want_hidden and seq.hidden else None
            seq.hidden = []
            seq.sent = count
            book.next_emit[slot] = count + self.emit_frames
            events.append((seq.request.request_id, FrameChunk(codes, hidden, finished=final is not None,
                                                              finish_reason=final)))
            return
        if seq.pending_window is not None:  # two chunks due in one iteration: one window covers both
            windows.remove(seq.pending_window)
            seq.sent, seq.codes_sent = seq.pending_window.sent_before, seq.pending_window.codes_before
        start = self.windows.start(seq.sent, count) if count > seq.sent else count
        through = self.windows.sent_after(count, final is not None)
        seq.pending_window = _Window(seq, start, count, book.frames[slot, seq.codes_sent:count].copy(), final,
                                     sent_before=seq.sent, through=through, codes_before=seq.codes_sent,
                                     due_at=time.monotonic())
        windows.append(seq.pending_window)
        seq.sent, seq.codes_sent = through, count
        book.next_emit[slot] = self.windows.next_end(through)

    def _finish(self, seq: _Slotted, reason: str, events, windows: list[_Window]) -> None:
        seq.done = True
        if reason == "aborted":
            seq.aborted = True
            if seq.held:  # read by no one now (and its slot is free at once)
                self._hold.drop(lambda w: w.seq is seq)
                seq.held = 0
            events.append((seq.request.request_id, FrameChunk(self._empty(), finished=True,
                                                              finish_reason="aborted")))
        else:
            self._hand_out(seq, events, windows, final=reason)
        del self._running[seq.slot]
        # Its final audio window reads the slot's frames on the audio stream: the slot drains until that
        # window is done (_hand_out_audio). An aborted stream's windows are read by no one: free at once.
        self._slots.release(seq.slot, drain=seq.request.want_audio and not seq.aborted)

    # -- audio windows ---------------------------------------------------------------------------

    def _launch_audio(self, windows: list[_Window], idle: bool) -> None:
        """Decode due windows, grouped by audio path and length (one graph per group and row bucket), in order;
        windows of streams far enough ahead of their listeners may wait for others of their shape
        (``engines.slots.WindowHold``), and go out with them (``idle``: the engine has nothing else to do)."""
        now = time.monotonic()
        going: dict[tuple[bool, int], list[_Window]] = {}
        markers: list[_Window] = []
        flush: list[tuple[bool, int]] = []  # held shapes that must go first: a stream's windows stay in order
        for w in windows:
            w.seq.pending_window = None
            if w.end == w.start:
                markers.append(w)
            key = (bool(self._frames.hidden_audio[w.seq.slot]), w.end - w.start)
            if w.seq.held:
                flush += [k for k in self._hold.keys_holding(lambda x, seq=w.seq: x.seq is seq) if k not in flush]
            if w.end == w.start:
                continue
            if self._hold.holdable(lead=self._lead(w.seq, now), first=w.sent_before == 0, final=w.final is not None):
                self._hold.add(key, w, now)
                w.seq.held += 1
            else:
                going.setdefault(key, []).append(w)
        due = [k for k in self._hold.due(now, launching=going, idle=idle) if k not in flush]
        batches: list[tuple[tuple[bool, int], list[_Window]]] = []
        for key in flush + due:
            held = self._hold.take(key)
            for w in held:
                w.seq.held -= 1
            batches.append((key, held + going.pop(key, [])))
        batches += list(going.items())
        for (hidden, frames), group in batches:
            for first in range(0, len(group), self.audio_rows):
                self._audio_fifo.append(self._decode_audio(group[first:first + self.audio_rows], frames, hidden))
        if markers:  # ends with no new frames: handed out after every window launched before them
            self._audio_fifo.append(_AudioBatch(markers))

    def _lead(self, seq: _Slotted, now: float) -> float:
        """Seconds of audio the stream's listener has ahead of playback (0 before its first audio)."""
        if seq.first_audio_at is None:
            return 0.0
        return seq.samples_sent / SAMPLE_RATE - (now - seq.first_audio_at)

    def _decode_audio(self, group: list[_Window], frames: int, hidden: bool) -> _AudioBatch:
        state = self._state
        n = len(group)
        self._stats.audio(n)
        padded = self.pad_shapes and frames in self.audio_lengths
        rows = pick_bucket(self.audio_row_buckets, n) if padded else n
        graph = self._audio_graphs.get((hidden, rows, frames))
        spec = np.zeros((rows, 2), np.int64)
        spec[:, 0] = state.scratch
        spec[:n] = [(w.seq.slot, w.start) for w in group]
        if not self.cuda:
            self._to_device(state.audio_windows[:rows], spec)
            return _AudioBatch(group, decode_windows(self.model, state, rows, frames, hidden).float())
        with torch.cuda.stream(self._audio_stream):
            self._to_device(state.audio_windows[:rows], spec)
            if graph is not None:
                graph_, audio = graph
                graph_.replay()
            else:
                audio = decode_windows(self.model, state, rows, frames, hidden)
            host = self._to_host(audio[:n])
            event = torch.cuda.Event()
            event.record(self._audio_stream)
        return _AudioBatch(group, host, event)

    def _hand_out_audio(self, batch: _AudioBatch, events: list[tuple[str, FrameChunk]]) -> None:
        audio = batch.audio.numpy() if batch.audio is not None else None
        now = time.monotonic()  # the batch's hand-out: its windows' lag and any first audio are read from it
        row = 0
        for w in batch.windows:
            seq = w.seq
            samples = np.zeros(0, np.float32)
            if w.end > w.start:
                samples, seq.samples_sent = unsent_samples(self._samples_per_frame, w.start, seq.samples_sent,
                                                           audio[row], w.through)
                row += 1
                self._stats.audio_out(now - w.due_at)
                if seq.first_audio_at is None and len(samples):
                    seq.first_audio_at = now
            if w.final is not None:  # the stream's last window is done: its slot may be reused
                self._slots.drained(seq.slot)
            if seq.aborted:
                continue
            events.append((seq.request.request_id, FrameChunk(w.codes, None, finished=w.final is not None,
                                                              finish_reason=w.final, audio=samples.copy())))
