"""The configuration contract between the operator and the serving runtime.

The operator renders a ``RuntimeConfig`` into the ConfigMap that every serving pod
mounts at ``/etc/chattts/runtime.yaml``; the runtime reads it at start-up. This module
depends on pydantic and pyyaml only, so the operator can import it without torch.

Environment variables override the file: ``CHATTTS_<SECTION>__<FIELD>=value``
(double underscore between levels), e.g. ``CHATTTS_ENGINE__MAX_NUM_SEQS=32``.
Values are parsed as YAML scalars, so ``true``, ``0.8`` and ``128`` get their types.
Unknown keys, in the file or the environment, fail at start-up naming the field.
"""
from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

CONFIG_PATH = "/etc/chattts/runtime.yaml"
ENV_PREFIX = "CHATTTS_"

# vLLM flags the operator manages itself: a user's extra args may not set them.
MANAGED_ENGINE_FLAGS = frozenset({
    "--model", "--served-model-name", "--quantization", "--dtype",
    "--max-num-batched-tokens", "--max-num-seqs", "--gpu-memory-utilization",
    "--max-model-len", "--kv-cache-dtype", "--enable-prefix-caching",
    "--no-enable-prefix-caching", "--tensor-parallel-size", "--speculative-config",
    "--hf-overrides", "--disable-log-stats", "--host", "--port",
    # Set by the ChatTTS vLLM plugin itself: frames travel through logits and logprobs.
    "--skip-tokenizer-init", "--logits-processors", "--logprobs-mode", "--max-logprobs",
    "--async-scheduling", "--no-async-scheduling",
    # CUDA graphs of the Llama body only: the plugin's step is host-side Python (engines/vllm_engine.py).
    "--compilation-config", "-cc",
})


# libyaml's emitter when pyyaml has it: the operator renders this config at every change and
# the pure-Python emitter took 6 of the 8 ms of building a desired state (libyaml: 1 ms). The
# two emitters fold some long escaped strings differently; that is harmless, since the operator
# hashes the text it writes (the ConfigMap's name), never the values.
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WeightFormat(str, Enum):
    """How the model's GPT weights are stored."""

    AWQ = "awq"
    COMPRESSED_TENSORS = "compressed-tensors"
    FP16 = "fp16"


class EngineKind(str, Enum):
    """Which generation engine serves requests."""

    VLLM = "vllm"
    REFERENCE = "reference"  # plain PyTorch engine: the baseline and the equality reference
    GRAPH = "graph"  # static slot KV cache + CUDA graphs per batch/length bucket (engines/graph.py)


# The speech API's model name: one name, no path segments (it is matched against the request's
# `model` and listed in /v1/models). The operator's CRD carries the same pattern.
SERVED_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_SERVED_NAME = 128


class ModelSettings(_Strict):
    path: str = Field("/models/chattts", description="Read-only directory with the ChatTTS checkpoint.")
    format: WeightFormat = WeightFormat.FP16
    served_name: str = Field("chattts", min_length=1, max_length=MAX_SERVED_NAME, pattern=SERVED_NAME_PATTERN,
                             description="Model name answered in /v1/models.")


