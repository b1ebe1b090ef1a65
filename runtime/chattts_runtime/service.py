"""Speech synthesis on top of an engine: request validation, prompts, audio decoding, metrics.

Used by the HTTP server (``server.py``) and by the offline ``synthesize`` command, so
both validate input the same way and produce the same audio.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, AsyncIterator, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from chattts_runtime.audio_io import (
    BatchedDecoder, StreamingDecoder, StreamWindows, UnsupportedFormat, check_format, encode)
from chattts_runtime.config import RuntimeConfig
from chattts_runtime.errors import APIError  # noqa: F401  (imported from here by the server)
from chattts_runtime.limits import quote
from chattts_runtime.controls import ControlError, Pipeline, VoiceSample, code_sampling, resolve_pipeline, voice_sample
from chattts_runtime.engines.base import Engine, EngineError, EngineStopped, FrameChunk, QueueFull, SynthesisRequest
from chattts_runtime.engines.schedule import Stage
from chattts_runtime.model.sampling import SamplingParams
from chattts_runtime.longform import OK_REASONS, chain_pieces, submit_admitted
from chattts_runtime.metrics import RuntimeMetrics
from chattts_runtime.model.config import SAMPLE_RATE

if TYPE_CHECKING:
    from chattts_runtime.model.prompt import Prompt

log = logging.getLogger(__name__)

MIN_SPEED, MAX_SPEED = 0.25, 4.0
MAX_SPEAKER_SAMPLE_CHARS = 16_384  # a 30 s clip's codes compress to a few thousand characters
MAX_SPEAKER_SAMPLE_TEXT_CHARS = 1_000
# OpenAI's model names are accepted as aliases of the served model, so existing clients work unchanged,
# and so are their dated snapshots (tts-1-1106, gpt-4o-mini-tts-2025-03-20, ...).
OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
_DATED_ALIAS = re.compile(r"(?:%s)(?:-\d{4}|-\d{4}-\d{2}-\d{2})" % "|".join(map(re.escape, OPENAI_MODEL_ALIASES)))
INT32_MAX = 2**31 - 1
# Frames of the piece the warm-up decodes and encodes as a voice pass would (about a second of audio).
VOICE_WARMUP_FRAMES = 48

# text.voice_from_first_piece resolved for one request: upstream's voice pass, streamed, or none.
VoiceMode = Literal["upstream", "stream", "off"]


def voice_mode(setting: "bool | str | None") -> VoiceMode:
    """``text.voice_from_first_piece`` (or the request's field) as a mode."""
    if setting == "stream":
        return "stream"
    return "upstream" if setting else "off"


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech`` body (OpenAI's fields plus ChatTTS sampling extensions).

    Strict types: ``"speed": true`` or ``"stream": "yes"`` are 400s, never read as 1.0 or true (an
    integer is a number, though)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    input: str
    voice: str
    response_format: str = "wav"
    speed: float = 1.0
    stream: bool | None = None  # None (unset): streamed, as OpenAI's endpoint; false: one whole body
    stream_format: Literal["audio", "sse"] | None = None
    instructions: str | None = None  # accepted for compatibility; ChatTTS has no instruction input
    # Extensions (not in OpenAI's API):
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # what a torch generator takes
    # Upstream ChatTTS's controls (chattts_runtime/controls.py; the runtime README documents them):
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    min_new_tokens: int | None = Field(None, ge=0, le=INT32_MAX, description="audio frames (21.3 ms each)")
    max_new_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="audio frames (21.3 ms each)")
    audio_decoder: Literal["decoder", "dvae"] | None = None
    refine_text: bool | None = None
    refine_prompt: str | None = Field(None, max_length=64)
    refine_oral: int | None = Field(None, ge=0, le=9)
    refine_laugh: int | None = Field(None, ge=0, le=2)
    refine_break: int | None = Field(None, ge=0, le=7)
    refine_temperature: float | None = Field(None, ge=0.0, le=2.0)
    refine_top_p: float | None = Field(None, gt=0.0, le=1.0)
    refine_top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    refine_max_new_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="text tokens refine may write "
                                              "(upstream's RefineTextParams.max_new_token, default 384)")
    # A voice from a reference clip (upstream's spk_smp / txt_smp): POST /v1/audio/voices makes the string.
    speaker_sample: str | None = Field(None, min_length=1, max_length=MAX_SPEAKER_SAMPLE_CHARS)
    speaker_sample_text: str | None = Field(None, max_length=MAX_SPEAKER_SAMPLE_TEXT_CHARS)
    # A long input's voice (text.voice_from_first_piece): true = upstream's (the first piece generated for
    # its voice, then spoken again with it), "stream" = that voice pass is streamed as the first piece,
    # false = every piece on its own. Unset: the server's setting.
    voice_from_first_piece: Literal["stream"] | StrictBool | None = None
    normalize: bool | None = None  # upstream's text normalization; default from text.normalize
    lang: Literal["zh", "en"] | None = None  # language for normalization; default: detected

    @property
    def streaming(self) -> bool:
        """``stream: false`` is one whole body, whatever else; ``stream_format`` says how a stream is sent."""
        return self.stream is not False


