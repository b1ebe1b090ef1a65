"""The graph engine's captured shapes and in-loop audio, on CPU.

``pad_shapes=True`` runs prefills and audio windows padded exactly as the CUDA graphs
replay them (padding rows on the scratch slot, prompts padded to a length bucket), so
these tests guard the shapes served on a GPU. The audio a ``want_audio`` stream gets
from the engine must equal what the speech API's own decoder makes of the same frames.
"""
from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import torch

from chattts_runtime.audio_io import StreamingDecoder, StreamWindows
from chattts_runtime.engines.base import EngineError, SamplingParams
from chattts_runtime.engines.graph import GraphEngine
from chattts_runtime.engines.reference import ReferenceEngine
from rt_helpers import TEXTS, Recorder, request, run_all


@pytest.mark.parametrize("short_only", [True, False])
def test_padded_shapes_give_the_reference_codes(tiny_model, short_only):
    """Prefills padded to row/length buckets (and prompts past the largest bucket) change no code.

    Six requests arrive together: one prefill of 8 rows, 2 of them padding on the scratch
    slot; with short prompts only it is also padded to a length bucket, otherwise it runs
    at the longest prompt's exact length (past ``prefill_max_len``).
    """
    limit = 16
    candidates = TEXTS + ["ok", "yes", "no"]
    lengths = {t: len(tiny_model.tokenizer.build(t, with_speaker=True).input_ids) for t in candidates}
    texts = [t for t in candidates if lengths[t] <= limit][:6] if short_only else TEXTS[:6]
    assert len(texts) == 6 and (max(lengths[t] for t in texts) <= limit) == short_only
    params = SamplingParams(temperature=0, max_new_frames=30)
    reference, _ = asyncio.run(run_all(ReferenceEngine, tiny_model, texts, params, concurrent=False))

    async def collect(stream):
        return [c async for c in stream]

    async def together():
        rec = Recorder()
        engine = GraphEngine(tiny_model, observer=rec, max_num_seqs=8, pad_shapes=True, prefill_rows=8,
                             prefill_max_len=limit)
        await engine.start()
        try:
            with engine.requests.cond:  # the worker admits nothing until all six are queued
                streams = [engine.submit(request(tiny_model, i, t, params)) for i, t in enumerate(texts)]
            chunks = await asyncio.gather(*(collect(s) for s in streams))
        finally:
            await engine.stop()
        return chunks, rec

    chunks, rec = asyncio.run(together())
    assert rec.batches[0] == 6  # one prefill of 6 rows, padded to 8
    assert [np.concatenate([c.codes for c in cs]).tolist() for cs in chunks] == [r[0] for r in reference]
    assert [cs[-1].finish_reason for cs in chunks] == [r[2] for r in reference]


async def _streams(model, texts, params, *, want_audio: bool, want_hidden: bool = False, engine_cls=GraphEngine,
                   **engine_kw):
    engine = engine_cls(model, observer=Recorder(), **engine_kw)
    await engine.start()

    async def one(i, text):
        req = dataclasses.replace(request(model, i, text, params), want_audio=want_audio, want_hidden=want_hidden)
        return [chunk async for chunk in engine.submit(req)]

    try:
        return await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
    finally:
        await engine.stop()


def _api_decode(model, frames: np.ndarray, windows: StreamWindows) -> list[np.ndarray]:
    """The speech API's decoder over all of a stream's frames (codes, or hidden states on the Decoder
    path), chunk by chunk on the same schedule."""
    decode = model.hidden_to_audio if np.issubdtype(frames.dtype, np.floating) else model.codes_to_audio
    decoder = StreamingDecoder(model.sizes.samples_per_frame, windows=windows)
    out = []
    for i, frame in enumerate(frames):
        decoder.push(frame[None])
        out += decoder.take(lambda f: decode(torch.from_numpy(f)[None]).numpy()[0], final=i == len(frames) - 1)
    return out


