"""The graph engine: a static slot KV cache, one CUDA graph per (batch, length) bucket.

Why: the reference engine is host-bound on a GPU (hundreds of small launches per step,
a KV cache that is re-packed whenever a request joins or leaves, per-row Python
sampling). Here every running request owns a *slot*: a fixed row of a preallocated KV
cache ``[slots, kv_heads, max_model_len, head_dim]`` plus per-slot sampling state on the
device. A decode step reads and writes only these static buffers, so it is captured
once per (batch bucket, length bucket) and replayed; sampling of the 4 code heads
(temperature, repetition penalty, top-k, top-p, min-frames, uniforms from a counter
hash) runs inside the same graph, and the sampled codes are written straight back into
the next step's input buffer. The host loop therefore launches step ``t+1`` before it
reads step ``t``'s codes (one step of lag), and only touches Python per request when
frames are handed out.

Slots: a newcomer takes the lowest free slot; a step runs slots ``[0, batch bucket)``,
and free slots inside that range compute rows nobody reads (their writes stay in their
own slot and are overwritten by the next prefill). Attention covers columns
``[0, length bucket)``, masked per row at its own position.

Prefills (newcomers' prompts, batched, right-padded into their slots) run eagerly; while
others decode, newcomers are gathered for ``admit_interval``. Frames reach a stream
``emit_frames`` at a time. Measured on an H200: bench/results/runtime-h200-2026-11-30-graph-summary.md.

On CPU the same code runs eagerly (no capture): the equality test against the reference
engine (greedy, float32) exercises exactly the slot, cache and sampling logic served on
the GPU. Greedy output equals the reference engine's; sampled output is reproducible per
seed here but uses other random draws than the reference (a device-side hash instead of
a CPU generator per request).
"""
from __future__ import annotations

import heapq
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from chattts_runtime.engines.base import EngineError, FrameChunk, SamplingParams, SchedulerObserver, SynthesisRequest
from chattts_runtime.engines.reference import ReferenceEngine, _Sequence

log = logging.getLogger(__name__)

# Repetition-penalty history kept per slot (frames); requests asking for a longer window are refused.
MAX_REPETITION_WINDOW = 64
_U64 = 1 << 64


