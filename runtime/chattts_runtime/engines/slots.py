"""The graph engine's host-side scheduling over its slots: pure (numpy, no torch, no threads).

``engines.schedule`` decides which waiting work starts; this module keeps the rest of what the
graph engine's worker reasons about between two launches (``engines.graph``; the GPU side is
``engines.graph_steps``):

* :class:`SlotTable`: which slot is free, holds an audio stream or a refine-text job, or drains (its
  stream ended while audio windows still read its frames), each slot's epoch (a slot reused since a
  launch makes that launch's rows for it stale) and position;
  :meth:`SlotTable.next_step` is the next decode step's plan: the slots it covers, its batch and
  KV-length buckets, whether refine rows ride in it;
* :func:`gather_open`: whether waiting audio may be prefilled now or gathered a little longer;
* :class:`FrameBook` and :class:`RefineBook`: what one step's output means per slot (a frame
  kept, a chunk due, a stream or a refine job at its end);
* :func:`substep_batch` and :class:`SubstepPace`: the first-audio substeps (gathered steps over the refine
  rows and voice passes, wherever their slots sit, between full steps while playing streams stay ahead
  of real time);
* :class:`WindowHold`: which audio windows of playing streams wait a little to be decoded with others of
  their shape (a window launch costs about as much at one row as at eight);
* :class:`LoopStats`: where the worker's time and the steps' rows went (logged periodically: the
  per-part account a benchmark reads beside its latencies).
"""
from __future__ import annotations

import bisect
import collections
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from chattts_runtime.model.sampling import SamplingParams


def bucket_sizes(limit: int, smallest: int = 1, step: int | None = None) -> list[int]:
    """Powers of two from ``smallest`` up to ``limit`` (then every ``step``, if given), ``limit`` last."""
    out, size = [], smallest
    while size < limit:
        out.append(size)
        size = size * 2 if step is None or size * 2 <= step else size + step
    out.append(limit)
    return out


def pick_bucket(buckets: list[int], need: int) -> int:
    for size in buckets:
        if size >= need:
            return size
    raise ValueError(f"{need} exceeds the largest bucket {buckets[-1]}")


def text_widths_for(widths: list[int], batch: int) -> list[int]:
    """The text-head widths a step over a batch bucket of ``batch`` may take (none wider than the batch)."""
    return sorted({min(w, batch) for w in widths})


def text_width(widths: list[int], rows: int, batch: int) -> int:
    """The narrowest text-head width for ``rows`` refine rows in a step of ``batch``: the text head samples a
    vocabulary 34x the code heads', so its width is most of what refine rows add to a step."""
    return pick_bucket(text_widths_for(widths, batch), rows)


def gather_open(waiting: int, oldest_arrival: float | None, *, streaming: bool, prefill_rows: int,
                admit_interval: float, now: float) -> bool:
    """Whether ``waiting`` audio requests (the oldest arrived at ``oldest_arrival``) may start now: at once
    when no stream is ``streaming`` (an idle engine) or a whole prefill of ``prefill_rows`` is ready,
    else once the oldest has been gathered for ``admit_interval`` seconds (each prefill is one more
    launch on the GPU's critical path, so newcomers are prefilled together)."""
    if not waiting:
        return False
    if not streaming or waiting >= prefill_rows:
        return True
    return now - oldest_arrival >= admit_interval


@dataclass(frozen=True)
class StepPlan:
    """One decode step: slots ``[0, batch)`` (or the ``gather`` rows' slots) over KV columns ``[0, length)``;
    its text head over the first ``text_width`` entries of the text index (0: no refine rows ride in it)."""

    slots: np.ndarray  # the occupied slots, ascending (the rows read back)
    batch: int
    length: int
    audio: np.ndarray  # the slots of audio streams
    text: np.ndarray  # the slots of refine-text jobs
    # The refine rows' slots padded with the scratch slot, when they changed since the last plan (the
    # step's text-head index must be rewritten); None when it still holds.
    text_index: np.ndarray | None = None
    text_width: int = 0
    # A gathered step (a first-audio substep): each of its ``batch`` rows' slot, padded with the scratch slot;
    # None: a step over slots [0, batch).
    gather: np.ndarray | None = None

    @property
    def mixed(self) -> bool:
        """Refine rows ride in this step (the mixed graph: text embedding and head for those rows)."""
        return bool(len(self.text))