@pytest.mark.parametrize("path", ["dvae", "decoder"])
@pytest.mark.parametrize("pad_shapes", [False, True])
@pytest.mark.parametrize("max_chunk, lookahead", [(None, 0), (24, 0), (24, 3)])
def test_engine_audio_equals_the_reference_engine_through_the_api_decoder(tiny_model, pad_shapes, path, max_chunk,
                                                                          lookahead):
    """Both audio paths decoded in the engine's loop give what the speech API makes of the reference
    engine's frames (codes for the DVAE, hidden states for the Decoder), window for window; with chunks of
    6 frames throughout, or growing to 12 and 24 (windows of 16 and 28 frames, and final ones of any), and
    with each window's audio sent 3 frames before its end."""
    # small windows: many per stream
    windows = StreamWindows(chunk_frames=6, context_frames=4, max_chunk_frames=max_chunk, lookahead_frames=lookahead)
    # (no repetition penalty: with it greedy streams of this checkpoint end at fewer distinct lengths)
    params = SamplingParams(temperature=0, repetition_penalty=1.0, max_new_frames=37)
    texts = TEXTS + ["ends early"]
    hidden = path == "decoder"
    reference = asyncio.run(_streams(tiny_model, texts, params, want_audio=False, want_hidden=hidden,
                                     engine_cls=ReferenceEngine, max_num_seqs=4))
    with_audio = asyncio.run(_streams(tiny_model, texts, params, want_audio=True, want_hidden=hidden, windows=windows,
                                      max_num_seqs=4, pad_shapes=pad_shapes, audio_rows=2))
    shapes_seen = set()
    for plain, audio in zip(reference, with_audio):
        codes = np.concatenate([c.codes for c in plain])
        assert np.array_equal(np.concatenate([c.codes for c in audio]), codes)  # codes still handed out
        assert all(c.hidden is None for c in audio)  # decoded here, not shipped
        assert audio[-1].finished and audio[-1].finish_reason == plain[-1].finish_reason
        frames = np.concatenate([c.hidden for c in plain if len(c.codes)]) if hidden else codes
        expected = _api_decode(tiny_model, frames, windows)
        got = [c.audio for c in audio if c.audio is not None and len(c.audio)]
        if lookahead:  # a stream that ends where a window falls due sends it as one last window, or as that
            # window and a last one of the lookahead's frames (if its end is known only after): the same audio
            assert [len(g) for g in got][:len(expected) - 1] == [len(e) for e in expected][:len(expected) - 1]
            assert len(got) - len(expected) in (0, 1)
            np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), rtol=0, atol=1e-5)
        else:
            assert [len(g) for g in got] == [len(e) for e in expected]
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, rtol=0, atol=1e-5)
        shapes_seen.add(len(codes))
    assert len(shapes_seen) > 2  # streams of several lengths: regular and irregular final windows


async def _two_waves(model, texts, params, *, hidden: bool, **engine_kw):
    """Half the streams, then (once the first has audio) the other half: their windows fall due in different
    iterations. Returns each stream's chunks and the engine."""
    engine = GraphEngine(model, observer=Recorder(), stats_interval=None, **engine_kw)
    await engine.start()
    first_audio = asyncio.Event()

    async def one(i, text):
        req = dataclasses.replace(request(model, i, text, params), want_audio=True, want_hidden=hidden)
        chunks = []
        async for chunk in engine.submit(req):
            chunks.append(chunk)
            if chunk.audio is not None and len(chunk.audio):
                first_audio.set()
        return chunks

    try:
        half = len(texts) // 2
        early = [asyncio.ensure_future(one(i, t)) for i, t in enumerate(texts[:half])]
        await first_audio.wait()
        late = [asyncio.ensure_future(one(half + i, t)) for i, t in enumerate(texts[half:])]
        return await asyncio.gather(*early, *late), engine
    finally:
        await engine.stop()


@pytest.mark.parametrize("path", ["dvae", "decoder"])
def test_windows_held_for_a_fuller_launch_give_the_same_chunks_in_the_same_order(tiny_model, path):
    """Windows that wait for others of their shape (every middle window here: any lead will do, and the hold
    never runs out) are decoded several to a launch, and each stream still gets the same chunks, in order,
    as when every window is decoded once due."""
    windows = StreamWindows(chunk_frames=4, context_frames=4)
    params = SamplingParams(temperature=0.3, seed=7, max_new_frames=40, min_new_frames=20)
    kw = dict(hidden=path == "decoder", windows=windows, max_num_seqs=8, pad_shapes=True, audio_rows=8)
    plain, plain_engine = asyncio.run(_two_waves(tiny_model, TEXTS[:6], params, audio_batch_rows=1, **kw))
    held, held_engine = asyncio.run(_two_waves(tiny_model, TEXTS[:6], params, audio_batch_rows=8, audio_hold=60.0,
                                               audio_min_lead=-1e9, **kw))
    for a, b in zip(plain, held):
        assert np.array_equal(np.concatenate([c.codes for c in a]), np.concatenate([c.codes for c in b]))
        assert a[-1].finish_reason == b[-1].finish_reason and b[-1].finished
        audio_a = [c.audio for c in a if c.audio is not None and len(c.audio)]
        audio_b = [c.audio for c in b if c.audio is not None and len(c.audio)]
        assert [len(x) for x in audio_a] == [len(x) for x in audio_b]
        for x, y in zip(audio_a, audio_b):
            np.testing.assert_allclose(y, x, rtol=0, atol=1e-5)
    plain_stats, held_stats = plain_engine._stats, held_engine._stats
    assert held_stats.audio_rows == plain_stats.audio_rows  # the same windows...
    assert held_stats.audio_launches < plain_stats.audio_launches  # ... in fewer launches
    # Every decoded window's lag is counted once, from the step that made it due to its audio handed out.
    for stats in (plain_stats, held_stats):
        assert stats.audio_windows == stats.audio_rows and 0 < stats.audio_lag <= stats.audio_windows * stats.audio_lag_max
    assert len(held_engine._hold) == 0 and held_engine.describe()["audio_batch_rows"] == 8
    assert held_engine._slots.free == 8 and not held_engine._slots.draining.any()  # every slot back