class EngineSettings(_Strict):
    """Every engine knob the operator exposes; names follow vLLM's EngineArgs."""

    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int = Field(64, ge=1, le=4096)
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)
    max_model_len: int = Field(2048, ge=16)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    enable_prefix_caching: bool = False
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    speculative_config: dict[str, Any] | None = None
    rope_theta: float | None = Field(None, gt=0, description="Passed to vLLM through --hf-overrides.")
    disable_log_stats: bool = Field(False, description="Keep False when autoscaling on engine metrics.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    enforce_eager: bool = False
    extra_args: list[str] = Field(default_factory=list)
    decode_attention: Literal["auto", "ragged", "padded"] = Field(
        "auto", description="Graph engine: attention of a decode step. ragged: a Triton kernel that reads "
        "each row's own context only; padded: masked scaled_dot_product_attention over the step's length "
        "bucket; auto: ragged on CUDA when Triton is installed, else padded.")
    decode_kernels: Literal["auto", "fused", "modules"] = Field(
        "auto", description="Graph engine: how a decode step runs the GPT's layers. fused: Triton kernels "
        "for the norms, the rotary embedding with the KV write, and SiLU, with the QKV and gate/up projections "
        "as one matrix product each (9 launches a layer instead of ~44; the same arithmetic, rounded where "
        "the modules round); modules: the Llama modules, as the prefill runs them; auto: fused on CUDA when "
        "Triton is installed, else modules.")
    first_audio_substeps: int = Field(
        4, ge=0, le=16, description="Graph engine: the work that stands before a response's first audio "
        "(refine-text rows, a long input's first-piece voice pass) is stepped up to this many extra times "
        "between two full decode steps, in steps over those rows alone (gathered from their slots; none while "
        "they are over half the full step); 0: never. How many follows playing_realtime.")
    playing_realtime: float = Field(
        3.0, ge=1.0, le=100.0, description="Graph engine: the pace, as a multiple of real time, that full "
        "decode steps (which every playing stream rides) keep: first-audio substeps are added while full "
        "steps come faster than this, and taken away while they come slower.")
    decode_priority: Literal["high", "normal"] = Field(
        "high", description="Graph engine on CUDA: its decode steps and prefills run on a stream of the device's "
        "highest priority and the audio windows on one of the lowest, so the step every stream waits for is "
        "not held up by audio that its listener has buffered ahead; normal: both at the default priority.")
    admit_interval_ms: float | None = Field(
        None, ge=0.0, le=1000.0, description="Graph engine: while others decode, newcomers are gathered for up "
        "to this long and prefilled together (each prefill is one more launch on every stream's critical "
        "path); an idle engine admits at once. null: 20 on CUDA, 0 on CPU.")
    refine_rows: int = Field(
        64, ge=1, le=512, description="Graph engine: the most refine-text jobs stepped at once (each holds a "
        "slot; at most max_num_seqs). A long input refines all its pieces at once, so a burst of them may "
        "wait for this room; more rows capture more step graphs (one text-head width per power of two).")
    audio_batch_rows: int = Field(
        16, ge=1, le=64, description="Graph engine: an audio window of a stream whose listener has 0.3 s or "
        "more of audio buffered ahead (not its first or last window) may wait up to audio_hold_ms for others "
        "of its shape, so that up to this many decode in one launch (a launch costs about as much at one "
        "window as at eight); 1: every window is decoded as soon as it is due. The audio is the same.")
    audio_hold_ms: float = Field(
        30.0, ge=0.0, le=500.0, description="Graph engine: the longest an audio window waits for others of "
        "its shape (audio_batch_rows); 0: none waits.")
    next_piece_grace_seconds: float = Field(
        1.0, ge=0.0, le=60.0, description="Graph/reference engine: how long a later piece of a response that "
        "is already playing may wait for a slot behind other responses' first-audio work (refine-text, a "
        "first-piece voice pass, a first piece); its listener has the current piece's audio buffered "
        "ahead. Past it, the piece is admitted by its arrival like first-audio work.")
    loop_report_seconds: float | None = Field(
        10.0, gt=0.0, le=3600.0, description="Graph engine: every this many seconds of work, one log line "
        "'engine loop: {...}' of where its decode steps' rows went (first pieces, voice passes, later "
        "pieces, refine-text, idle rows of the batch bucket), its prefills and audio windows, and the "
        "share of the worker's time spent waiting on the GPU; null: never.")
    audio_precision: Literal["float32", "tf32"] = Field(
        "tf32", description="CUDA: the matrix products of the audio decoders (DVAE or Decoder, then Vocos). "
        "tf32 (default): on tensor cores, inputs rounded to TF32's 10-bit mantissa and summed in float32, as "
        "cuDNN already runs their convolutions by default (upstream's too); the audio stays within ~65 dB SNR "
        "of float32's. float32: as upstream runs its linear layers, on CUDA cores; at hundreds of streams they "
        "are then most of the GPU's audio work. CPU: always float32.")
    process: Literal["auto", "same", "separate"] = Field(
        "auto", description="Run the graph/reference engine in a process of its own (separate) or in the "
        "speech API's (same); auto: separate for the graph engine on CUDA, where one process is "
        "bound by its interpreter lock. The vllm engine manages its own processes.")

    @model_validator(mode="after")
    def _extra_args_do_not_override_managed_flags(self) -> "EngineSettings":
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_ENGINE_FLAGS:
                raise ValueError(f"engine.extra_args may not set {flag}: it is managed; use its own field")
        return self


class ServerSettings(_Strict):
    host: str = "0.0.0.0"
    port: int = Field(8000, ge=1, le=65535)
    max_queue: int = Field(256, ge=1, description="Requests waiting beyond running ones; more get 429.")
    max_input_chars: int = Field(4096, ge=1)
    shutdown_grace_seconds: float = Field(30.0, ge=0)
    # Hostile or careless clients (see the runtime README, "Limits"):
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Larger bodies get 413, from Content-Length "
                                "before reading when the client sends one.")
    body_timeout_seconds: float = Field(10.0, gt=0, description="A body not received in this time gets 408.")
    max_json_depth: int = Field(16, ge=2, description="Deeper JSON nesting gets 400.")
    max_voice_chars: int = Field(4096, ge=16, description="Longer voice strings get 400 before decoding.")
    unknown_fields: Literal["warn", "reject"] = Field(
        "warn", description="Fields SpeechRequest does not declare: warn = ignored, named in a warning log "
        "line and the X-ChatTTS-Ignored-Fields header; reject = 400 naming the field.")
    api_keys_path: str | None = Field(
        None, description="File or directory (a mounted Kubernetes Secret) of API keys; when set, /v1/* "
        "needs 'Authorization: Bearer <key>'. Unset: the API is open.")
    api_keys_reload_seconds: float = Field(2.0, gt=0, description="How often the key files are checked "
                                           "for changes (re-read without a restart).")
    # The connection layer in front of the app (connections.py; the runtime README, "Connections"):
    max_header_bytes: int = Field(16_384, ge=1024, le=1_048_576, description="Request line and header fields "
                                  "together; more get 431 and the connection is closed.")
    max_header_count: int = Field(100, ge=8, le=10_000, description="Header fields per request; more get 431.")
    header_timeout_seconds: float = Field(10.0, gt=0, description="A request's line and headers must arrive "
                                          "within this from their first byte; else 408 and the connection closes.")
    idle_timeout_seconds: float = Field(10.0, gt=0, description="A new connection that sends no request in "
                                        "this time is closed.")
    keep_alive_timeout_seconds: float = Field(5.0, gt=0, description="A kept-alive connection with no next "
                                              "request in this time is closed.")
    send_timeout_seconds: float = Field(30.0, gt=0, description="A response whose client has read nothing for "
                                        "this long (the send buffer stays full) is aborted and its engine "
                                        "slot freed.")
    max_connections: int | None = Field(None, ge=1, description="Open connections at most; more are answered "
                                        "503 and closed, with a log line. None: the file-descriptor soft limit "
                                        "minus 128 (kept for the model, the engine and the log).")


