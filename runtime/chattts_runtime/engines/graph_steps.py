"""The graph engine's GPU side: the slot state and the steps captured over it (``engines.graph``).

:class:`SlotState` holds every device buffer the captured graphs read and write (their
addresses never change); :func:`decode_step`, :func:`prefill_step` and :func:`decode_windows`
are the fixed-shape steps the engine captures once per bucket and replays (or runs eagerly on
CPU); :func:`pack_prefill` is the host side of one prefill (the rows one host->device copy
writes). Sampling (:func:`sample_slots`) is ``model.sampling`` over the slots' parameters with
counter-based uniforms (:func:`counter_uniforms`), so it runs inside a graph.
Which slots step, which requests start and when is decided on the host (``engines.slots``).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from chattts_runtime.model.gpt import unit_speaker
from chattts_runtime.model.sampling import draw, greedy_tokens, repetition_counts, token_probs

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


# Prefill metadata columns in SlotState.prefill_long, before the prompt ids.
# _PF_TEXT: how many of the prompt's positions are text; the rest (to _PF_LENGTH) are the codes of a
# voice sample (upstream's spk_smp), in SlotState.prefill_prompt_codes.
_PF_LENGTH, _PF_SLOT, _PF_SPEAKER, _PF_TOP_K, _PF_WINDOW, _PF_MIN_FRAMES, _PF_SEED, _PF_TEXT = range(8)
PF_META = 8
# ... and in SlotState.prefill_float, before the speaker vector.
_PF_TEMPERATURE, _PF_TOP_P, _PF_PENALTY = range(3)
PF_FLOAT_META = 3


class SlotState:
    """Device buffers shared by every captured graph (addresses never change).

    ``slots`` request slots plus one scratch slot (index ``slots``) for prefill padding: a KV
    cache ``[slots + 1, kv_heads, max_len, head_dim]`` per layer, the next input of each slot,
    its sampling parameters and the rings of its last ``MAX_REPETITION_WINDOW`` sampled tokens.

    A slot holds an audio stream (4 code heads, every frame kept and, for the Decoder path,
    its hidden state) or a refine-text job (the text head, one token a step; ``is_text``).
    Both kinds share one cache and one decode step: the GPT trunk is the same model, so a
    refine row costs a row of the step, not a second pass over the 20 layers; only the
    embedding and the head differ per row. Each kind keeps a repetition ring of its own
    (``history``: codes, ``vocab`` = empty; ``text_history``: text tokens, ``text_vocab`` = empty).
    """

    def __init__(self, gpt, slots: int, max_len: int, device: torch.device, prefill_rows: int,
                 audio_rows: int, hidden_audio: bool = False, text_rows: int = 64):
        s = gpt.sizes
        total = slots + 1
        self.gpt = gpt
        self.slots, self.scratch, self.max_len = slots, slots, max_len
        self.heads, self.vocab, self.text_vocab = s.num_vq, s.num_audio_tokens, s.num_text_tokens
        kv = dict(dtype=gpt.dtype, device=device)
        self.keys = [torch.zeros(total, s.num_key_value_heads, max_len, s.head_dim, **kv)
                     for _ in range(s.num_hidden_layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        lng = dict(dtype=torch.long, device=device)
        self.rows = torch.arange(total, **lng)
        self.columns = torch.arange(max_len, **lng)
        self.ring = torch.arange(MAX_REPETITION_WINDOW, **lng)
        self.codes = torch.zeros(total, self.heads, **lng)  # next step's input (a text token in column 0)
        self.position = torch.zeros(total, **lng)  # position id of the next input
        self.generated = torch.zeros(total, **lng)  # tokens sampled so far
        self.is_text = torch.zeros(total, dtype=torch.bool, device=device)
        # The slots of refine-text rows, padded with the scratch slot: a mixed step samples the text head
        # for these rows only (21k scores sorted per row: the costly part), not for the whole batch.
        self.text_index = torch.full((text_rows,), slots, **lng)
        # The slots a gathered step steps (its rows, in order), padded with the scratch slot: a first-audio
        # substep over refine rows and voice passes wherever their slots sit (decode_step(gathered=True)).
        self.gather = torch.full((total,), slots, **lng)
        self.history = torch.full((total, MAX_REPETITION_WINDOW, self.heads), self.vocab, **lng)
        self.text_history = torch.full((total, MAX_REPETITION_WINDOW, 1), self.text_vocab, **lng)
        self.hidden = torch.zeros(total, s.hidden_size, **kv)
        f32 = dict(dtype=torch.float32, device=device)
        self.temperature = torch.zeros(total, **f32)
        self.top_p = torch.ones(total, **f32)
        self.penalty = torch.ones(total, **f32)
        self.top_k = torch.zeros(total, **lng)
        self.window = torch.zeros(total, **lng)
        self.min_frames = torch.zeros(total, **lng)
        self.seed = torch.zeros(total, **lng)
        self.frames = torch.zeros(total, max_len, s.num_vq, **lng)  # for audio windows
        # The hidden state each frame was sampled from: what the Decoder path turns into audio.
        self.hidden_frames = (torch.zeros(total, max_len, s.hidden_size, **kv) if hidden_audio else None)
        # Audio window inputs: (slot, first frame) per row.
        self.audio_windows = torch.zeros(audio_rows, 2, **lng)
        # Prefill inputs (written by one host->device copy per prefill) and output.
        self.prefill_long = torch.zeros(prefill_rows, PF_META + max_len, **lng)
        self.prefill_float = torch.zeros(prefill_rows, PF_FLOAT_META + s.hidden_size, **f32)
        self.prefill_codes = torch.zeros(prefill_rows, self.heads, **lng)
        self.prefill_prompt_codes = torch.zeros(prefill_rows, max_len, s.num_vq, **lng)
        # The trunk's weights as engines.fused's decode reads them; None: decode steps run the modules.
        self.trunk = None

    def park_prefill_rows(self) -> None:
        """Every prefill row on the scratch slot with a one-token prompt (what a capture runs over)."""
        self.prefill_long[:, _PF_SLOT] = self.scratch
        self.prefill_long[:, _PF_LENGTH] = 1

    def reset_sampling(self) -> None:
        self.position.zero_()
        self.generated.zero_()
        self.codes.zero_()
        self.is_text.zero_()
        self.history.fill_(self.vocab)
        self.text_history.fill_(self.text_vocab)

    def embed(self, codes: torch.Tensor, is_text: torch.Tensor) -> torch.Tensor:
        """``codes [B, heads]`` -> input embeddings ``[B, hidden]``; rows flagged ``is_text`` embed column 0
        as a text token. Each embedding reads zeros in the rows of the other kind (a text token may lie past
        the code vocabulary), and both are clamped into their vocabularies: a slot whose refine job ended
        keeps its flag until its next prefill while the code heads write its input (its row is read by no
        one), and an out-of-range id would stop the device, not just spoil a row."""
        embed = self.gpt.embed
        audio = embed.embed_codes(torch.where(is_text[:, None], 0, codes).clamp(max=self.vocab - 1))
        text = embed.emb_text(torch.where(is_text, codes[:, 0], 0).clamp(max=self.text_vocab - 1))
        return torch.where(is_text[:, None], text.to(audio.dtype), audio)

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, hidden]`` -> float32 logits ``[B, heads, vocab]``."""
        return self.gpt.embed.code_logits(hidden)

    def text_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, hidden]`` -> float32 logits ``[B, 1, text_vocab]``."""
        return self.gpt.embed.head_text(hidden.float())[:, None, :]

    def record(self, rows, inputs: torch.Tensor, codes: torch.Tensor | None, text: torch.Tensor | None,
               hidden: torch.Tensor) -> None:
        """Keep ``inputs [B, heads]`` as the slots' next input; the code sampler's ``codes [B, heads]``
        (from ``hidden``) in the frame history and the code ring, the text sampler's ``text [B, 1]`` in
        the text ring.

        In a mixed step every row is sampled and recorded both ways (fixed shapes): a ring or frame of
        the other kind is never read, each holds only tokens of its own vocabulary, and a prefill
        resets what its new occupant reads.
        """
        # Clamped: free slots inside the batch range keep stepping; they must never index past the end.
        generated = self.generated[rows]
        index = self.rows[rows] if isinstance(rows, slice) else rows
        ring = generated % MAX_REPETITION_WINDOW
        if codes is not None:
            frame = generated.clamp(max=self.max_len - 1)
            self.frames[index, frame] = codes
            if self.hidden_frames is not None:
                self.hidden_frames[index, frame] = hidden
            self.history[index, ring] = codes
        if text is not None:
            self.text_history[index, ring] = text
        self.codes[rows] = inputs
        self.generated[rows] = generated + 1


def sample_slots(state: SlotState, rows, logits: torch.Tensor, eos: int, history: torch.Tensor) -> torch.Tensor:
    """``logits [B, heads, V]`` float32 of slots ``rows`` -> tokens ``[B, heads]``.

    ``model.sampling`` (upstream's order and limits) over the slots' parameters, fixed-shape:
    greedy rows take ``greedy_tokens`` (the repetition penalty applied), the others ``token_probs``,
    both over their last ``window`` tokens of ``history`` (its ring; ``V`` marks an empty entry),
    with one counter-based uniform per head.
    """
    b, q, v = logits.shape
    generated = state.generated[rows]
    blocked = generated < state.min_frames[rows]
    temperature = state.temperature[rows]
    greedy = temperature == 0

    # Repetition counts of each token among the row's last `window` steps.
    w = MAX_REPETITION_WINDOW
    age = (generated[:, None] - 1 - state.ring[None, :]) % w  # ring slot j holds step generated-1-age
    recent_ok = age < torch.minimum(state.window[rows], generated)[:, None]
    recent = torch.where(recent_ok[:, :, None], history[rows], v)  # v = "no token"
    counts = repetition_counts(recent, v)
    penalty = state.penalty[rows]
    greedy_codes = greedy_tokens(logits, penalty, counts, blocked, eos)
    probs, order = token_probs(
        logits, torch.where(greedy, 1.0, temperature)[:, None].expand(b, q), penalty, counts,
        state.top_p[rows], state.top_k[rows], blocked, eos)
    sampled = draw(probs, order, counter_uniforms(state.seed[rows], generated, q))
    return torch.where(greedy[:, None], greedy_codes, sampled)


def decode_step(gpt, state: SlotState, batch: int, length: int, eos: int, text_end: int | None = None,
                ragged: bool = False, text_width: int | None = None, gathered: bool = False) -> None:
    """One generation step for slots ``[0, batch)`` over KV columns ``[0, length)``; static shapes only.
    ``gathered``: for the slots ``state.gather[:batch]`` instead, wherever they sit (a first-audio substep;
    ragged attention reads their columns in place, the masked path copies them).

    With ``text_end`` the step is mixed: the slots in ``state.text_index`` (flagged ``is_text``) are
    refine-text rows (text embedding in, text head out, ``text_end`` their end token) beside the audio
    rows; every row also runs the code heads (cheap), whose output a refine row's input replaces. ``ragged``
    attends with the ragged Triton kernel (each row reads its own columns only) instead of the
    masked ``scaled_dot_product_attention`` over the bucket. ``text_width``: how many entries of the text
    index the text head reads (default: as many as the batch holds).
    """
    # rows: each row's slot; sel: the same rows as an index of the per-slot buffers.
    rows = state.gather[:batch] if gathered else state.rows[:batch]
    sel = rows if gathered else slice(0, batch)
    position = state.position[sel]
    # Always read: a slot whose refine job ended keeps its flag (and a text token as input) until its
    # next prefill, and stepping it as audio would index the code embeddings with a text token.
    is_text = state.is_text[sel]
    h = state.embed(state.codes[sel], is_text).to(gpt.dtype)[:, None, :]  # [B, 1, H]
    cos, sin = gpt.llama.rotary_emb(h, position[:, None])

    def cached(idx):
        """The key and value columns attention reads: the step's slots, or every slot when ragged attention
        gathers them itself."""
        if not gathered:
            return state.keys[idx][:batch, :, :length], state.values[idx][:batch, :, :length]
        if ragged:
            return state.keys[idx][:, :, :length], state.values[idx][:, :, :length]
        return state.keys[idx][rows, :, :length], state.values[idx][rows, :, :length]

    def write_kv(idx, k, v):
        state.keys[idx][rows, :, position] = k[:, :, 0]
        state.values[idx][rows, :, position] = v[:, :, 0]
        return cached(idx)

    mask = attend = None
    if ragged:
        from chattts_runtime.engines.attention import ragged_decode_attention  # noqa: PLC0415  (Triton)

        # A free slot's stale position may lie past the bucket: its row reads (and is) garbage, inside it.
        lengths = torch.clamp(position + 1, max=length)

        def attend(q, keys, values):
            return ragged_decode_attention(q, keys, values, lengths, length, slots=rows if gathered else None)
    else:
        mask = (state.columns[None, :length] <= position[:, None])[:, None, None, :]
    if state.trunk is not None:  # engines.fused: the same layers in 9 launches each
        from chattts_runtime.engines.fused import decode_trunk  # noqa: PLC0415  (Triton)

        groups = state.trunk.heads // state.trunk.kv_heads

        def padded(q, keys, values):
            if gathered:  # decode_trunk hands every slot over; the masked path reads the step's own
                keys, values = keys[rows], values[rows]
            if groups > 1:
                keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)

        hidden = decode_trunk(state.trunk, h[:, 0], cos, sin, position, state.keys, state.values, batch, length,
                              attend or padded, rows if gathered else None)
    else:
        hidden = gpt.body(h, cos, sin, mask, write_kv, attend)[:, 0]
    state.hidden[sel] = hidden
    codes = sample_slots(state, sel, state.code_logits(hidden), eos, state.history)
    if text_end is not None:
        # Refine rows: the text head over their hidden states; the text ring written before the counter moves.
        index = state.text_index[:min(batch, state.text_index.numel()) if text_width is None else text_width]
        text = sample_slots(state, index, state.text_logits(state.hidden[index]), text_end, state.text_history)
        state.text_history[index, state.generated[index] % MAX_REPETITION_WINDOW] = text
    state.record(sel, codes, codes, None, hidden)
    if text_end is not None:
        state.codes[index] = F.pad(text, (0, state.heads - 1))
    # Clamped so a row that already ended (read one step late) can never index past the cache.
    state.position[sel] = torch.clamp(position + 1, max=state.max_len - 1)


def prefill_step(gpt, state: SlotState, rows: int, length: int, eos: int, speaker_token: int | None,
                 text_end: int | None = None) -> None:
    """Prefill ``rows`` newcomers from ``state.prefill_*`` (prompts right-padded to ``length``); static shapes.

    Loads each newcomer's sampling parameters into its slot, embeds its prompt (the
    speaker token's position carries the L2-normed speaker vector), runs the prompt into
    the slot's KV cache and samples its first token(s) into ``state.prefill_codes``.
    With ``text_end`` the newcomers are refine-text jobs (text head, no speaker).
    Padding rows point at the scratch slot.
    """
    meta = state.prefill_long[:rows]
    floats = state.prefill_float[:rows]
    lengths, slots = meta[:, _PF_LENGTH], meta[:, _PF_SLOT]
    state.temperature[slots] = floats[:, _PF_TEMPERATURE]
    state.top_p[slots] = floats[:, _PF_TOP_P]
    state.penalty[slots] = floats[:, _PF_PENALTY]
    state.top_k[slots] = meta[:, _PF_TOP_K]
    state.window[slots] = meta[:, _PF_WINDOW]
    state.min_frames[slots] = meta[:, _PF_MIN_FRAMES]
    state.seed[slots] = meta[:, _PF_SEED]
    state.position[slots] = lengths
    # index_fill_, not ``[slots] = 0``: a Python scalar would be a host tensor inside the capture.
    state.generated.index_fill_(0, slots, 0)
    state.is_text.index_fill_(0, slots, text_end is not None)
    if text_end is None:
        state.history.index_fill_(0, slots, state.vocab)
    else:
        state.text_history.index_fill_(0, slots, state.text_vocab)

    ids = meta[:, PF_META:PF_META + length]
    h = gpt.embed.emb_text(ids).to(gpt.dtype)
    if speaker_token is not None and text_end is None:
        speaker = unit_speaker(floats[:, PF_FLOAT_META:]).to(h.dtype)
        where = (ids == speaker_token) & (meta[:, _PF_SPEAKER] > 0)[:, None]
        h = torch.where(where[..., None], speaker[:, None, :], h)
    if text_end is None:
        # A voice sample's codes follow the text, embedded as generated frames are (the reference
        # engine's prefill); for a prompt without one the test covers only its padding.
        code_at = state.columns[:length][None, :] >= meta[:, _PF_TEXT][:, None]
        sample = gpt.embed.embed_codes(state.prefill_prompt_codes[:rows, :length]).to(h.dtype)
        h = torch.where(code_at[..., None], sample, h)
    positions = state.columns[:length].expand(rows, length)
    # Causal within the prompt; padding (at the end) is never seen by a real query.
    mask = torch.ones(length, length, dtype=torch.bool, device=h.device).tril().expand(rows, 1, length, length)
    cos, sin = gpt.llama.rotary_emb(h, positions)
    cols = state.columns[:length][None, :]

    def write_kv(idx, k, v):
        state.keys[idx][slots[:, None], :, cols] = k.transpose(1, 2)
        state.values[idx][slots[:, None], :, cols] = v.transpose(1, 2)
        return k, v

    out = gpt.body(h, cos, sin, mask, write_kv)
    hidden = out[state.rows[:rows], lengths - 1]
    state.hidden[slots] = hidden
    if text_end is None:
        codes = sample_slots(state, slots, state.code_logits(hidden), eos, state.history)
        state.record(slots, codes, codes, None, hidden)
    else:
        text = sample_slots(state, slots, state.text_logits(hidden), text_end, state.text_history)
        codes = F.pad(text, (0, state.heads - 1))  # the text token in column 0
        state.record(slots, codes, None, text, hidden)
    state.prefill_codes[:rows] = codes


def decode_windows(model, state: SlotState, rows: int, frames: int, hidden: bool = False) -> torch.Tensor:
    """Audio of ``rows`` windows of ``frames`` frames, each (slot, first frame) in ``state.audio_windows``:
    from their codes (DVAE) or, with ``hidden``, from their hidden states (Decoder)."""
    windows = state.audio_windows[:rows]
    index = (windows[:, 1:2] + state.columns[None, :frames]).clamp(max=state.max_len - 1)
    if hidden:
        return model.hidden_to_audio(state.hidden_frames[windows[:, 0:1], index])
    return model.codes_to_audio(state.frames[windows[:, 0:1], index])


def pack_prefill(rows: int, length: int, speaker_width: int, scratch: int, items,
                 num_vq: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The host side of one prefill: ``items`` of (slot, prompt ids, SamplingParams, seed, speaker or None,
    voice-sample codes ``[T, num_vq]`` or None) -> ``prefill_long`` and ``prefill_float`` rows, and the
    ``prefill_prompt_codes`` rows when any item has codes (else None); padding rows point at the scratch slot."""
    meta = np.zeros((rows, PF_META + length), np.int64)
    meta[:, _PF_SLOT] = scratch
    meta[:, _PF_LENGTH] = 1
    meta[:, _PF_TEXT] = 1
    floats = np.zeros((rows, PF_FLOAT_META + speaker_width), np.float32)
    sample_codes = None
    for row, (slot, ids, p, seed, speaker, codes) in enumerate(items):
        meta[row, PF_META:PF_META + len(ids)] = ids
        total = len(ids) + (0 if codes is None else len(codes))
        meta[row, :PF_META] = (total, slot, speaker is not None, p.top_k, p.repetition_window,
                               p.min_new_frames, _signed(seed % _U64), len(ids))
        floats[row, :PF_FLOAT_META] = (p.uniform_temperature, p.top_p, p.repetition_penalty)
        if speaker is not None:
            floats[row, PF_FLOAT_META:] = speaker
        if codes is not None and len(codes):
            if sample_codes is None:
                sample_codes = np.zeros((rows, length, num_vq), np.int64)
            sample_codes[row, len(ids):total] = codes
    return meta, floats, sample_codes