class SlotTable:
    """The slots and their kinds (index = slot; ``slots`` is the scratch slot, never handed out)."""

    def __init__(self, slots: int):
        total = slots + 1
        self.slots, self.scratch = slots, slots
        self.audio = np.zeros(total, bool)  # holds an audio stream
        self.text = np.zeros(total, bool)  # holds a refine-text job
        self.epoch = np.zeros(total, np.int64)  # bumped at every prefill into the slot, whichever kind
        self.position = np.zeros(total, np.int64)  # position id of the slot's next input, as launched
        # Ended, but audio windows in flight on the second stream still read its frame history: not
        # handed out again until they are done (a prefill into it would overwrite what they read).
        self.draining = np.zeros(total, bool)
        self._free = list(range(slots))  # ascending
        self._text_changed = True

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def busy(self) -> bool:
        return bool(self.audio.any() or self.text.any())

    def claim(self) -> int:
        """The lowest free slot: a full step covers slots up to the highest one held, so low slots keep it
        small."""
        if not self._free:
            raise RuntimeError("no free slot")
        return self._free.pop(0)

    def occupy(self, slots: np.ndarray, positions, *, text: bool) -> np.ndarray:
        """Claimed ``slots`` now hold newcomers of one kind whose next inputs sit at ``positions``; returns
        their new epochs (what a launch's rows for them are checked against)."""
        self.epoch[slots] += 1
        (self.text if text else self.audio)[slots] = True
        self.position[slots] = positions
        if text:
            self._text_changed = True
        return self.epoch[slots].copy()

    def release(self, slot: int, *, drain: bool = False) -> None:
        """The slot's occupant ended (or was aborted); it is free for the next prefill, or with ``drain``
        once :meth:`drained` says the audio windows that read it are done."""
        if self.text[slot]:
            self._text_changed = True
        self.audio[slot] = self.text[slot] = False
        if drain:
            self.draining[slot] = True
        else:
            bisect.insort(self._free, slot)

    def drained(self, slot: int) -> None:
        """The last audio window that read a draining slot is done: the slot is free."""
        if not self.draining[slot]:
            raise ValueError(f"slot {slot} is not draining")
        self.draining[slot] = False
        bisect.insort(self._free, slot)

    def live(self, slots: np.ndarray, epochs: np.ndarray, *, text: bool) -> np.ndarray:
        """Which of ``slots`` still hold the occupant of kind ``text`` that a launch at ``epochs`` stepped."""
        return (self.text if text else self.audio)[slots] & (self.epoch[slots] == epochs)

    def next_step(self, batch_buckets: list[int], length_buckets: list[int], max_len: int,
                  text_rows: int, text_widths: list[int] | None = None, only: np.ndarray | None = None) -> StepPlan:
        """The decode step over every occupied slot at the smallest buckets that hold them (call when
        ``busy``); ``text_rows``: the size of the text-head index; ``text_widths``: the widths its text
        head is captured at (default: ``text_rows`` alone), the smallest that holds the refine rows taken.
        ``only``: a gathered step over those occupied slots alone, wherever they sit (a first-audio substep:
        it must hold every refine row, whose text-head index is shared by all steps)."""
        occupied = self.audio | self.text
        gather = None
        if only is None:
            slots = np.flatnonzero(occupied)
            batch = pick_bucket(batch_buckets, int(slots[-1]) + 1)
        else:
            slots = np.unique(np.asarray(only, np.int64))
            if not len(slots) or not occupied[slots].all():
                raise ValueError("a gathered step steps occupied slots only, at least one")
            if self.text.sum() != self.text[slots].sum():
                raise ValueError("a gathered step must hold every refine row")
            batch = pick_bucket(batch_buckets, len(slots))
            gather = np.full(batch, self.scratch, np.int64)
            gather[:len(slots)] = slots
        need = min(int(self.position[slots].max()), max_len - 1) + 1
        text = slots[self.text[slots]]
        index = None
        if len(text) and self._text_changed:
            index = np.full(text_rows, self.scratch, np.int64)
            index[:len(text)] = text
            self._text_changed = False
        width = text_width(text_widths or [text_rows], len(text), batch) if len(text) else 0
        return StepPlan(slots, batch, pick_bucket(length_buckets, need), slots[self.audio[slots]], text, index,
                        width, gather)

    def stepped(self, slots: np.ndarray) -> None:
        """A step over ``slots`` was launched: their next inputs are one position on."""
        self.position[slots] += 1

    def reset(self) -> None:
        """Every slot free (a failed step: all in flight ended with the error)."""
        self.audio[:] = False
        self.text[:] = False
        self.draining[:] = False
        self._free = list(range(self.slots))
        self._text_changed = True