class GenerationSettings(_Strict):
    """Defaults for audio-code sampling and streaming (ChatTTS's own defaults)."""

    temperature: float = Field(0.3, ge=0.0, le=2.0, description="0 = greedy (deterministic).")
    top_p: float = Field(0.7, gt=0.0, le=1.0)
    top_k: int = Field(20, ge=0, description="0 = off.")
    repetition_penalty: float = Field(1.05, gt=0.0)
    max_new_frames: int = Field(2048, ge=1, description="Frames per request (one frame = 21.3 ms of audio).")
    seed: int | None = Field(None, description="Fixed sampling seed; None = random per request.")
    stream_chunk_frames: int = Field(24, ge=1, description="Frames decoded to audio per streamed chunk.")
    stream_max_chunk_frames: int | None = Field(
        None, ge=1, description="Later chunks of a streamed piece grow from stream_chunk_frames, doubling, up to "
        "this many frames, each at most the frames already sent (a stream at twice real time or more never waits "
        "for its next chunk). Fewer, larger chunks decode less overlapping context: a long piece's audio is "
        "decoded ~1.4 times per frame at 96 instead of ~2.7 at 24. The first chunks stay as they are (first audio "
        "is not later). null: every chunk is stream_chunk_frames.")
    stream_lookahead_frames: int = Field(
        4, ge=0, le=16, description="A streamed chunk's audio is sent once this many frames after it are decoded "
        "too: the decoders look ahead, and audio decoded without the frames that follow is not the whole piece's "
        "(upstream's own streaming sends such audio). Streamed against whole-piece audio (full-size Decoder path, "
        "random weights): 16 dB SNR at 0, 47 dB at 4, 84 dB at 8. Each chunk, the first too, waits for this many "
        "more frames (4: 85 ms of audio, four decode steps); 0: as upstream streams.")
    audio_decoder: Literal["dvae", "decoder"] | None = Field(
        None, description="decoder: audio from the GPT's hidden states through the Decoder (upstream's default); "
        "dvae: from the codes through the DVAE. None: decoder on every engine (upstream's default; vLLM returns "
        "no hidden states, so the vllm engine's model writes each frame's hidden state into its raw-logit "
        "logprobs: hidden_size more values per frame from the engine core).")
    refine_text: bool | None = Field(
        None, description="Run upstream's refine-text pass before the audio codes. None: on for every engine "
        "(upstream's default; the graph engine runs it batched as rows of its audio steps, vllm as a second "
        "generation with the text head).")
    warmup: bool = Field(True, description="Run one short synthesis before reporting ready.")

    @model_validator(mode="after")
    def _chunks_grow_not_shrink(self) -> "GenerationSettings":
        if self.stream_max_chunk_frames is not None and self.stream_max_chunk_frames < self.stream_chunk_frames:
            raise ValueError(f"generation.stream_max_chunk_frames ({self.stream_max_chunk_frames}) is below "
                             f"stream_chunk_frames ({self.stream_chunk_frames}): chunks grow, never shrink")
        return self


