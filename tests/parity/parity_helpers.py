"""Helpers of the parity tests (the fixtures are in conftest.py)."""
from __future__ import annotations

import torch


def upstream_greedy(input_ids, logits):
    """An upstream logits processor (``(input_ids, scores) -> scores``) that keeps the argmax only:
    upstream's ``GPT.generate`` has no greedy mode, this makes its multinomial draw the argmax."""
    return torch.full_like(logits, -torch.inf).scatter_(1, logits.argmax(1, keepdim=True), 0.0)


def upstream_greedy_processors(repetition_penalty: float = 1.05, num_code: int = 625) -> tuple:
    """Upstream's own logits processors for these settings (``gen_logits``: its repetition penalty over
    the last 16 generated tokens), then the argmax: what the runtime's ``temperature: 0`` computes.
    The default penalty is upstream's ``InferCodeParams.repetition_penalty``."""
    from ChatTTS.model.processors import gen_logits  # noqa: PLC0415

    _, processors = gen_logits(num_code=num_code, top_P=None, top_K=None, repetition_penalty=repetition_penalty)
    return (*processors, upstream_greedy)


def upstream_codes(up, text: str, speaker: str, frames: int, sample_text: str | None = None):
    """Upstream's greedy audio codes for one code prompt (its own decorate, encode, embed, speaker, generate):
    the prompt ids, the codes and the hidden states. ``sample_text``: upstream's ``txt_smp`` beside the text."""
    chat = up.chat
    num_vq = up.cfg.gpt.num_vq
    prompts = chat.speaker.decorate_code_prompts([text], "[speed_5]", sample_text, speaker)
    input_ids, attention_mask, text_mask = chat.tokenizer.encode(prompts, num_vq)
    emb = chat.embed(input_ids, text_mask)
    chat.speaker.apply(emb, speaker, input_ids, chat.tokenizer.spk_emb_ids, torch.device("cpu"))
    result = next(chat.gpt.generate(
        emb, input_ids, temperature=torch.ones(num_vq), eos_token=up.cfg.gpt.num_audio_tokens - 1,
        attention_mask=attention_mask, max_new_token=frames, min_new_token=0,
        logits_processors=upstream_greedy_processors(),
        infer_text=False, return_hidden=True, stream=False, show_tqdm=False, ensure_non_empty=False))
    return input_ids[0, :, 0].tolist(), result.ids[0].numpy(), result.hiddens[0].numpy()


def run_reference(model, requests):
    """Every ``SynthesisRequest`` through the runtime's reference engine: ``[(codes, hidden)]``."""
    import asyncio  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from chattts_runtime.engines.reference import ReferenceEngine  # noqa: PLC0415

    async def run():
        engine = ReferenceEngine(model)
        await engine.start()
        try:
            out = []
            for req in requests:
                codes, hidden = [], []
                async for chunk in engine.submit(req):
                    assert chunk.error is None, chunk.error
                    codes.append(chunk.codes)
                    if chunk.hidden is not None:
                        hidden.append(chunk.hidden)
                out.append((np.concatenate(codes), np.concatenate(hidden) if hidden else None))
            return out
        finally:
            await engine.stop()

    return asyncio.run(run())