def substep_batch(urgent_rows: int, batch_buckets: list[int], full_batch: int) -> int | None:
    """The batch bucket of a first-audio substep, a gathered step over ``urgent_rows`` rows (every refine row
    and voice pass): the smallest that holds them, or None when there are none or it would cover more than
    half of the full step's ``full_batch`` (a substep nearly as wide as the step saves little)."""
    if not urgent_rows or not batch_buckets or urgent_rows > batch_buckets[-1]:
        return None
    batch = pick_bucket(batch_buckets, urgent_rows)
    return batch if 2 * batch <= full_batch else None


class SubstepPace:
    """How many first-audio substeps go with each full decode step, kept so that full steps, which every
    playing stream rides, still come at ``playing_realtime`` times real time (``frames_per_second`` of
    audio frames): one more while full steps come faster than that, one fewer while slower (at most
    ``most``; none when ``most`` is 0). A playing stream's listener has its audio buffered ahead, so the
    rows that stand between a response and its first audio may step more often while that holds."""

    def __init__(self, most: int, playing_realtime: float, frames_per_second: float, smoothing: float = 0.2):
        if most < 0 or playing_realtime <= 0:
            raise ValueError("substeps must be >= 0 and the playing streams' real-time factor > 0")
        self.most = most
        self.budget = 1.0 / (playing_realtime * frames_per_second)  # seconds between full steps, at most
        self.smoothing = smoothing
        self.count = 0
        self.interval: float | None = None  # smoothed seconds between full steps
        self._last: float | None = None

    def full_step(self, now: float, urgent: bool) -> int:
        """A full step is launched at ``now``; returns the substeps to launch after it (``urgent``: there
        are rows to step)."""
        if self._last is not None:
            gap = now - self._last
            self.interval = gap if self.interval is None else self.interval + self.smoothing * (gap - self.interval)
        self._last = now
        if self.most == 0 or not urgent:
            return 0
        if self.interval is not None and self.interval < self.budget:
            self.count = min(self.count + 1, self.most)
        elif self.interval is not None and self.interval > self.budget:
            self.count = max(self.count - 1, 0)
        return self.count

    def idle(self) -> None:
        """The engine ran out of work: the gap until its next step is not a step's pace."""
        self._last = None