def _signed(c: int) -> int:
    return c - _U64 if c >= 1 << 63 else c


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def counter_uniforms(seed: torch.Tensor, step: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B]`` seeds, ``[B]`` frame counters -> ``[B, heads]`` uniforms in [0, 1) (splitmix64).

    A pure function of (seed, frame, head): no generator state, so it runs inside a
    captured graph and a seeded request reproduces whatever it is batched with.
    """
    head = torch.arange(heads, device=seed.device, dtype=torch.long)
    x = seed[:, None] * _MIX1 + step[:, None] * _GOLDEN + head[None, :] * _MIX2 + _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return _shr(x, 40).to(torch.float32) / float(1 << 24)


def bucket_sizes(limit: int, smallest: int = 1) -> list[int]:
    """Powers of two from ``smallest`` up to ``limit``, with ``limit`` itself last."""
    out, size = [], smallest
    while size < limit:
        out.append(size)
        size *= 2
    out.append(limit)
    return out


def pick_bucket(buckets: list[int], need: int) -> int:
    for size in buckets:
        if size >= need:
            return size
    raise ValueError(f"{need} exceeds the largest bucket {buckets[-1]}")


class SlotState:
    """Device buffers shared by every captured graph (addresses must never change)."""

    def __init__(self, gpt, slots: int, max_len: int, device: torch.device):
        s = gpt.sizes
        self.slots, self.max_len, self.num_vq = slots, max_len, s.num_vq
        self.vocab = s.num_audio_tokens
        kv = dict(dtype=gpt.dtype, device=device)
        self.keys = [torch.zeros(slots, s.num_key_value_heads, max_len, s.head_dim, **kv)
                     for _ in range(s.num_hidden_layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        lng = dict(dtype=torch.long, device=device)
        self.rows = torch.arange(slots, **lng)
        self.columns = torch.arange(max_len, **lng)
        self.codes = torch.zeros(slots, s.num_vq, **lng)  # next step's input = last sampled frame
        self.position = torch.zeros(slots, **lng)  # position id of the next input
        self.generated = torch.zeros(slots, **lng)  # frames sampled so far
        self.history = torch.full((slots, MAX_REPETITION_WINDOW, s.num_vq), self.vocab, **lng)
        self.hidden = torch.zeros(slots, s.hidden_size, **kv)
        f32 = dict(dtype=torch.float32, device=device)
        self.temperature = torch.zeros(slots, **f32)
        self.top_p = torch.ones(slots, **f32)
        self.penalty = torch.ones(slots, **f32)
        self.top_k = torch.zeros(slots, **lng)
        self.window = torch.zeros(slots, **lng)
        self.min_frames = torch.zeros(slots, **lng)
        self.seed = torch.zeros(slots, **lng)

    def reset_sampling(self) -> None:
        self.position.zero_()
        self.generated.zero_()
        self.codes.zero_()
        self.history.fill_(self.vocab)

    def load_requests(self, slots: torch.Tensor, params: list[SamplingParams], seeds: list[int],
                      positions: list[int]) -> None:
        """Write newcomers' sampling parameters into their slots (one copy per field)."""
        dev = slots.device

        def put(buf: torch.Tensor, values, dtype) -> None:
            buf[slots] = torch.tensor(values, dtype=dtype).to(dev)

        put(self.temperature, [p.temperature for p in params], torch.float32)
        put(self.top_p, [p.top_p for p in params], torch.float32)
        put(self.penalty, [p.repetition_penalty for p in params], torch.float32)
        put(self.top_k, [p.top_k for p in params], torch.long)
        put(self.window, [p.repetition_window for p in params], torch.long)
        put(self.min_frames, [p.min_new_frames for p in params], torch.long)
        put(self.seed, [_signed(s % _U64) for s in seeds], torch.long)
        put(self.position, positions, torch.long)
        self.generated[slots] = 0
        self.history[slots] = self.vocab


def sample_slots(state: SlotState, rows, logits: torch.Tensor, eos: int) -> torch.Tensor:
    """``logits [B, num_vq, V]`` float32 of slots ``rows`` -> codes ``[B, num_vq]``.

    The reference engine's ``sample_codes`` as fixed-shape tensor arithmetic over the
    slots' parameters: greedy rows take the argmax, the others temperature, repetition
    penalty over their last ``window`` frames, top-k, top-p and one uniform per head.
    """
    b, q, v = logits.shape
    generated = state.generated[rows]
    blocked = (generated < state.min_frames[rows])[:, None, None]
    logits = torch.cat((logits[:, :, :eos], torch.where(blocked, -torch.inf, logits[:, :, eos:eos + 1]),
                        logits[:, :, eos + 1:]), dim=-1)
    greedy_codes = logits.argmax(dim=-1)
    temperature = state.temperature[rows]
    greedy = temperature == 0
    scores = logits / torch.where(greedy, 1.0, temperature)[:, None, None]

    # Repetition penalty: counts of each code among the row's last `window` frames (eos exempt).
    w = MAX_REPETITION_WINDOW
    age = (generated[:, None] - 1 - state.columns[None, :w]) % w  # ring slot j holds frame generated-1-age
    recent_ok = age < torch.minimum(state.window[rows], generated)[:, None]
    recent = torch.where(recent_ok[:, :, None], state.history[rows], v)  # v = "no code"
    freq = torch.zeros(b, q, v + 1, device=logits.device)
    freq.scatter_add_(2, recent.transpose(1, 2), torch.ones(b, q, w, device=logits.device))
    freq = torch.cat((freq[:, :, :eos], torch.zeros_like(freq[:, :, eos:eos + 1]), freq[:, :, eos + 1:v]), dim=-1)
    alpha = torch.pow(state.penalty[rows][:, None, None], freq)
    scores = torch.where(scores < 0, scores * alpha, scores / alpha)

    top_k = state.top_k[rows]
    ks = torch.where((top_k > 0) & (top_k < v), top_k, v)
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
    kth = sorted_scores.gather(2, (ks - 1)[:, None, None].expand(b, q, 1))
    drop = sorted_scores < kth
    sorted_probs = sorted_scores.masked_fill(drop, -torch.inf).softmax(dim=-1)
    drop = drop | ((sorted_probs.cumsum(dim=-1) - sorted_probs) > state.top_p[rows][:, None, None])
    probs = sorted_scores.masked_fill(drop, -torch.inf).softmax(dim=-1)
    uniforms = counter_uniforms(state.seed[rows], generated, q)
    pick = torch.searchsorted(probs.cumsum(dim=-1), uniforms[:, :, None]).clamp_(max=v - 1)
    sampled = order.gather(2, pick).squeeze(-1)
    return torch.where(greedy[:, None], greedy_codes, sampled)


