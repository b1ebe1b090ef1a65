"""Waveform -> response bytes, and streaming decode of frames to audio.

``wav`` and ``pcm`` (16-bit little-endian mono, 24 kHz) are written here with the
standard library. ``flac``, ``mp3``, ``opus`` (Ogg) and ``aac`` (ADTS) use PyAV (the
maintained FFmpeg binding, package ``av``) when it is installed; otherwise they are
refused up front with a clear 400 (:func:`check_format`).
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np

from chattts_runtime.model.config import SAMPLE_RATE

NATIVE_FORMATS = ("wav", "pcm")
ENCODED_FORMATS = {  # response_format -> (container, codec, output sample rate)
    "flac": ("flac", "flac", SAMPLE_RATE),
    "mp3": ("mp3", "libmp3lame", SAMPLE_RATE),
    "opus": ("ogg", "libopus", 48_000),  # Opus runs at 48 kHz; PyAV resamples
    "aac": ("adts", "aac", SAMPLE_RATE),
}
ALL_FORMATS = NATIVE_FORMATS + tuple(ENCODED_FORMATS)
CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg",
                 "opus": "audio/ogg", "aac": "audio/aac"}
STREAMABLE_FORMATS = ALL_FORMATS  # encoded formats stream too (AudioEncoder)


class UnsupportedFormat(ValueError):
    pass


def _pyav():
    try:
        import av  # noqa: PLC0415
    except ImportError:
        return None
    return av


def check_format(fmt: str, stream: bool) -> None:
    if fmt not in ALL_FORMATS:
        raise UnsupportedFormat(f"response_format must be one of {', '.join(ALL_FORMATS)}; got {fmt[:40]!r}")
    if fmt in ENCODED_FORMATS:
        av = _pyav()
        if av is None:
            raise UnsupportedFormat(f"response_format {fmt!r} needs the 'av' package (FFmpeg), which is not "
                                    f"installed in this runtime; use wav or pcm")
        if ENCODED_FORMATS[fmt][1] not in av.codecs_available:
            raise UnsupportedFormat(f"response_format {fmt!r}: this FFmpeg build has no "
                                    f"{ENCODED_FORMATS[fmt][1]} encoder; use wav or pcm")


def to_pcm16(samples: np.ndarray) -> bytes:
    """16-bit little-endian PCM: clipped to [-1, 1], scaled by 32767, NaN as silence.

    Every streamed chunk passes here on the speech API's event loop: one clip, one in-place scale and
    one NaN check (``np.nan_to_num`` took five passes and most of a chunk's encoding time)."""
    samples = np.asarray(samples)
    if samples.dtype.kind != "f":  # integers: scaled as floats, as before
        samples = samples.astype(np.float64)
    scaled = np.clip(samples, -1.0, 1.0)  # a new array; infinities become +-1, NaN stays NaN
    scaled *= 32767.0
    nan = np.isnan(scaled)
    if nan.any():
        scaled[nan] = 0.0
    return scaled.astype("<i2").tobytes()


def wav_header(num_samples: int | None) -> bytes:
    """44-byte RIFF header; ``None`` = unknown length (streaming), sizes set to 0xFFFFFFFF."""
    data_bytes = 0xFFFFFFFF if num_samples is None else num_samples * 2
    riff_bytes = 0xFFFFFFFF if num_samples is None else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff_bytes) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, SAMPLE_RATE, SAMPLE_RATE * 2, 2, 16)
            + b"data" + struct.pack("<I", data_bytes))


def encode(samples: np.ndarray, fmt: str) -> bytes:
    """A whole response: exact lengths in the WAV header; PyAV may seek back to finish its headers."""
    if fmt == "pcm":
        return to_pcm16(samples)
    if fmt == "wav":
        return wav_header(len(samples)) + to_pcm16(samples)
    encoder = AudioEncoder(fmt, seekable=True)
    return encoder.push(samples) + encoder.finish()


