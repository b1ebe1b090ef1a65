"""The engine a runtime config asks for, on the device and dtype it asks for: one factory
for the speech server and the batch synthesis job. Heavy modules are imported lazily."""
from __future__ import annotations

from chattts_runtime.config import EngineKind, RuntimeConfig


def create_engine(config: RuntimeConfig, model, observer, on_failure=None):
    from chattts_runtime.audio_io import StreamWindows  # noqa: PLC0415

    kind = config.engine_kind
    if kind in (EngineKind.REFERENCE, EngineKind.GRAPH):
        kwargs = dict(max_num_seqs=config.engine.max_num_seqs, max_waiting=config.server.max_queue,
                      max_model_len=config.engine.max_model_len,
                      next_piece_grace=config.engine.next_piece_grace_seconds)
        if kind == EngineKind.GRAPH:
            # Streams get audio decoded in the engine on the speech API's window schedule; other
            # requests get frames as often as the speech API would decode them (a third of a window).
            windows = StreamWindows.of(config.generation)
            kwargs.update(emit_frames=windows.first_frames, windows=windows,
                          decode_attention=config.engine.decode_attention,
                          decode_kernels=config.engine.decode_kernels,
                          refine_rows=config.engine.refine_rows,
                          first_audio_substeps=config.engine.first_audio_substeps,
                          playing_realtime=config.engine.playing_realtime,
                          audio_batch_rows=config.engine.audio_batch_rows,
                          audio_hold=config.engine.audio_hold_ms / 1000,
                          decode_priority=config.engine.decode_priority,
                          admit_interval=(None if config.engine.admit_interval_ms is None
                                          else config.engine.admit_interval_ms / 1000),
                          stats_interval=config.engine.loop_report_seconds)
        if separate_engine_process(config, model.device.type):
            from chattts_runtime.engines.process import ChildEngine, ProcessEngine  # noqa: PLC0415

            spec = ChildEngine(kind.value, str(config.model.path), model.device.type,
                              str(model.gpt.dtype).removeprefix("torch."), kwargs, audio_tf32=model.audio_tf32)
            return ProcessEngine(spec, max_waiting=config.server.max_queue,
                                 max_model_len=config.engine.max_model_len, observer=observer,
                                 on_failure=on_failure)
        return in_process_engine(kind.value, model, observer, kwargs)
    from chattts_runtime.engines.vllm_engine import VLLMEngine  # noqa: PLC0415

    return VLLMEngine.from_config(config, model, observer)


def in_process_engine(kind: str, model, observer, kwargs: dict):
    """The graph or reference engine on ``model``, in this process: the one table by kind, used here and
    by the engine's own process (``process.py``)."""
    if kind == EngineKind.GRAPH.value:
        from chattts_runtime.engines.graph import GraphEngine  # noqa: PLC0415

        return GraphEngine(model, observer=observer, **kwargs)
    if kind == EngineKind.REFERENCE.value:
        from chattts_runtime.engines.reference import ReferenceEngine  # noqa: PLC0415

        return ReferenceEngine(model, observer=observer, **kwargs)
    raise ValueError(f"no engine kind {kind!r} runs in this process (the vllm engine has its own core)")


def separate_engine_process(config: RuntimeConfig, device: str) -> bool:
    if config.engine.process == "auto":
        return config.engine_kind == EngineKind.GRAPH and device == "cuda"
    return config.engine.process == "separate"


def resolve_device(config: RuntimeConfig) -> str:
    if config.device != "auto":
        return config.device
    import torch  # noqa: PLC0415

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_options(config: RuntimeConfig, device: str) -> dict:
    """``load_chattts``'s keyword arguments for ``config`` on ``device``."""
    return {"device": device, "dtype": resolve_dtype(config, device),
            # TF32 is a CUDA feature: on any other device the audio decoders run in float32.
            "audio_tf32": config.engine.audio_precision == "tf32" and str(device).startswith("cuda")}


def resolve_dtype(config: RuntimeConfig, device: str):
    import torch  # noqa: PLC0415

    names = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if config.engine.dtype in names:
        return names[config.engine.dtype]
    # float16 on CUDA: closer to float32 than bfloat16 in bench/results/dtype-agreement-h200-*.md, and the
    # dtype upstream itself moves its GPT to (flash-attention path); float32 elsewhere, as upstream.
    return torch.float16 if device == "cuda" else torch.float32