class WindowHold:
    """Audio windows held back so that more of them share a launch, per window shape (any hashable key).

    Decoding one window costs about as much as decoding eight (the audio models are bound by their launches
    at a few rows), and at hundreds of streams most launches carry three or four. A window may wait when its
    stream's listener has at least ``min_lead`` seconds of audio buffered ahead of playback and it is not
    the stream's first or last; a shape's held windows go out with the next launch of that shape, or once
    ``rows`` of them wait, or once the oldest has waited ``hold`` seconds, or when the engine has nothing
    else to do. ``rows`` 1: nothing is held."""

    def __init__(self, rows: int, hold: float, min_lead: float):
        if rows < 1 or hold < 0:
            raise ValueError("audio batch rows must be >= 1 and the hold >= 0")
        self.rows, self.hold, self.min_lead = rows, hold, min_lead
        self._held: dict[object, list[tuple[float, object]]] = {}  # key -> [(held since, window)], oldest first

    def __len__(self) -> int:
        return sum(len(group) for group in self._held.values())

    def holdable(self, *, lead: float, first: bool, final: bool) -> bool:
        """Whether a window whose listener is ``lead`` seconds ahead may wait (not a first or last window)."""
        return self.rows > 1 and self.hold > 0 and not first and not final and lead >= self.min_lead

    def add(self, key, window, now: float) -> None:
        self._held.setdefault(key, []).append((now, window))

    def keys_holding(self, matches) -> list:
        """The keys under which some held window ``matches`` (a stream's, whose next window must follow them)."""
        return [key for key, group in self._held.items() if any(matches(w) for _, w in group)]

    def due(self, now: float, *, launching=(), idle: bool = False) -> list:
        """The keys whose held windows go out now (in the order they were first held): each one in
        ``launching`` (a launch of that shape goes anyway), full, or held too long; all when ``idle``."""
        launching = set(launching)
        return [key for key, group in self._held.items()
                if idle or key in launching or len(group) >= self.rows or now - group[0][0] >= self.hold]

    def take(self, key) -> list:
        """The windows held under ``key``, oldest first; none are held there any more."""
        return [window for _, window in self._held.pop(key, [])]

    def drop(self, matches) -> list:
        """Remove (and return) every held window for which ``matches(window)`` (an aborted stream's)."""
        dropped = []
        for key in list(self._held):
            group = self._held[key]
            dropped += [w for _, w in group if matches(w)]
            group[:] = [(t, w) for t, w in group if not matches(w)]
            if not group:
                del self._held[key]
        return dropped

    def clear(self) -> list:
        """Every held window (a failed step: they end with the error); none held any more."""
        out = [w for group in self._held.values() for _, w in group]
        self._held = {}
        return out


@dataclass(frozen=True)
class Accepted:
    """One step's frames for some slots: per slot, whether it ended (end code), reached its limit, or has a
    chunk due; ``kept``: a frame was kept (every slot that did not end)."""

    kept: np.ndarray
    ended: np.ndarray
    full: np.ndarray
    due: np.ndarray


class FrameBook:
    """The audio streams' frames on the host, per slot: accepted, allowed, the next chunk's due count."""

    def __init__(self, slots: int, max_len: int, num_vq: int):
        total = slots + 1
        self.count = np.zeros(total, np.int64)  # frames accepted
        self.limit = np.zeros(total, np.int64)  # frames allowed (max_new_frames, max_model_len)
        self.next_emit = np.zeros(total, np.int64)  # frame count at which the next chunk is due
        self.want_hidden = np.zeros(total, bool)  # hidden states handed out (not decoded to audio here)
        self.hidden_audio = np.zeros(total, bool)  # audio decoded here from hidden states (Decoder path)
        self.frames = np.zeros((total, max_len, num_vq), np.int64)

    def start(self, slot: int, *, limit: int, next_emit: int, want_hidden: bool, hidden_audio: bool) -> None:
        self.count[slot] = 0
        self.limit[slot] = limit
        self.next_emit[slot] = next_emit
        self.want_hidden[slot] = want_hidden
        self.hidden_audio[slot] = hidden_audio

    def accept(self, slots: np.ndarray, frames: np.ndarray, eos: int) -> Accepted:
        """``frames [len(slots), num_vq]``: a frame with the end code in any codebook ends its stream and is
        not kept; every other one is kept, and may fill the stream's limit or make a chunk due."""
        ended = (frames == eos).any(axis=1)
        kept = ~ended
        count = self.count[slots]
        self.frames[slots[kept], count[kept]] = frames[kept]
        count = count + kept
        self.count[slots] = count
        full = kept & (count >= self.limit[slots])
        due = kept & ~full & (count >= self.next_emit[slots])
        return Accepted(kept, ended, full, due)