class _Sink:
    """A write-only file for PyAV: no ``seek``, so muxers write as they go and never go back."""

    def __init__(self):
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class AudioEncoder:
    """Samples in, response bytes out as soon as they are ready: one encoder per response.

    ``wav``/``pcm`` are written here (a streamed WAV header has unknown sizes, as
    ``wav_header(None)``); ``flac``/``mp3``/``opus``/``aac`` go through PyAV, which
    encodes and muxes incrementally: each :meth:`push` returns the container bytes its
    samples completed (Ogg pages are cut every 20 ms of audio so Opus is not held back a
    second). ``seekable`` (whole responses) lets PyAV rewrite headers at the end, so
    bytes then come from :meth:`finish` only. Not thread-safe; a stream's pushes are
    sequential.
    """

    OGG_PAGE_MICROSECONDS = "20000"

    def __init__(self, fmt: str, *, seekable: bool = False):
        self.fmt = fmt
        self._header_due = fmt == "wav"
        self._container = None
        if fmt not in ENCODED_FORMATS:
            return
        av = _pyav()
        container_fmt, codec, rate = ENCODED_FORMATS[fmt]
        self._file = io.BytesIO() if seekable else _Sink()
        options = {} if seekable else {"flush_packets": "1"}
        if container_fmt == "ogg" and not seekable:
            options["page_duration"] = self.OGG_PAGE_MICROSECONDS
        self._container = av.open(self._file, mode="w", format=container_fmt, options=options)
        self._stream = self._container.add_stream(codec, rate=rate)
        self._stream.layout = "mono"
        self._av = av
        self._pts = 0

    @property
    def cheap(self) -> bool:
        """PCM and WAV: a push is a cast of the samples (no codec), cheap enough for the event loop."""
        return self._container is None

    def push(self, samples: np.ndarray) -> bytes:
        if self._container is None:
            data = to_pcm16(samples)
            if self._header_due:
                data, self._header_due = wav_header(None) + data, False
            return data
        if len(samples):
            pcm = (np.clip(np.nan_to_num(samples, nan=0.0), -1.0, 1.0) * 32767.0).astype(np.int16)[None, :]
            frame = self._av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            frame.pts = self._pts
            self._pts += pcm.shape[1]
            self._mux(self._stream.encode(frame))
        return self._written()

    def finish(self) -> bytes:
        if self._container is None:
            return wav_header(None) if self._header_due else b""
        self._mux(self._stream.encode(None))
        self._container.close()
        self._container = None
        if isinstance(self._file, io.BytesIO):
            return self._file.getvalue()
        return self._file.take()

    def close(self) -> None:
        """Release the encoder (a stream its client left); nothing more is written."""
        if self._container is not None:
            container, self._container = self._container, None
            try:
                container.close()
            except Exception:  # noqa: BLE001  (a half-written container: only its memory matters)
                pass

    def _mux(self, packets) -> None:
        for packet in packets:
            self._container.mux(packet)

    def _written(self) -> bytes:
        return b"" if isinstance(self._file, io.BytesIO) else self._file.take()


