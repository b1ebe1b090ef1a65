"""Upstream ChatTTS's controls on a speech request: sampling, refine-text, audio path.

The speech API's extension fields (``service.SpeechRequest``; documented in the runtime README)
are turned here into what the pipeline runs: the audio-code ``SamplingParams``, the refine-text
``RefineParams`` (or none), and the audio path. Defaults come from the runtime config, whose own
defaults are upstream's ``Chat.infer()`` ones; what an engine cannot do is refused with the
field's name, never done differently in silence.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from chattts_runtime.config import RuntimeConfig
from chattts_runtime.model.refine import BREAK_LEVELS, LAUGH_LEVELS, ORAL_LEVELS, RefineParams, upstream_refine_sampling
from chattts_runtime.model.sampling import SamplingParams

_CONTROL = re.compile(r"\[(oral|laugh|break)_(\d)\]")
_LEVELS = {"oral": ORAL_LEVELS, "laugh": LAUGH_LEVELS, "break": BREAK_LEVELS}


class ControlError(ValueError):
    """A control the request cannot have; ``param`` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Pipeline:
    """What one request runs besides the audio codes."""

    refine: RefineParams | None  # None: the text goes to the audio pass as it is
    audio_decoder: str  # "decoder" (hidden states -> Decoder) | "dvae" (codes -> DVAE)

    @property
    def want_hidden(self) -> bool:
        return self.audio_decoder == "decoder"


def parse_refine_prompt(prompt: str) -> dict[str, int]:
    """``"[oral_2][laugh_0][break_6]"`` (any subset, any order, each once) -> levels by name."""
    levels: dict[str, int] = {}
    rest = _CONTROL.sub("", prompt).strip()
    if rest:
        raise ControlError("refine_prompt", f"refine_prompt may hold only [oral_0-9], [laugh_0-2] and "
                                            f"[break_0-7] tokens; got {rest!r}")
    for name, digit in _CONTROL.findall(prompt):
        level = int(digit)
        if name in levels:
            raise ControlError("refine_prompt", f"refine_prompt sets [{name}_k] twice")
        if level >= _LEVELS[name]:
            raise ControlError("refine_prompt", f"[{name}_{level}]: {name} levels are 0-{_LEVELS[name] - 1}")
        levels[name] = level
    return levels


def resolve_pipeline(req, config: RuntimeConfig) -> Pipeline:
    """The request's refine-text and audio path, checked against what the engine can do."""
    decoder = req.audio_decoder or config.audio_decoder
    refine_asked = any(v is not None for v in (req.refine_prompt, req.refine_oral, req.refine_laugh,
                                               req.refine_break, req.refine_temperature, req.refine_top_p,
                                               req.refine_top_k, req.refine_max_new_tokens))
    refine = config.refine_text if req.refine_text is None else req.refine_text
    if req.refine_text is False and refine_asked:
        raise ControlError("refine_text", "refine_* fields were given but refine_text is false")
    if not refine:
        return Pipeline(None, decoder)
    levels = parse_refine_prompt(req.refine_prompt) if req.refine_prompt is not None else {}
    for name, value in (("oral", req.refine_oral), ("laugh", req.refine_laugh), ("break", req.refine_break)):
        if value is not None:
            if name in levels:
                raise ControlError(f"refine_{name}", f"refine_{name} and refine_prompt both set [{name}_k]")
            levels[name] = value
    try:
        sampling = upstream_refine_sampling(temperature=req.refine_temperature, top_p=req.refine_top_p,
                                            top_k=req.refine_top_k, max_new_frames=req.refine_max_new_tokens)
        params = RefineParams(oral=levels.get("oral"), laugh=levels.get("laugh"), break_=levels.get("break"),
                              sampling=sampling)
    except ValueError as err:
        raise ControlError("refine_prompt", str(err)) from None
    return Pipeline(params, decoder)


def code_sampling(req, config: RuntimeConfig, max_frames: int) -> SamplingParams:
    """The audio-code sampling: the request's fields over the config's (upstream's) defaults.

    ``max_frames`` is what the prompt leaves of ``max_model_len``; a larger ``max_new_tokens`` is refused.
    """
    gen = config.generation
    if req.max_new_tokens is not None and req.max_new_tokens > max_frames:
        raise ControlError("max_new_tokens", f"max_new_tokens {req.max_new_tokens} does not fit: the prompt "
                                             f"leaves {max_frames} of max_model_len {config.engine.max_model_len}")
    frames = min(max_frames, req.max_new_tokens or gen.max_new_frames)
    # At least one frame: never answer with empty audio (upstream regenerates an immediate end).
    least = 1 if req.min_new_tokens is None else max(1, req.min_new_tokens)
    if least > frames:
        raise ControlError("min_new_tokens", f"min_new_tokens {least} exceeds the {frames} frames allowed")
    try:
        return SamplingParams(
            temperature=gen.temperature if req.temperature is None else req.temperature,
            top_p=gen.top_p if req.top_p is None else req.top_p,
            top_k=gen.top_k if req.top_k is None else req.top_k,
            repetition_penalty=gen.repetition_penalty if req.repetition_penalty is None else req.repetition_penalty,
            max_new_frames=frames, min_new_frames=least,
            seed=gen.seed if req.seed is None else req.seed)
    except ValueError as err:
        raise ControlError("temperature", str(err)) from None


REFINED_TEXT_HEADER = "X-ChatTTS-Refined-Text"


def refined_text_headers(refined: str | None) -> dict[str, str]:
    """The refined text as a response header: UTF-8, percent-encoded (RFC 3986), so any text is one
    valid header line; ``urllib.parse.unquote`` (or ``decodeURIComponent``) gives it back."""
    from urllib.parse import quote  # noqa: PLC0415

    return {} if refined is None else {REFINED_TEXT_HEADER: quote(refined, safe="")}


# A reference clip of at most 30 s (one code frame = 512 samples at 24 kHz).
MAX_SAMPLE_SECONDS = 30.0
MAX_SAMPLE_FRAMES = int(MAX_SAMPLE_SECONDS * 24_000) // 512


@dataclass(frozen=True)
class VoiceSample:
    """A voice from a reference clip: its codes ``[T, num_vq]`` and transcript (upstream's spk_smp, txt_smp)."""

    codes: object  # np.ndarray int64 [T, num_vq]
    text: str


def voice_sample(req, config: RuntimeConfig, sizes) -> VoiceSample | None:
    """The request's ``speaker_sample`` decoded and checked, or None."""
    if req.speaker_sample is None:
        if req.speaker_sample_text is not None:
            raise ControlError("speaker_sample_text", "speaker_sample_text needs speaker_sample")
        return None
    from chattts_runtime.model.encoder import decode_sample_codes  # noqa: PLC0415
    from chattts_runtime.model.speaker import SpeakerError  # noqa: PLC0415

    try:
        codes = decode_sample_codes(req.speaker_sample, sizes.gpt.num_vq, sizes.gpt.num_audio_tokens - 1,
                                    MAX_SAMPLE_FRAMES)
    except SpeakerError as err:
        raise ControlError("speaker_sample", str(err)) from None
    return VoiceSample(codes.T.copy(), req.speaker_sample_text or "")