class TextSettings(_Strict):
    """The text front-end (``chattts_runtime.text``): normalization and long-input splitting."""

    normalize: bool = Field(True, description="Default of the request's `normalize` (upstream's default: on).")
    homophones: bool = Field(True, description="Replace rare Chinese characters by homophones when a table is found.")
    homophones_map: str | None = Field(
        None, description="homophones_map.json to use; default: the checkpoint dir, else an installed chattts package.")
    language_normalizers: Literal["installed"] | list[Literal["wetext", "nemo"]] = Field(
        "installed", description="Normalizers that spell out numbers, dates and amounts, as upstream's examples "
        "register them: wetext (WeTextProcessing, zh), nemo (nemo_text_processing, en). installed (default): each "
        "one that is installed (the runtime image carries both; /health's upstream_data says which were found); "
        "a list: exactly those, a missing one fails the start; []: none (upstream's Chat default).")
    normalizer_grammars: str | None = Field(
        None, description="Where nemo's compiled English grammars are cached (default: the installation's "
        "share/chattts-runtime/grammars, filled at image build time); absent: compiled at start-up (minutes).")
    drop_unknown_characters: bool = Field(
        False, description="Also drop characters the checkpoint's tokenizer would turn into [UNK] (upstream keeps them).")
    frames_per_text_token: float = Field(
        16.0, gt=0.0, description="Frames budgeted per text token when cutting long input into pieces.")
    voice_from_first_piece: Literal["stream"] | StrictBool = Field(
        True, description="Upstream's long input: the first piece is generated whole and its audio becomes a "
                          "voice sample (spk_smp, its text as txt_smp) for every piece, the first one again "
                          "(true: upstream's default and output). stream: the first piece's voice pass is itself "
                          "streamed as the first piece's audio, and the other pieces are spoken in its voice "
                          "(first audio as soon as for a one-piece input; NOT upstream's output: upstream speaks "
                          "the first piece a second time, with the sample). false: each piece on its own (the "
                          "voice may drift between pieces).")


class RuntimeConfig(_Strict):
    model: ModelSettings = Field(default_factory=ModelSettings)
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    text: TextSettings = Field(default_factory=TextSettings)
    # graph: the engine measured on the GPU (bench/results/runtime-h200-*); vllm is one field away.
    engine_kind: EngineKind = EngineKind.GRAPH
    engine: EngineSettings = Field(default_factory=EngineSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="after")
    def _pipeline_fits_the_engine(self) -> "RuntimeConfig":
        if self.engine_kind != EngineKind.VLLM and self.engine.kv_cache_dtype.startswith("fp8"):
            raise ValueError(f"engine.kv_cache_dtype {self.engine.kv_cache_dtype}: the {self.engine_kind.value} "
                             "engine keeps its KV cache in the activation dtype; use auto, or the vllm engine")
        return self

    @property
    def audio_decoder(self) -> str:
        """The configured audio path, resolved for the engine (see ``GenerationSettings.audio_decoder``)."""
        if self.generation.audio_decoder is not None:
            return self.generation.audio_decoder
        return "decoder"

    @property
    def refine_text(self) -> bool:
        """Whether requests refine their text unless they say otherwise (``GenerationSettings.refine_text``)."""
        if self.generation.refine_text is not None:
            return self.generation.refine_text
        return True

    def to_yaml(self) -> str:
        return yaml.dump(self.model_dump(mode="json"), Dumper=_YAML_DUMPER, sort_keys=True)


class ConfigError(ValueError):
    """Raised with a message that names the offending field."""


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = [part.lower() for part in key[len(ENV_PREFIX):].split("__")]
        # Other CHATTTS_* variables (dev tooling) are not config unless they name a top-level field.
        if len(path) == 1 and path[0] not in RuntimeConfig.model_fields:
            continue
        node = overrides
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = yaml.safe_load(raw) if raw != "" else None
    return overrides


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> RuntimeConfig:
    """Read the config file (if any), apply environment overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = loaded
    data = _merge(data, _env_overrides(os.environ if environ is None else environ))
    try:
        return RuntimeConfig.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors()
        )
        raise ConfigError(f"invalid runtime config: {problems}") from None