def test_first_audio_chunk_is_the_short_window(tiny_model):
    windows = StreamWindows(chunk_frames=24)
    params = SamplingParams(temperature=0.3, seed=1, max_new_frames=100, min_new_frames=100)
    [chunks] = asyncio.run(_streams(tiny_model, ["first chunk"], params, want_audio=True, windows=windows))
    spf = tiny_model.sizes.samples_per_frame
    audible = [c for c in chunks if c.audio is not None and len(c.audio)]
    # A centred ISTFT over n frames yields (2n - 1) half-frames; the last half waits for the next window.
    assert len(audible[0].audio) == windows.first_frames * spf - spf // 2
    assert sum(len(c.audio) for c in audible) == 100 * spf - spf // 2
    assert chunks[-1].finish_reason == "length"


def _snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference ** 2) / max(np.sum((reference - other) ** 2), 1e-30)))


@pytest.mark.parametrize("path", ["dvae", "decoder"])
def test_streamed_audio_is_the_whole_pieces_with_a_lookahead(tiny_model, path):
    """The engine's streamed audio against the same frames decoded whole: with the config's default 4 frames
    of lookahead each window's audio is sent once the decoders have the frames after it, and the stream is
    the whole piece's to float rounding's edge; without (0, as upstream's own streaming), every window's end
    differs."""
    from chattts_runtime.config import GenerationSettings

    hidden = path == "decoder"
    params = SamplingParams(temperature=0.3, seed=3, max_new_frames=100, min_new_frames=100)
    [plain] = asyncio.run(_streams(tiny_model, ["the whole piece"], params, want_audio=False, want_hidden=hidden))
    frames = np.concatenate([c.hidden for c in plain if len(c.codes)]) if hidden else np.concatenate(
        [c.codes for c in plain])
    decode = tiny_model.hidden_to_audio if hidden else tiny_model.codes_to_audio
    whole = decode(torch.from_numpy(frames)[None]).numpy()[0]
    snr, default = {}, GenerationSettings().stream_lookahead_frames
    for lookahead in (default, 0):
        windows = StreamWindows(chunk_frames=24, lookahead_frames=lookahead)
        [chunks] = asyncio.run(_streams(tiny_model, ["the whole piece"], params, want_audio=True, want_hidden=hidden,
                                        windows=windows))
        assert np.array_equal(np.concatenate([c.codes for c in chunks]), np.concatenate([c.codes for c in plain]))
        streamed = np.concatenate([c.audio for c in chunks if c.audio is not None])
        assert len(streamed) == len(whole)
        snr[lookahead] = _snr_db(whole, streamed)
    assert default > 0 and snr[default] >= 45 and snr[0] < 30, snr


def test_decoder_audio_needs_a_checkpoint_with_a_decoder(tiny_model):
    async def scenario():
        engine = GraphEngine(tiny_model)
        engine.hidden_audio = False  # as for a checkpoint without asset/Decoder.safetensors
        await engine.start()
        try:
            req = dataclasses.replace(request(tiny_model, 0, "x", SamplingParams()), want_audio=True,
                                      want_hidden=True)
            with pytest.raises(EngineError, match="no Decoder"):
                engine.submit(req)
        finally:
            await engine.stop()

    asyncio.run(scenario())


def test_the_runtime_config_sets_the_window_batching_and_the_admission_gathering(tiny_model):
    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.engines.factory import create_engine

    config = RuntimeConfig.model_validate({"engine_kind": "graph", "engine": {
        "process": "same", "audio_batch_rows": 8, "audio_hold_ms": 45, "admit_interval_ms": 50,
        "decode_priority": "normal", "refine_rows": 16}})
    engine = create_engine(config, tiny_model, Recorder())
    assert (engine._hold.rows, engine._hold.hold, engine.admit_interval) == (8, 0.045, 0.05)
    assert engine.describe()["decode_priority"] == "normal"
    assert engine.describe()["refine_rows"] == 16 and engine.text_widths == [8, 16]
    engine = create_engine(RuntimeConfig.model_validate({"engine_kind": "graph", "engine": {"process": "same"}}),
                           tiny_model, Recorder())
    assert (engine._hold.rows, engine._hold.hold, engine.admit_interval) == (16, 0.03, 0.0)  # the defaults, on CPU
    assert engine.refine_rows == 64
    for bad in ({"audio_batch_rows": 0}, {"audio_batch_rows": 65}, {"audio_hold_ms": -1}, {"admit_interval_ms": -5},
                {"decode_priority": "fast"}, {"refine_rows": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RuntimeConfig.model_validate({"engine": bad})