@dataclass
class TextJob:
    """One refine-text prompt on its way through a slot (a refine row of the steps)."""

    job_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)
    scheduled_after: float | None = None  # seconds from arrival to its prefill
    limit: int = 0  # tokens allowed (max_new_frames, max_model_len)


class RefineBook:
    """The refine-text jobs: waiting for a slot, and running (by slot)."""

    def __init__(self):
        self.waiting: collections.deque[TextJob] = collections.deque()
        self.running: dict[int, TextJob] = {}

    def start(self, job: TextJob, slot: int, *, max_len: int, now: float) -> None:
        job.slot = slot
        job.scheduled_after = max(0.0, now - job.arrival)
        # As engines.refine: at most max_new_frames tokens, and no position past max_len.
        job.limit = min(job.params.max_new_frames, max_len - len(job.prompt_ids))
        self.running[slot] = job

    def accept(self, slots: np.ndarray, tokens: np.ndarray, end: int) -> list[TextJob]:
        """One token for each running job at ``slots``; returns the jobs that ended (their end token, or their
        limit reached), in slot order. The caller frees their slots (:meth:`finish`)."""
        ended = []
        for slot, token in zip(slots.tolist(), tokens.tolist()):
            job = self.running[slot]
            if token == end:
                ended.append(job)
                continue
            job.tokens.append(token)
            if len(job.tokens) >= job.limit:
                ended.append(job)
        return ended

    def finish(self, job: TextJob) -> None:
        del self.running[job.slot]

    def reset(self) -> None:
        self.running = {}


STAGE_NAMES = ("first", "voice", "next", "refine")  # a step's rows by what they stand for (engines.schedule.Stage)
# A too-wide step's account (means over those steps): its first-audio rows, the batch bucket a substep over
# them would take, and the full step's batch bucket.
TOO_WIDE_NAMES = ("urgent_rows", "substep_batch", "full_batch")