@dataclass(frozen=True)
class StreamWindows:
    """When a stream's frames are decoded to audio, over which frames, and how much of it is sent.

    A window's audio is sent up to ``lookahead_frames`` before the window's end: the decoders'
    convolutions (and the ISTFT) look ahead, and audio decoded without the frames after it is
    not what the whole piece decoded at once gives there: streamed audio is 16.5 dB from the
    whole piece's without a lookahead (as upstream's own streaming sends it), 47 dB with 4
    frames, 84 dB with 8 (full-size Decoder path, random weights; bench.runtime.window_schedule).
    The next window decodes those frames again, and a piece's last window sends everything.

    The first window sends ``first_frames`` (short, for time to first audio), the next ones
    ``chunk_frames`` each. With ``max_chunk_frames`` above ``chunk_frames`` later windows
    grow: each sends the largest of ``chunk_sizes`` (``chunk_frames`` doubling up to
    ``max_chunk_frames``) that is no more than the frames its listener already has. A stream
    that runs at twice real time or more then never waits for its next window, and a long
    stream decodes each frame ~1.4 times instead of ~2.7 (fewer, larger windows re-decode
    less left context).

    Each window also decodes at least ``context_frames`` already-sent frames on its left (the
    convolution stacks need history), padded on the left to the smallest ``chunk + context +
    lookahead`` that holds them once the stream is that long: so a stream's windows take
    only a few shapes (``regular_shapes``), which is what lets an engine decode them with a
    few captured CUDA graphs. The speech API and the graph engine both follow this one
    schedule, so their audio is the same; it depends on frame counts only, never on timing.
    """

    chunk_frames: int = 24
    context_frames: int = 40
    max_chunk_frames: int | None = None  # None: every window after the first sends chunk_frames
    lookahead_frames: int = 0

    def __post_init__(self):
        if self.chunk_frames < 1 or self.context_frames < 0 or self.lookahead_frames < 0:
            raise ValueError("chunk_frames must be >= 1, context_frames and lookahead_frames >= 0")
        if self.max_chunk_frames is not None and self.max_chunk_frames < self.chunk_frames:
            raise ValueError(f"max_chunk_frames ({self.max_chunk_frames}) is below chunk_frames ({self.chunk_frames})")

    @classmethod
    def of(cls, generation) -> "StreamWindows":
        """The schedule a runtime config's ``generation`` settings ask for (one place builds it)."""
        return cls(generation.stream_chunk_frames, max_chunk_frames=generation.stream_max_chunk_frames,
                   lookahead_frames=generation.stream_lookahead_frames)

    @property
    def first_frames(self) -> int:
        return max(1, self.chunk_frames // 3)

    @property
    def window_frames(self) -> int:
        """The shortest window of a long stream: one ``chunk_frames`` chunk, its context and its lookahead."""
        return self.chunk_frames + self.context_frames + self.lookahead_frames

    @property
    def chunk_sizes(self) -> tuple[int, ...]:
        """Frames a window after the first may send: ``chunk_frames`` doubling, then ``max_chunk_frames``."""
        top = self.max_chunk_frames or self.chunk_frames
        sizes = [self.chunk_frames]
        while sizes[-1] * 2 <= top:
            sizes.append(sizes[-1] * 2)
        return tuple(sizes) if sizes[-1] == top else (*sizes, top)

    def chunk_after(self, sent: int) -> int:
        """Frames the window after ``sent`` frames' audio sends (if the stream goes on that long)."""
        if sent == 0:
            return self.first_frames
        return max([size for size in self.chunk_sizes if size <= sent] or [self.chunk_frames])

    def next_end(self, sent: int) -> int:
        """Frame count at which the window after ``sent`` frames' audio is due: its end (if the stream goes on)."""
        return sent + self.chunk_after(sent) + self.lookahead_frames

    def sent_after(self, end: int, final: bool) -> int:
        """Frames whose audio is sent once the window ending at ``end`` is (all of them after the last)."""
        return end if final else end - self.lookahead_frames

    def start(self, sent: int, end: int) -> int:
        """First frame of the window that ends at ``end`` when ``sent`` frames' audio was sent before."""
        need = end - sent + self.context_frames
        extra = self.context_frames + self.lookahead_frames
        length = min((size + extra for size in self.chunk_sizes if size + extra >= need), default=need)
        return max(0, end - length)

    def regular_shapes(self) -> list[int]:
        """Window lengths (frames) of every window but a short stream's last one."""
        shapes, sent = set(), 0
        longest = self.chunk_sizes[-1] + self.context_frames + self.lookahead_frames
        while True:
            end = self.next_end(sent)
            shapes.add(end - self.start(sent, end))
            if self.chunk_after(sent) == self.chunk_sizes[-1] and end >= longest:
                break  # every later window has this one's shape
            sent = self.sent_after(end, final=False)
        # A long stream's last window: its few new frames with the smallest shape that holds their context.
        shapes.update(size + self.context_frames + self.lookahead_frames for size in self.chunk_sizes)
        return sorted(shapes)


def unsent_samples(samples_per_frame: int, start: int, emitted: int, audio: np.ndarray,
                   through: int | None = None) -> tuple[np.ndarray, int]:
    """A window's decoded audio (window starting at frame ``start``) -> (samples not sent yet, new sent count),
    sent up to frame ``through`` (default: the window's end).

    A centred ISTFT over ``n`` frames yields ``(2n - 1) * hop`` samples: the last
    half-frame before ``through`` is only final once the next window exists, so it is never sent.
    """
    offset = start * samples_per_frame
    stop = offset + len(audio)
    if through is not None:
        stop = min(stop, through * samples_per_frame - samples_per_frame // 2)
    return audio[emitted - offset:stop - offset], max(emitted, stop)


class StreamingDecoder:
    """Frames in, the stream's audio out, window by window on a :class:`StreamWindows` schedule.

    Each window decodes its frames with real history on the left (``context_frames``) and
    sends its audio up to ``lookahead_frames`` before its end; samples already sent are never
    re-sent. ``next_window`` / ``accept`` split a step so that windows of many streams can be
    decoded in one batch (:class:`BatchedDecoder`).
    """

    def __init__(self, samples_per_frame: int, windows: StreamWindows):
        self._spf = samples_per_frame
        self._windows = windows
        self._frames: list[np.ndarray] = []
        self._emitted = 0  # samples already returned
        self._sent = 0  # frames whose audio was returned

    @property
    def pending_frames(self) -> int:
        """Frames whose audio has not been returned yet."""
        return len(self._frames) - self._sent

    def push(self, frames: np.ndarray) -> None:
        self._frames.extend(frames)

    def next_window(self, final: bool = False) -> tuple[np.ndarray, int, int, bool] | None:
        """``(frames to decode, first frame index, end, last)`` of the next window due, or None: the
        schedule's next window once its frames are here; with ``final`` (the stream has ended) the rest
        too, ``last`` for the window that sends everything."""
        total = len(self._frames)
        if total <= self._sent:
            return None
        end = self._windows.next_end(self._sent)
        if end > total:
            if not final:
                return None
            end = total
        start = self._windows.start(self._sent, end)
        return np.stack(self._frames[start:end]), start, end, final and end == total

    def accept(self, audio: np.ndarray, start: int, end: int, last: bool) -> np.ndarray:
        """The decoded window's audio -> the samples not sent yet, up to the window's lookahead."""
        through = self._windows.sent_after(end, last)
        out, self._emitted = unsent_samples(self._spf, start, self._emitted, audio, through)
        self._sent = through
        return out.astype(np.float32, copy=False)

    def take(self, decode: Callable[[np.ndarray], np.ndarray], final: bool = False) -> list[np.ndarray]:
        """Every window due, decoded with ``decode`` (frames [T, ...] -> samples): their samples."""
        out = []
        while (window := self.next_window(final)) is not None:
            frames, start, end, last = window
            out.append(self.accept(decode(frames), start, end, last))
        return out


class BatchedDecoder:
    """Decodes the windows of many streams together: one decoder/vocoder call per shape.

    Callers ``await decode(frames)``; requests arriving while a batch runs are grouped by
    window length (equal shapes give results identical to decoding one by one) and run
    as the next batch on one worker thread. Fewer, larger kernels instead of one small
    decode per stream and chunk, and the GPT's thread is not contended by many decoders.
    """

    def __init__(self, decode_batch: Callable[[np.ndarray], np.ndarray], executor, max_batch: int = 64):
        self._decode_batch = decode_batch  # frames [B, T, ...] -> samples [B, S]
        self._executor = executor
        self._max_batch = max_batch
        self._pending: dict[tuple, list] = {}
        self._busy = False

    async def decode(self, frames: np.ndarray) -> np.ndarray:
        import asyncio  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.setdefault(frames.shape, []).append((frames, future))
        if not self._busy:
            self._busy = True
            loop.call_soon(lambda: asyncio.ensure_future(self._drain()))
        return await future

    async def _drain(self) -> None:
        import asyncio  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                shape = next(iter(self._pending))
                items = self._pending[shape][:self._max_batch]
                rest = self._pending[shape][self._max_batch:]
                if rest:
                    self._pending[shape] = rest
                else:
                    del self._pending[shape]
                try:
                    audio = await loop.run_in_executor(self._executor, self._decode_batch,
                                                       np.stack([f for f, _ in items]))
                except Exception as err:  # noqa: BLE001  (handed to every waiting stream)
                    for _, fut in items:
                        if not fut.done():
                            fut.set_exception(err)
                    continue
                for (_, fut), samples in zip(items, audio):
                    if not fut.done():
                        fut.set_result(samples)
        finally:
            self._busy = False


def available_formats() -> tuple[str, ...]:
    """Formats this installation can encode (wav and pcm always)."""
    out = []
    for fmt in ALL_FORMATS:
        try:
            check_format(fmt, False)
            out.append(fmt)
        except UnsupportedFormat:
            pass
    return tuple(out)