def record_frames(state: SlotState, rows, codes: torch.Tensor) -> None:
    """Store sampled codes as the slots' next input and in their repetition history."""
    generated = state.generated[rows]
    ring = generated % MAX_REPETITION_WINDOW
    if isinstance(rows, slice):
        state.history[state.rows[rows], ring] = codes
        state.codes[rows] = codes
        state.generated[rows] += 1
    else:
        state.history[rows, ring] = codes
        state.codes[rows] = codes
        state.generated[rows] = generated + 1


def decode_step(gpt, state: SlotState, batch: int, length: int, eos: int) -> None:
    """One generation step for slots ``[0, batch)`` over KV columns ``[0, length)``; static shapes only."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: PLC0415

    s = gpt.sizes
    llama = gpt.llama
    rows = state.rows[:batch]
    position = state.position[:batch]
    h = gpt.embed.embed_codes(state.codes[:batch]).to(gpt.dtype)[:, None, :]  # [B, 1, H]
    cos, sin = llama.rotary_emb(h, position[:, None])
    mask = (state.columns[None, :length] <= position[:, None])[:, None, None, :]
    groups = s.num_attention_heads // s.num_key_value_heads
    for idx, layer in enumerate(llama.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(batch, 1, -1, s.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(batch, 1, -1, s.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(batch, 1, -1, s.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        state.keys[idx][rows, :, position] = k[:, :, 0]
        state.values[idx][rows, :, position] = v[:, :, 0]
        keys = state.keys[idx][:batch, :, :length]
        values = state.values[idx][:batch, :, :length]
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(batch, 1, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    hidden = llama.norm(h)[:, 0]
    state.hidden[:batch] = hidden
    codes = sample_slots(state, slice(0, batch), gpt.embed.code_logits(hidden), eos)
    record_frames(state, slice(0, batch), codes)
    # Clamped so a row that already ended (read one step late) can never index past the cache.
    state.position[:batch] = torch.clamp(position + 1, max=state.max_len - 1)


def prefill_slots(gpt, state: SlotState, slots: torch.Tensor, embeds: list[torch.Tensor], eos: int) -> None:
    """Run newcomers' prompts (right-padded, together) into their slots and sample their first frames."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: PLC0415

    s = gpt.sizes
    llama = gpt.llama
    dev = state.rows.device
    b, t = len(embeds), max(e.shape[0] for e in embeds)
    h = torch.zeros(b, t, s.hidden_size, dtype=gpt.dtype, device=dev)
    for row, e in enumerate(embeds):
        h[row, :e.shape[0]] = e
    lengths = torch.tensor([e.shape[0] for e in embeds], device=dev)
    positions = state.columns[:t].expand(b, t)
    # Causal within the prompt; padding (at the end) is never seen by a real query.
    mask = torch.ones(t, t, dtype=torch.bool, device=dev).tril().expand(b, 1, t, t)
    cos, sin = llama.rotary_emb(h, positions)
    groups = s.num_attention_heads // s.num_key_value_heads
    cols = state.columns[:t][None, :]
    for idx, layer in enumerate(llama.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(b, t, -1, s.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, -1, s.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, -1, s.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        state.keys[idx][slots[:, None], :, cols] = k.transpose(1, 2)
        state.values[idx][slots[:, None], :, cols] = v.transpose(1, 2)
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    hidden = llama.norm(h)[torch.arange(b, device=dev), lengths - 1]
    state.hidden[slots] = hidden
    codes = sample_slots(state, slots, gpt.embed.code_logits(hidden), eos)
    record_frames(state, slots, codes)


@dataclass
class _Slotted(_Sequence):
    slot: int = -1
    count: int = 0  # frames accepted
    pending: list[np.ndarray] = field(default_factory=list)
    pending_hidden: list[np.ndarray] = field(default_factory=list)


@dataclass
class _Output:
    """Frames of one launched step (or prefill) on their way to the host."""

    entries: list[tuple[_Slotted, int, int]]  # (sequence, position after the step, row in codes)
    codes: torch.Tensor
    hidden: torch.Tensor | None
    ready: object = None  # a CUDA event, or None on CPU

    def fetch(self) -> tuple[np.ndarray, np.ndarray | None]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.codes.numpy(), (self.hidden.float().numpy() if self.hidden is not None else None)


class GraphEngine(ReferenceEngine):
    """Continuous batching over static slots with graph-replayed decode steps (see module docstring).

    Shares the reference engine's request side (submit, abort, streams, stop) and
    replaces its worker. ``emit_frames`` frames are handed to a stream at a time (the
    speech API decodes windows of several frames anyway), so the event loop is woken
    once per few steps per request instead of every step.
    """

    name = "graph"

    def __init__(self, model, *, max_num_seqs: int = 64, max_waiting: int = 256, max_model_len: int = 2048,
                 observer: SchedulerObserver | None = None, emit_frames: int = 4, use_graphs: bool | None = None,
                 gil_switch_interval: float | None = 0.001, admit_interval: float | None = None):
        super().__init__(model, max_num_seqs=max_num_seqs, max_waiting=max_waiting, max_model_len=max_model_len,
                         observer=observer)
        if emit_frames < 1:
            raise ValueError("emit_frames must be >= 1")
        self.emit_frames = emit_frames
        # The loop thread shares the GIL with the event loop and the audio-decode thread; at the
        # default 5 ms switch interval a step that is ready waits up to a whole GPU step or more for
        # the GIL. None leaves the interpreter's setting alone (it is process-wide).
        self.gil_switch_interval = gil_switch_interval
        self.cuda = model.device.type == "cuda"
        self.use_graphs = self.cuda if use_graphs is None else use_graphs
        if self.use_graphs and not self.cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        # A prefill runs eagerly (an eager step costs ~15 ms of host time on an H200 whatever its
        # size), so while others are decoding, newcomers are gathered for up to admit_interval
        # seconds and prefilled together; an idle engine admits at once. Default: 50 ms on CUDA,
        # 0 on CPU. Measured on the H200 (bench/results/runtime-h200-2026-11-30-graph-summary.md):
        # lower TTFA p50 at 16 streams, no throughput change at 64-256 (the server is bound elsewhere).
        self.admit_interval = (0.05 if self.cuda else 0.0) if admit_interval is None else admit_interval
        if self.admit_interval < 0:
            raise ValueError("admit_interval must be >= 0")
        self.batch_buckets = bucket_sizes(max_num_seqs)
        self.length_buckets = bucket_sizes(max_model_len, smallest=min(128, max_model_len))
        self._state: SlotState | None = None
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._free: list[int] = list(range(max_num_seqs))
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self.capture_seconds = 0.0

    def describe(self) -> dict:
        return {**super().describe(), "engine": self.name, "cuda_graphs": self.use_graphs,
                "graphs": len(self._graphs), "emit_frames": self.emit_frames,
                "capture_seconds": round(self.capture_seconds, 2)}

    def submit(self, request: SynthesisRequest):
        if request.params.repetition_window > MAX_REPETITION_WINDOW:
            raise EngineError(f"repetition_window {request.params.repetition_window} exceeds "
                              f"{MAX_REPETITION_WINDOW} (graph engine)")
        return super().submit(request)

    async def start(self) -> None:
        import asyncio  # noqa: PLC0415

        if self.gil_switch_interval is not None and self.cuda:
            import sys  # noqa: PLC0415

            sys.setswitchinterval(min(sys.getswitchinterval(), self.gil_switch_interval))
        await super().start()
        await asyncio.to_thread(self._ready.wait)
        if self._start_error is not None:
            raise EngineError(f"graph engine failed to start: {self._start_error}") from self._start_error

    # -- set-up (worker thread) --------------------------------------------------------------

    def _setup(self) -> None:
        self.model.gpt.embed.fuse_weight_norm()  # no re-normalisation inside the graphs
        self._state = SlotState(self.model.gpt, self.max_num_seqs, self.max_model_len, self.model.device)
        if self.use_graphs:
            began = time.monotonic()
            self._capture_all()
            self.capture_seconds = time.monotonic() - began
            log.info("captured %d decode graphs in %.1f s", len(self._graphs), self.capture_seconds)
        self._state.reset_sampling()

    def _capture_all(self) -> None:
        gpt, state, eos = self.model.gpt, self._state, self._eos
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device=self.model.device)
        # Largest first, so smaller graphs reuse the shared pool's blocks.
        for batch in reversed(self.batch_buckets):
            for length in reversed(self.length_buckets):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    decode_step(gpt, state, batch, length, eos)  # warm-up: kernels chosen, workspaces made
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    decode_step(gpt, state, batch, length, eos)
                self._graphs[(batch, length)] = graph
        torch.cuda.synchronize()

    # -- the worker thread -------------------------------------------------------------------

    def _worker(self) -> None:
        with torch.inference_mode():
            try:
                self._setup()
            except BaseException as err:  # noqa: BLE001  (reported to start())
                log.exception("graph engine set-up failed")
                self._start_error = err
                self._ready.set()
                return
            self._ready.set()
            in_flight: list[_Output] = []
            while True:
                with self._cond:
                    while (not self._stopping and not self._waiting and not self._running and not self._aborted
                           and not in_flight):
                        self._cond.wait()
                    if self._stopping:
                        return
                    aborted, self._aborted = self._aborted, set()
                    if aborted:
                        self._waiting = type(self._waiting)(s for s in self._waiting
                                                            if s.request.request_id not in aborted)
                    admitted = []
                    if self._admit_now():
                        while self._waiting and len(self._running) + len(admitted) < self.max_num_seqs:
                            admitted.append(self._waiting.popleft())
                events: list[tuple[str, FrameChunk]] = []
                try:
                    for seq in self._running:
                        if seq.request.request_id in aborted and not seq.done:
                            self._finish(seq, "aborted", events)
                    self._release_done()
                    launched: list[_Output] = []
                    if admitted:
                        launched.append(self._prefill(admitted))
                    if self._running:
                        launched.append(self._launch_step())
                    # Read the previous iteration's frames while the GPU runs this one.
                    for out in in_flight:
                        self._accept(out, events)
                    in_flight = launched
                    if not self._running:  # nothing left to launch: drain what is in flight now
                        for out in in_flight:
                            self._accept(out, events)
                        in_flight = []
                    self._release_done()
                except Exception as err:  # keep serving: fail what was in flight, start clean
                    log.exception("generation step failed")
                    for seq in self._running + [s for s in admitted if s not in self._running]:
                        if not seq.done:
                            seq.done = True
                            events.append((seq.request.request_id,
                                           FrameChunk(self._empty(), finished=True, finish_reason="error",
                                                      error=str(err))))
                    self._running = []
                    self._free = list(range(self.max_num_seqs))
                    in_flight = []
                if events and self._loop is not None:
                    try:
                        self._loop.call_soon_threadsafe(self._deliver, events)
                    except RuntimeError:  # the event loop is gone: nobody is listening any more
                        return

    def _admit_now(self) -> bool:
        if not self._waiting:
            return False
        if not self._running:
            return True
        return time.monotonic() - self._waiting[0].request.arrival >= self.admit_interval

    def _release_done(self) -> None:
        if any(s.done for s in self._running):
            for seq in self._running:
                if seq.done:
                    heapq.heappush(self._free, seq.slot)
            self._running = [s for s in self._running if not s.done]

    def _prefill(self, seqs: list[_Sequence]) -> _Output:
        now = time.monotonic()
        model, state = self.model, self._state
        slotted = []
        for seq in seqs:
            self.observer.on_scheduled(seq.request, now - seq.request.arrival)
            slotted.append(_Slotted(seq.request, seq.generator, slot=heapq.heappop(self._free)))
        embeds = [model.gpt.prompt_embeds(s.request.prompt_ids,
                                          torch.from_numpy(s.request.speaker) if s.request.speaker is not None
                                          else None, model.tokenizer.spk_emb_id)[0] for s in slotted]
        slots = torch.tensor([s.slot for s in slotted], device=model.device)
        seeds = [s.generator.initial_seed() if s.generator is not None else 0 for s in slotted]
        for seq, e in zip(slotted, embeds):
            seq.position = e.shape[0]
        state.load_requests(slots, [s.request.params for s in slotted], seeds, [s.position for s in slotted])
        prefill_slots(model.gpt, state, slots, embeds, self._eos)
        self.observer.on_step(len(slotted))
        self._running.extend(slotted)
        entries = [(seq, seq.position, row) for row, seq in enumerate(slotted)]
        want_hidden = any(s.request.want_hidden for s in slotted)
        return self._to_host(entries, state.codes[slots], state.hidden[slots] if want_hidden else None)

    def _launch_step(self) -> _Output:
        state = self._state
        top_slot = max(s.slot for s in self._running)
        batch = pick_bucket(self.batch_buckets, top_slot + 1)
        need = max(min(s.position, self.max_model_len - 1) for s in self._running) + 1
        length = pick_bucket(self.length_buckets, need)
        graph = self._graphs.get((batch, length))
        if graph is not None:
            graph.replay()
        else:
            decode_step(self.model.gpt, state, batch, length, self._eos)
        self.steps += 1
        self.observer.on_step(len(self._running))
        for seq in self._running:
            seq.position += 1
        entries = [(seq, seq.position, seq.slot) for seq in self._running]
        want_hidden = any(s.request.want_hidden for s in self._running)
        return self._to_host(entries, state.codes[:batch], state.hidden[:batch] if want_hidden else None)

    def _to_host(self, entries, codes: torch.Tensor, hidden: torch.Tensor | None) -> _Output:
        if not self.cuda:
            return _Output(entries, codes.clone(), hidden.clone() if hidden is not None else None)
        codes_host = torch.empty(codes.shape, dtype=codes.dtype, pin_memory=True)
        codes_host.copy_(codes, non_blocking=True)
        hidden_host = None
        if hidden is not None:
            hidden_host = torch.empty(hidden.shape, dtype=hidden.dtype, pin_memory=True)
            hidden_host.copy_(hidden, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return _Output(entries, codes_host, hidden_host, event)

    def _accept(self, out: _Output, events: list[tuple[str, FrameChunk]]) -> None:
        codes, hidden = out.fetch()
        ended = (codes == self._eos).any(axis=1).tolist()  # one pass for the whole step
        for seq, position, row in out.entries:
            if seq.done:  # ended or aborted after this step was launched
                continue
            frame = codes[row]
            if ended[row]:
                self._finish(seq, "eos", events)
                continue
            seq.count += 1
            seq.pending.append(frame.copy())
            if seq.request.want_hidden and hidden is not None:
                seq.pending_hidden.append(hidden[row].copy())
            if seq.count >= seq.request.params.max_new_frames or position + 1 > self.max_model_len:
                self._finish(seq, "length", events)
            elif len(seq.pending) >= self.emit_frames:
                events.append((seq.request.request_id, self._chunk(seq)))

    def _chunk(self, seq: _Slotted, reason: str | None = None) -> FrameChunk:
        codes = np.stack(seq.pending).astype(np.int64) if seq.pending else self._empty()
        hidden = np.stack(seq.pending_hidden) if seq.request.want_hidden and seq.pending_hidden else None
        seq.pending, seq.pending_hidden = [], []
        return FrameChunk(codes, hidden, finished=reason is not None, finish_reason=reason)

    def _finish(self, seq: _Slotted, reason: str, events: list[tuple[str, FrameChunk]]) -> None:
        seq.done = True
        if reason == "aborted":
            seq.pending, seq.pending_hidden = [], []
        events.append((seq.request.request_id, self._chunk(seq, reason)))