class LoopStats:
    """Where the worker's rows and time went since the last report: decode steps and their rows by
    stage (``STAGE_NAMES``), prefills and their rows, audio-window launches and their rows, and the
    seconds the worker waited on the GPU (reading a step's codes), and the KV positions of each step's
    rows (their contexts, summed) beside its length bucket: at hundreds of rows with long prompts (a
    voice sample in every piece's) a step reads gigabytes of cache, which may cost it more than its rows
    do. The ragged attention reads those positions; the padded one (below ``attention.MIN_RAGGED_BATCH`` rows)
    reads the whole bucket, batch x length. Rates are per second of work: the worker's time asleep with
    nothing to do is left out. Rows stepped for nobody (free slots inside a step's batch bucket) are the
    bucket less the rows.

    Where the slots were at each step: free, or draining (ended, their last audio window not done yet: a
    newcomer cannot have them). And the audio windows' lag, from the step that made a window due to its
    audio handed out (any hold, the audio stream's queue and the decode itself): when it grows, slots drain
    late and newcomers wait for them."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        self.began = self._clock()
        self.steps = self.substeps = 0
        self.substeps_too_wide = 0  # full steps whose pace allowed substeps, but the first-audio rows were too many
        # At those steps, summed: the first-audio rows, the bucket a substep over them would take, and the full
        # step's batch bucket (what made each one too wide).
        self.too_wide = np.zeros(len(TOO_WIDE_NAMES), np.int64)
        self.bucket_rows = 0
        self.rows = np.zeros(len(STAGE_NAMES), np.int64)
        self.kv_positions = self.length_buckets = 0
        self.prefills = self.prefill_rows = 0
        self.audio_launches = self.audio_rows = 0
        self.free_slots = self.draining_slots = 0
        self.audio_windows = 0
        self.audio_lag = self.audio_lag_max = 0.0
        self.gpu_wait = 0.0
        self.idle = 0.0

    def step(self, batch: int, stage_rows: np.ndarray, substep: bool = False, kv_positions: int = 0,
             length: int = 0, free: int = 0, draining: int = 0) -> None:
        """A decode step over a batch bucket of ``batch`` with ``stage_rows[i]`` rows of ``STAGE_NAMES[i]``
        (``substep``: a first-audio substep, counted among the steps and on its own) whose rows' contexts sum
        to ``kv_positions`` cached positions, at a length bucket of ``length``; ``free`` and ``draining``
        slots beside it."""
        self.steps += 1
        self.free_slots += free
        self.draining_slots += draining
        self.substeps += substep
        self.bucket_rows += batch
        self.rows += stage_rows
        self.kv_positions += kv_positions
        self.length_buckets += length

    def substep_too_wide(self, urgent_rows: int, substep_batch: int, full_batch: int) -> None:
        """Substeps were due after a full step, but a substep over the ``urgent_rows`` first-audio rows would
        take a batch bucket of ``substep_batch``, over half of the full step's ``full_batch``."""
        self.substeps_too_wide += 1
        self.too_wide += (urgent_rows, substep_batch, full_batch)

    def prefill(self, rows: int) -> None:
        self.prefills += 1
        self.prefill_rows += rows

    def audio(self, rows: int) -> None:
        self.audio_launches += 1
        self.audio_rows += rows

    def audio_out(self, lag: float) -> None:
        """A window's audio was handed out ``lag`` seconds after the step that made it due."""
        self.audio_windows += 1
        self.audio_lag += lag
        self.audio_lag_max = max(self.audio_lag_max, lag)

    def waited(self, seconds: float) -> None:
        self.gpu_wait += seconds

    def slept(self, seconds: float) -> None:
        """The worker slept ``seconds`` with nothing to do (not counted as work)."""
        self.idle += seconds

    def report(self) -> dict:
        """The account since the last reset (per second and per step), then a fresh one. ``began_at`` and
        ``ended_at`` are the clock's readings (``time.monotonic``: on Linux one clock for every process of
        the host, so a benchmark can tell which reports fall inside its own window)."""
        now = self._clock()
        elapsed = now - self.began
        wall = max(elapsed - self.idle, 1e-9)  # seconds of work
        steps = max(self.steps, 1)
        out = {"began_at": round(self.began, 3), "ended_at": round(now, 3),
               "wall_s": round(wall, 3), "busy_share": round(wall / max(elapsed, 1e-9), 3),
               "steps_per_s": round(self.steps / wall, 1), "substeps_per_s": round(self.substeps / wall, 1),
               "substeps_too_wide_per_s": round(self.substeps_too_wide / wall, 1),
               "too_wide": {name: round(float(n) / max(self.substeps_too_wide, 1), 1)
                            for name, n in zip(TOO_WIDE_NAMES, self.too_wide)},
               "rows_per_step": {name: round(float(n) / steps, 1) for name, n in zip(STAGE_NAMES, self.rows)},
               "idle_rows_per_step": round((self.bucket_rows - float(self.rows.sum())) / steps, 1),
               "kv_positions_per_step": round(self.kv_positions / steps, 1),
               "length_bucket_per_step": round(self.length_buckets / steps, 1),
               "prefills_per_s": round(self.prefills / wall, 1),
               "rows_per_prefill": round(self.prefill_rows / max(self.prefills, 1), 1),
               "audio_launches_per_s": round(self.audio_launches / wall, 1),
               "rows_per_audio_launch": round(self.audio_rows / max(self.audio_launches, 1), 1),
               "free_slots_per_step": round(self.free_slots / steps, 1),
               "draining_slots_per_step": round(self.draining_slots / steps, 1),
               "audio_windows_out_per_s": round(self.audio_windows / wall, 1),
               "audio_lag_ms": round(1e3 * self.audio_lag / max(self.audio_windows, 1), 1),
               "audio_lag_max_ms": round(1e3 * self.audio_lag_max, 1),
               "gpu_wait_share": round(self.gpu_wait / wall, 3)}
        self.reset()
        return out