def parse_speech_request(payload: object) -> SpeechRequest:
    try:
        return SpeechRequest.model_validate(payload)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from None


# Refine-text draws from the request's seed XOR this (each piece's seed is the request's plus its index, as
# its audio's), so its random stream is not the audio pass's own; the XOR stays in the seed's int64 range.
REFINE_SEED_SALT = 0x5EED_0F_7E47


def refine_seeded(refine, seed: int | None):
    """``refine`` (RefineParams) drawing from ``seed`` (a piece's audio seed), unless it has none."""
    if seed is None:
        return refine
    return replace(refine, sampling=replace(refine.sampling, seed=seed ^ REFINE_SEED_SALT))


@dataclass
class Synthesis:
    """A validated request, ready for the engine."""

    request: SynthesisRequest
    response_format: str
    streaming: bool
    sse: bool
    pipeline: Pipeline | None = None  # None: no refine, the configured audio path (warm-up)
    text: str = ""  # the text the audio pass reads (the refined text once refine ran)
    speed: float = 1.0
    refined_text: str | None = None  # set by SpeechService.refine
    sample: VoiceSample | None = None  # a voice from a reference clip
    more: tuple[SynthesisRequest, ...] = ()  # the following pieces of a long input, in order
    texts: tuple[str, ...] = ()  # each piece's text as the tokenizer read it
    frames: int = 0  # audio frames generated for it so far (the response's output tokens)
    source: SpeechRequest | None = None  # the request it was prepared from (None: warm-up)
    voice_mode: VoiceMode = "off"  # how its pieces get the first piece's voice (prepare decides)
    # Seconds spent in each stage before the first audio (refine, voice), observed as they end.
    stages: dict[str, float] = field(default_factory=dict)
    received: float = field(default_factory=time.monotonic)  # when the request was prepared
    waited: float = 0.0  # seconds in the queues of the stages before its first piece (refine, voice pass)

    @property
    def waits_before_audio(self) -> bool:
        """Stages run before its first piece goes to the engine: refine-text, upstream's voice pass."""
        return (self.pipeline is not None and self.pipeline.refine is not None) or \
            (bool(self.more) and self.voice_mode == "upstream")

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.prompt_ids) for r in (self.request, *self.more))


def upstream_data(config: RuntimeConfig, normalizer: dict, speaker_stats) -> dict:
    """What this runtime found of the data that makes its text and voices upstream's, said once at start-up
    (logged; ``/health``'s ``upstream_data``): the homophone table, the speaker statistics (voice presets) and
    the language normalizers (numbers, dates, amounts spoken). ``missing`` names each one that the config asks
    for (the defaults ask for all) and that was not found: speech still works, but not as upstream's."""
    text = config.text
    normalizers = normalizer["language_normalizers"]
    found = {
        "homophones": normalizer["homophones_source"],
        "speaker_stats": None if speaker_stats is None else speaker_stats.source,
        "normalizers": normalizers,
    }
    missing = []
    if text.homophones and found["homophones"] is None:
        missing.append("homophones")
    if found["speaker_stats"] is None:
        missing.append("speaker_stats")
    if text.language_normalizers == "installed":
        missing += [f"normalizer_{lang}" for lang in ("zh", "en") if lang not in normalizers]
    for name in missing:
        log.warning("upstream data missing: %s (%s)", name, _MISSING[name.split("_")[0]])
    log.info("upstream data: homophones %s, speaker statistics %s, normalizers %s", found["homophones"],
             found["speaker_stats"], normalizers or "none")
    return {**found, "missing": missing}


UPSTREAM_ITEMS = ("homophones", "speaker_stats", "normalizer_zh", "normalizer_en")
_MISSING = {
    "homophones": "no homophones_map.json in text.homophones_map, the checkpoint dir or an installed chattts "
                  "package: rare Chinese characters are not replaced as upstream",
    "speaker": "no speaker statistics in the checkpoint (asset/spk_stat.pt) or an installed chattts package: "
               "voice presets answer 400, speaker strings still work",
    "normalizer": "the language normalizer is not installed (WeTextProcessing for zh, nemo_text_processing for "
                  "en): digits, dates and amounts in that language are dropped, not spoken",
}


class SpeechService:
    def __init__(self, config: RuntimeConfig, model, engine: Engine, metrics: RuntimeMetrics):
        self.config = config
        self.model = model
        self.engine = engine
        self.metrics = metrics
        self.ready = False
        self.draining = False
        self.in_flight = 0
        # One decode thread: stream windows are batched (BatchedDecoder), whole responses go one by one.
        self._decode_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chattts-decode")
        self._batched = BatchedDecoder(self._decode_batch, self._decode_pool)
        # Refine-text runs the GPT's text head one request at a time, off the event loop and the decoder.
        self._refine_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chattts-refine")
        self._refiner = None
        self._cuda_stream = None
        from chattts_runtime.text.frontend import FrontEnd  # noqa: PLC0415

        self.frontend = FrontEnd.from_config(config, model.tokenizer)
        self.refining = 0  # speech requests in refine-text: waiting for their audio (the waiting gauge)
        self.upstream_data = upstream_data(config, self.frontend.normalizer.describe(), model.speaker_stats)
        for item in UPSTREAM_ITEMS:
            metrics.upstream_data_missing.labels(item).set(int(item in self.upstream_data["missing"]))
        metrics.bind_engine(engine, waiting_before=lambda: self.refining)
        # A checkpoint whose DVAE has no encoder cannot sample a voice (said once, here).
        self._can_sample_voice = model.encoder is not None
        if config.text.voice_from_first_piece and model.encoder is None:
            log.warning("this checkpoint's DVAE has no encoder: the pieces of a long input are not voiced "
                        "from the first one as upstream's (text.voice_from_first_piece)")

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.config.model.served_name, *OPENAI_MODEL_ALIASES)

    # -- validation ------------------------------------------------------------------------

    def may_spell_out(self, req: SpeechRequest) -> bool:
        """Whether preparing ``req`` may run a language normalizer (costly: the server then prepares it
        off the event loop)."""
        normalize = self.config.text.normalize if req.normalize is None else req.normalize
        return normalize and bool(self.frontend.normalizer.language_normalizers)

    def prepare(self, req: SpeechRequest) -> Synthesis:
        if req.model not in self.model_names and not _DATED_ALIAS.fullmatch(req.model):
            raise APIError(404, f"model {quote(req.model)} is not served here; use {self.config.model.served_name!r}",
                           param="model", code="model_not_found")
        if not req.input.strip():
            raise APIError(400, "input is empty", param="input")
        limit = self.config.server.max_input_chars
        if len(req.input) > limit:
            raise APIError(400, f"input is {len(req.input)} characters; the limit is {limit}", param="input")
        if not MIN_SPEED <= req.speed <= MAX_SPEED:
            raise APIError(400, f"speed must be between {MIN_SPEED} and {MAX_SPEED}; got {req.speed}",
                           param="speed")
        if req.stream is False and req.stream_format == "sse":
            raise APIError(400, "stream_format 'sse' is a stream: it cannot be sent with stream false",
                           param="stream_format")
        try:
            check_format(req.response_format, req.streaming)
        except UnsupportedFormat as err:
            raise APIError(400, str(err), param="response_format") from None
        from chattts_runtime.model.speaker import SpeakerError  # noqa: PLC0415

        if len(req.voice) > self.config.server.max_voice_chars:
            raise APIError(400, f"voice is {len(req.voice)} characters; the limit is "
                           f"{self.config.server.max_voice_chars}", param="voice")
        try:
            speaker = self.model.speaker_for(req.voice).numpy()
        except SpeakerError as err:
            raise APIError(400, str(err), param="voice") from None
        try:
            pipeline = resolve_pipeline(req, self.config)
            sample = voice_sample(req, self.config, self.model.sizes)
        except ControlError as err:
            raise APIError(400, str(err), param=err.param) from None
        if sample is not None:
            speaker = None  # as upstream with spk_smp and no spk_emb: [empty_spk] + the clip's codes
        mode = self._voice_mode(req, sample)
        pieces = self._text_pieces(req, with_speaker=sample is None, voice_from_first=mode != "off")
        if len(pieces) == 1:
            mode = "off"
        hidden = pipeline.want_hidden
        requests = []
        for index, piece in enumerate(pieces):
            # Without a sample the front-end built this very prompt (same text, speaker tag and speed): reused.
            prompt_ids, params = self._code_prompt(req, piece.text, req.speed, sample, index, piece.max_frames,
                                                   built=piece.prompt if sample is None else None)
            requests.append(SynthesisRequest(
                request_id=f"speech-{uuid.uuid4().hex}", prompt_ids=prompt_ids, speaker=speaker,
                params=params, want_hidden=hidden, prompt_codes=None if sample is None else sample.codes,
                # Engines that decode audio in their own loop do it for streams (same windows as ours), on
                # either path, every piece of a long input on its own (as upstream decodes its pieces).
                want_audio=req.streaming and self.engine.decodes_audio,
                stage=Stage.FIRST if index == 0 else Stage.NEXT))
        if mode == "stream":  # the first piece's frames come back here: they are its voice sample too
            requests[0].want_audio = False
        return Synthesis(requests[0], req.response_format, req.streaming, req.stream_format == "sse",
                         pipeline=pipeline, text=req.input, speed=req.speed, sample=sample,
                         more=tuple(requests[1:]), texts=tuple(p.text for p in pieces), source=req,
                         voice_mode=mode)

    def _voice_mode(self, req: SpeechRequest, sample: VoiceSample | None) -> VoiceMode:
        """How a long input's pieces get the first piece's voice: never with a voice of the request's own
        (upstream too samples only without spk_smp) or without a DVAE encoder."""
        setting = self.config.text.voice_from_first_piece if req.voice_from_first_piece is None \
            else req.voice_from_first_piece
        if sample is not None or not self._can_sample_voice:
            return "off"
        return voice_mode(setting)

    def _text_pieces(self, req: SpeechRequest, *, with_speaker: bool, voice_from_first: bool):
        """Normalize and cut the input (``chattts_runtime.text``); 400 when nothing or one sentence can't fit."""
        from chattts_runtime.text.frontend import NothingToSay  # noqa: PLC0415
        from chattts_runtime.text.split import SentenceTooLong  # noqa: PLC0415

        normalize = self.config.text.normalize if req.normalize is None else req.normalize
        try:
            return self.frontend.pieces(req.input, normalize=normalize, lang=req.lang,
                                        with_speaker=with_speaker, speed=req.speed,
                                        voice_from_first=with_speaker and voice_from_first)
        except NothingToSay as err:
            raise APIError(400, str(err), param="input", code="nothing_to_synthesize") from None
        except SentenceTooLong as err:
            budget = self.frontend.budget
            most = budget.max_text_tokens(req.speed)
            raise APIError(400, f"{err}; one piece holds about {most} text tokens at most (engine.max_model_len "
                           f"{budget.max_model_len}, {budget.frames_per_text_token:g} frames budgeted per token at "
                           f"speed {req.speed:g}): add punctuation or spaces", param="input",
                           code="input_too_long") from None

    def _code_prompt(self, req: SpeechRequest, text: str, speed: float, sample: VoiceSample | None,
                     index: int = 0, piece_frames: int | None = None,
                     with_speaker: bool | None = None, built: Prompt | None = None,
                     ) -> tuple[tuple[int, ...], SamplingParams]:
        """One piece's audio prompt and sampling; ``index`` offsets a fixed seed so every piece of a
        long input gets its own draw; ``piece_frames`` is the front-end's frame budget for the piece;
        ``with_speaker`` (default: without a sample) puts the speaker tag in; ``built``: the prompt these
        arguments give, already tokenized."""
        with_speaker = sample is None if with_speaker is None else with_speaker
        prompt = built or self.model.tokenizer.build(text, with_speaker=with_speaker, speed=speed,
                                                     sample_text="" if sample is None else sample.text)
        length = len(prompt.input_ids) + (0 if sample is None else len(sample.codes))
        max_frames = self.config.engine.max_model_len - length - 1
        if max_frames < 1:
            raise APIError(400, f"input is {length} tokens: too long for max_model_len "
                           f"{self.config.engine.max_model_len}", param="input")
        try:
            params = code_sampling(req, self.config, max_frames)
        except ControlError as err:
            raise APIError(400, str(err), param=err.param) from None
        frames = params.max_new_frames if piece_frames is None else min(params.max_new_frames, piece_frames)
        params = replace(params, max_new_frames=max(frames, params.min_new_frames),
                         seed=None if params.seed is None else params.seed + index)
        return prompt.input_ids, params

    async def before_audio(self, synthesis: Synthesis, req: SpeechRequest) -> None:
        """The stages before the first piece is submitted, in order."""
        await self.refine(synthesis, req)
        await self.voice_from_first_piece(synthesis, req)

    async def refine(self, synthesis: Synthesis, req: SpeechRequest) -> None:
        """Upstream's refine-text pass, when the request runs it, piece by piece (upstream refines each
        text of its batch): the audio pass then reads the refined text."""
        if synthesis.pipeline is None or synthesis.pipeline.refine is None:
            return
        began = time.monotonic()
        self.refining += 1
        try:
            await self._refine(synthesis, req)
        finally:
            self.refining -= 1
        self._stage(synthesis, "refine", time.monotonic() - began)

    @staticmethod
    def stage_headers(synthesis: Synthesis) -> dict[str, str]:
        """The stages done before the response starts, as a ``Server-Timing`` header (milliseconds, RFC
        Server Timing syntax), and how many pieces the input became (``X-ChatTTS-Pieces``)."""
        headers = {"X-ChatTTS-Pieces": str(1 + len(synthesis.more))}
        if synthesis.stages:
            headers["Server-Timing"] = ", ".join(f"{name};dur={seconds * 1e3:.1f}"
                                                 for name, seconds in synthesis.stages.items())
        return headers

    def _stage(self, synthesis: Synthesis, stage: str, seconds: float) -> None:
        synthesis.stages[stage] = seconds
        self.metrics.first_audio_stage.labels(stage).observe(seconds)

    async def _refine(self, synthesis: Synthesis, req: SpeechRequest) -> None:
        refiner = self._text_refiner()
        loop = asyncio.get_running_loop()
        # Each piece refined with its own draw of the request's seed: the same seed, the same refined text.
        refines = [refine_seeded(synthesis.pipeline.refine, request.params.seed)
                   for request in (synthesis.request, *synthesis.more)]
        if self.engine.refines_text:  # every piece at once, batched in the engine with other requests'
            prompts = [refiner.prompt_ids(text, refine) for text, refine in zip(synthesis.texts, refines)]
            waits: list[float] = []  # each piece's wait for a slot: they wait side by side
            try:
                generated = await asyncio.gather(*(self.engine.refine_text(f"refine-{uuid.uuid4().hex}", p,
                                                                           refine.sampling, on_wait=waits.append)
                                                   for p, refine in zip(prompts, refines)))
            except QueueFull as err:
                raise APIError(429, f"server is at capacity ({err}); retry later", err_type="rate_limit_error",
                               code="queue_full",
                               headers={"Retry-After": str(max(1, round(err.retry_after)))}) from None
            except EngineStopped:
                raise APIError(503, "server is shutting down", err_type="server_error",
                               code="shutting_down") from None
            except EngineError as err:
                raise APIError(500, str(err), err_type="server_error") from None
            results = [refiner.read(g, len(p)) for g, p in zip(generated, prompts)]
            wait = max(waits, default=0.0)
        else:  # one piece after the other on the refine worker: each waits for it again
            results, wait = [], 0.0
            for text, refine in zip(synthesis.texts, refines):
                queued, started = time.monotonic(), []

                def run(text=text, refine=refine, started=started):
                    started.append(time.monotonic())
                    return refiner.refine(text, refine)

                results.append(await loop.run_in_executor(self._refine_pool, run))
                wait += started[0] - queued
        synthesis.waited += wait
        self._stage(synthesis, "refine_wait", wait)
        refined_texts = []
        for index, (request, refined) in enumerate(zip((synthesis.request, *synthesis.more), results)):
            refined_texts.append(refined.text)
            request.prompt_ids, request.params = self._code_prompt(
                req, refined.text, synthesis.speed, synthesis.sample, index, request.params.max_new_frames)
        synthesis.texts = tuple(refined_texts)
        synthesis.refined_text = synthesis.text = " ".join(refined_texts)

    async def voice_from_first_piece(self, synthesis: Synthesis, req: SpeechRequest) -> None:
        """Upstream's long input (``split_text`` and no ``spk_smp``): the first piece is generated whole,
        its audio encoded into a voice sample (``spk_smp``, the piece's text as ``txt_smp``), and then every
        piece, the first one again, is generated with the speaker and that sample. Runs after refine-text
        (the sample's text is the refined one) and before anything streams. In ``stream`` mode nothing
        happens here: the first piece itself is that voice pass (``submit``)."""
        if not synthesis.more or synthesis.voice_mode != "upstream":
            return
        began = time.monotonic()
        first = synthesis.request
        room = self._sample_room(synthesis)
        params = replace(first.params, max_new_frames=min(first.params.max_new_frames, room),
                         min_new_frames=min(first.params.min_new_frames, room))
        # Its queue wait is added to the first piece's (one observation per response, when audio starts).
        reference = replace(first, request_id=f"{first.request_id}-voice", want_audio=False, params=params,
                            arrival=time.monotonic(), stage=Stage.VOICE, counts_wait=False)
        stream = self._to_engine(reference)
        frames = []
        try:
            async for chunk in stream:
                if chunk.error:
                    raise APIError(500, f"generation failed: {chunk.error}", err_type="server_error")
                if len(chunk.codes):
                    frames.append(self._frames_of(chunk, reference.want_hidden))
        finally:
            await stream.aclose()
        generated = time.monotonic()
        if frames:  # else nothing to sample a voice from: every piece goes on its own
            await self._voice_pieces(synthesis, frames, room, (first, *synthesis.more))
        done = time.monotonic()
        self._stage(synthesis, "voice", done - began)
        # Its parts: the wait for a slot, the generation after it, then decode and encode into the sample.
        wait = reference.scheduled_after or 0.0
        synthesis.waited += wait
        self._stage(synthesis, "voice_wait", wait)
        self._stage(synthesis, "voice_generate", generated - began - wait)
        self._stage(synthesis, "voice_encode", done - generated)

    def _sample_room(self, synthesis: Synthesis) -> int:
        """Frames of the first piece that may become the voice sample: it rides in every piece's context,
        so it may take half of what the tightest piece's prompt (with the sample's text) leaves; the other
        half stays for that piece's own frames. A first piece that runs longer is cut there for the sample."""
        budget = self.frontend.budget
        room = min(budget.max_model_len - 1 - len(self.model.tokenizer.build(
            text, with_speaker=synthesis.request.speaker is not None, speed=synthesis.speed,
            sample_text=synthesis.texts[0]).input_ids) for text in synthesis.texts) // 2
        if room < 1:
            raise APIError(400, f"the pieces of this input leave no room in max_model_len {budget.max_model_len} "
                           "for the first piece's voice sample: shorten the first sentence (or turn "
                           "text.voice_from_first_piece off)", param="input")
        return room

    async def _voice_pieces(self, synthesis: Synthesis, frames: list[np.ndarray], room: int,
                            requests: tuple[SynthesisRequest, ...]) -> None:
        """The first piece's first ``room`` frames (codes, or hidden states on the Decoder path) -> its
        audio -> the voice sample, which every one of ``requests`` then prompts with."""
        audio = await self._in_pool(self._decode_frames, np.concatenate(frames)[:room])
        codes = await self.run_model(self._encode_voice, audio)
        sample = VoiceSample(codes, synthesis.texts[0])
        req = synthesis.source
        for request in requests:
            index = 0 if request is synthesis.request else 1 + synthesis.more.index(request)
            request.prompt_ids, request.params = self._code_prompt(
                req, synthesis.texts[index], synthesis.speed, sample, index, request.params.max_new_frames,
                with_speaker=request.speaker is not None)
            request.prompt_codes = sample.codes

    def _encode_voice(self, audio: np.ndarray) -> np.ndarray:
        """Audio -> its codes ``[T, num_vq]`` by the DVAE encoder (upstream's ``sample_audio_speaker``)."""
        from chattts_runtime.voices import clip_codes  # noqa: PLC0415

        return clip_codes(self.model, audio).T.copy()

    async def run_model(self, fn, *args):
        """``fn(*args)`` on the refine worker: model work besides the engine, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._refine_pool, fn, *args)

    def _text_refiner(self):
        if self._refiner is None:
            from chattts_runtime.engines.refine import TextRefiner  # noqa: PLC0415

            self._refiner = TextRefiner(self.model, max_model_len=self.config.engine.max_model_len)
        return self._refiner

    # -- generation ------------------------------------------------------------------------

    def submit(self, synthesis: Synthesis) -> AsyncIterator[FrameChunk]:
        synthesis.request.arrival = time.monotonic()
        synthesis.request.waited_before = synthesis.waited  # the scheduler metric counts every queue, once
        first = self._to_engine(synthesis.request)
        if not synthesis.more:
            return first
        if synthesis.voice_mode == "stream":
            return self._voiced_after_first(synthesis, first)
        return chain_pieces(self.engine, first, synthesis.more)

    async def _voiced_after_first(self, synthesis: Synthesis, first: AsyncIterator[FrameChunk]
                                  ) -> AsyncIterator[FrameChunk]:
        """``stream`` mode: the first piece (generated as upstream's voice pass is, without a sample) is
        streamed as it comes, its frames kept; when it ends, its first ``_sample_room`` frames become the
        voice sample (exactly the one upstream's pass would give: a pass capped there draws the same
        frames) and the other pieces follow in that voice, each as upstream speaks it."""
        hidden = synthesis.request.want_hidden
        frames: list[np.ndarray] = []
        rest = None
        try:
            async for chunk in first:
                if len(chunk.codes):
                    frames.append(self._frames_of(chunk, hidden))
                if chunk.finished and chunk.finish_reason in OK_REASONS:
                    yield FrameChunk(chunk.codes, chunk.hidden, audio=chunk.audio, piece_end=True)
                    break
                yield chunk
                if chunk.finished:
                    return
            else:
                return
            began = time.monotonic()
            try:
                if frames:
                    await self._voice_pieces(synthesis, frames, self._sample_room(synthesis), synthesis.more)
            except APIError as err:
                yield FrameChunk(np.zeros((0, 1), np.int64), finished=True, finish_reason="error", error=err.message)
                return
            self.metrics.first_audio_stage.labels("voice_sample").observe(time.monotonic() - began)
            try:
                rest = await submit_admitted(self.engine, synthesis.more[0])
            except EngineStopped:
                yield FrameChunk(np.zeros((0, 1), np.int64), finished=True, finish_reason="error",
                                 error="server is shutting down")
                return
            rest = chain_pieces(self.engine, rest, synthesis.more[1:]) if len(synthesis.more) > 1 else rest
            async for chunk in rest:
                yield chunk
        finally:
            for stream in (first, rest):
                close = getattr(stream, "aclose", None)
                if close is not None:
                    await close()

    def _to_engine(self, request: SynthesisRequest) -> AsyncIterator[FrameChunk]:
        """The engine's stream of ``request``; a full queue is a 429, a draining server or stopping engine a 503."""
        if self.draining:
            raise APIError(503, "server is shutting down", err_type="server_error", code="shutting_down")
        try:
            return self.engine.submit(request)
        except QueueFull as err:
            raise APIError(429, f"server is at capacity ({err}); retry later", err_type="rate_limit_error",
                           code="queue_full", headers={"Retry-After": str(max(1, round(err.retry_after)))}) from None
        except EngineStopped:
            raise APIError(503, "server is shutting down", err_type="server_error", code="shutting_down") from None

    def _decode_batch(self, frames: np.ndarray) -> np.ndarray:
        """``frames`` [B, T, num_vq] codes, or [B, T, hidden] hidden states on the decoder path."""
        import torch  # noqa: PLC0415

        batch = torch.from_numpy(np.ascontiguousarray(frames))
        # Integer frames are codes (DVAE path), float ones hidden states (Decoder path); the batcher
        # groups windows by shape, so one batch is always one kind.
        decode = self.model.codes_to_audio if np.issubdtype(frames.dtype, np.integer) else self.model.hidden_to_audio
        if self.model.device.type != "cuda":
            return decode(batch).numpy()
        # Its own CUDA stream: the GPT's per-step host sync does not wait for vocoder kernels.
        if self._cuda_stream is None:
            self._cuda_stream = torch.cuda.Stream(device=self.model.device)
        with torch.cuda.stream(self._cuda_stream):
            return decode(batch).cpu().numpy()

    def _decode_frames(self, frames: np.ndarray) -> np.ndarray:
        return self._decode_batch(frames[None])[0]

    async def _in_pool(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._decode_pool, fn, *args)

    @staticmethod
    def _frames_of(chunk: FrameChunk, hidden: bool) -> np.ndarray:
        return chunk.hidden if hidden and chunk.hidden is not None else chunk.codes

    def _finish(self, arrival: float, samples: int, status: str) -> None:
        seconds = samples / SAMPLE_RATE
        self.metrics.requests.labels(status).inc()
        if samples:
            self.metrics.audio_seconds.inc(seconds)
            self.metrics.rtf.observe((time.monotonic() - arrival) / seconds)

    async def synthesize(self, synthesis: Synthesis, stream: AsyncIterator[FrameChunk], *,
                         record: bool = True) -> np.ndarray:
        """Whole-utterance path: all frames, then one decode. Counted ``ok`` when ``record``; other
        outcomes (errors, a client that left) are counted by the caller that sees them."""
        req = synthesis.request
        hidden = req.want_hidden
        parts: list[np.ndarray] = []  # frames of the piece being generated
        pieces: list[np.ndarray] = []  # audio of the pieces before it: each decoded on its own, as upstream
        self.in_flight += 1
        try:
            async for chunk in stream:
                if chunk.error:
                    raise APIError(500, f"generation failed: {chunk.error}", err_type="server_error")
                if len(chunk.codes):
                    parts.append(self._frames_of(chunk, hidden))
                if chunk.piece_end or chunk.finished:
                    if parts:
                        pieces.append(await self._in_pool(self._decode_frames, np.concatenate(parts)))
                    parts = []
            audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
            if record:
                self._first_audio(synthesis)
                self._finish(synthesis.received, len(audio), "ok")
            return audio
        finally:
            self.in_flight -= 1

    async def stream_audio(self, synthesis: Synthesis, stream: AsyncIterator[FrameChunk]) -> AsyncIterator[np.ndarray]:
        """Streaming path: audio chunks as frames arrive (first chunk smaller for latency).

        Windows follow ``StreamWindows``; the engine decodes them itself when the request
        has ``want_audio``, else they are decoded here, batched across streams.
        """
        req = synthesis.request
        windows = StreamWindows.of(self.config.generation)
        decoder = StreamingDecoder(self.model.sizes.samples_per_frame, windows=windows)
        produced = 0
        status = "aborted"
        self.in_flight += 1
        try:
            async for chunk in stream:
                if chunk.error:
                    status = "error"
                    log.error("request %s failed mid-stream: %s", req.request_id, chunk.error)
                    return
                synthesis.frames += len(chunk.codes)
                # Per chunk: a piece the engine decoded brings its audio (in stream mode the first piece
                # comes as frames, its voice sample too, and the others as audio).
                out = [chunk.audio] if chunk.audio is not None else []
                if chunk.audio is None:
                    if len(chunk.codes):
                        decoder.push(self._frames_of(chunk, req.want_hidden))
                    # Windows of exactly the schedule's sizes, however many frames a chunk brings; a
                    # piece's end flushes its frames, and the next piece starts a schedule of its own.
                    ends = chunk.finished or chunk.piece_end
                    while (window := decoder.next_window(final=ends)) is not None:
                        frames, start, end, last = window
                        out.append(decoder.accept(await self._batched.decode(frames), start, end, last))
                    if chunk.piece_end:
                        decoder = StreamingDecoder(self.model.sizes.samples_per_frame, windows=windows)
                for samples in out:
                    if samples is not None and len(samples):
                        if produced == 0:
                            self._first_audio(synthesis)
                        produced += len(samples)
                        yield samples
                if chunk.finished:
                    status = "ok" if chunk.finish_reason in ("eos", "length") else chunk.finish_reason or "ok"
        finally:
            self.in_flight -= 1
            self._finish(synthesis.received, produced, status)

    def _first_audio(self, synthesis: Synthesis) -> None:
        """The response's first audio is ready: its time to first audio, and the part after the stages
        before it (the first piece's queue wait, prefill and first window)."""
        now = time.monotonic()
        req = synthesis.request
        self.metrics.ttfa.observe(now - synthesis.received)
        self._stage(synthesis, "first_window", now - req.arrival)
        if req.scheduled_after is not None:
            self._stage(synthesis, "queue", req.scheduled_after)

    def encode(self, samples: np.ndarray, fmt: str) -> bytes:
        return encode(samples, fmt)

    async def warmup(self) -> None:
        """One short greedy synthesis through the whole path, so the first user pays no start-up cost."""
        gen = self.config.generation
        prompt = self.model.tokenizer.build("warm up", with_speaker=False)
        # The configured sampling path, so its first use (kernels, allocations) is paid here.
        request = SynthesisRequest("warmup", prompt.input_ids, None, SamplingParams(
            temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k,
            repetition_penalty=gen.repetition_penalty, max_new_frames=4, min_new_frames=1, seed=0),
            want_hidden=self.config.audio_decoder == "decoder")
        synthesis = Synthesis(request, "wav", False, False)
        await self.synthesize(synthesis, self.engine.submit(request), record=False)  # not a user request
        if self.config.refine_text and self.engine.refines_text:  # the engine's refine path (prefill, rows) too
            from chattts_runtime.model.refine import RefineParams, upstream_refine_sampling  # noqa: PLC0415

            prompt_ids = self._text_refiner().prompt_ids("warm up", RefineParams())
            await self.engine.refine_text("warmup-refine", prompt_ids,
                                          upstream_refine_sampling(temperature=0, max_new_frames=4))
        if self._can_sample_voice:  # any request may ask for a long input's voice pass
            await self._warm_voice_pass()

    async def _warm_voice_pass(self) -> None:
        """The voice pass's own work, outside the engine: a whole piece decoded on the decode worker and its
        audio encoded by the DVAE encoder on the refine worker. Each is a thread of its own whose first GPU
        work (library handles, FFT plans, allocations) would else fall on the first long inputs: among the
        first three after a start, one voice pass took 0.29-0.34 s to decode and encode where the others took
        0.01-0.05 s (H100, two leases without this warm-up)."""
        hidden = self.config.audio_decoder == "decoder"
        gpt = self.model.sizes.gpt
        frames = np.zeros((VOICE_WARMUP_FRAMES, gpt.hidden_size if hidden else gpt.num_vq),
                          np.float32 if hidden else np.int64)
        audio = await self._in_pool(self._decode_frames, frames)
        await self.run_model(self._encode_voice, audio)

    async def close(self) -> None:
        await self.engine.stop()
        self._decode_pool.shutdown(wait=False)
        self._refine_pool.shutdown(wait=False)

