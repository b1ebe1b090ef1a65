"""The ChatTTS GPT as a vLLM model: ``ChatTTSForAudioCodes``.

vLLM runs the Llama body (its own ``LlamaModel``: paged attention, fused layers,
quantized linear layers when the checkpoint is AWQ) and owns scheduling and the KV
cache. Around it this class does what stock vLLM cannot:

* **inputs**: a prompt position is a text embedding (the ``[spk_emb]`` position carries
  the request's L2-normalised speaker vector); a generated position is the *sum* of the
  four code embeddings of the frame chosen at the previous step. The token id fed back
  by vLLM is codebook 0; codebooks 1..3 come from the request's frame history in the
  worker (``frames.FrameBook``), found through the batch rows the logits processor
  keeps and the attention metadata's ``query_start_loc``.
* **outputs**: the four code heads give four 626-way distributions; the frame is chosen
  here with the reference engine's own sampling function (``model.sampling.sample_tokens``:
  upstream's order, temperature, repetition penalty, top-p then top-k each keeping at least
  3, min/max frames), so every engine follows one definition.
  The logits handed to vLLM encode that frame (see ``layout.py``): vLLM's greedy
  sampler emits codebook 0 and the logprobs carry codebooks 1..3 to the client; on the
  Decoder path the same row carries the hidden state too.
* **refine-text**: a request whose payload names a text end id is upstream's refine pass:
  its generated ids are text ids (embedded with ``emb_text`` as the prompt is), the text head
  gives the distribution, the same sampling function chooses, and the chosen id is the token
  vLLM emits. It is an ordinary vLLM request, batched with the audio requests.

The checkpoint is the official layout: vLLM is pointed at ``<root>/asset/gpt`` (the
Llama body, AWQ or 16/32-bit) and this class reads ``<root>/asset/Embed.safetensors``.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.forward_context import get_forward_context
from vllm.model_executor.models.llama import LlamaModel
from vllm.model_executor.models.utils import PPMissingLayer, maybe_prefix

from chattts_runtime.model import config as checkpoint_layout
from chattts_runtime.model.config import CheckpointError, load_model_sizes
from chattts_runtime.model.gpt import with_speaker
from chattts_runtime.model.sampling import sample_tokens
from chattts_runtime.vllm_plugin.frames import RequestTrack, frame_book
from chattts_runtime.vllm_plugin.layout import CARRIER_LOGIT, CHOSEN_LOGIT, TokenLayout


def checkpoint_root(model_path: str | Path) -> Path:
    """``<root>/asset/gpt`` -> ``<root>``; anything else is a configuration error."""
    gpt_dir = Path(model_path).resolve()
    root = gpt_dir.parent.parent
    if (root / checkpoint_layout.GPT_DIR).resolve() != gpt_dir:
        raise CheckpointError(f"vLLM must be given the checkpoint's {checkpoint_layout.GPT_DIR} directory, "
                              f"got {model_path}")
    return root


class ChatTTSForAudioCodes(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        if get_pp_group().world_size > 1:
            raise NotImplementedError("ChatTTS on vLLM does not support pipeline parallelism")
        model_config = vllm_config.model_config
        self.root = checkpoint_root(model_config.model)
        sizes = load_model_sizes(self.root).gpt
        self.layout = TokenLayout.from_sizes(sizes)
        if model_config.hf_config.vocab_size != self.layout.vocab_size:
            raise CheckpointError(f"hf_overrides.vocab_size must be {self.layout.vocab_size} for this checkpoint "
                                  f"(text {sizes.num_text_tokens} + {sizes.num_vq} x {sizes.num_audio_tokens} codes), "
                                  f"got {model_config.hf_config.vocab_size}")
        self.num_vq = sizes.num_vq
        self.body_dtype = model_config.dtype
        self.eos = sizes.audio_eos
        self.model = LlamaModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        # Inputs are always built here: the body's own token embedding is never used.
        self.model.embed_tokens = PPMissingLayer()
        h, f32 = sizes.hidden_size, torch.float32
        # Embeddings and heads stay float32 whatever the body's dtype, as in the reference model.
        self.emb_text = nn.Embedding(sizes.num_text_tokens, h, dtype=f32)
        self.emb_code = nn.ModuleList(nn.Embedding(sizes.num_audio_tokens, h, dtype=f32)
                                      for _ in range(sizes.num_vq))
        self.head_code = nn.ModuleList(nn.Linear(h, sizes.num_audio_tokens, bias=False, dtype=f32)
                                       for _ in range(sizes.num_vq))
        self.head_text = nn.Linear(h, sizes.num_text_tokens, bias=False, dtype=f32)
        self.hidden_size = h
        self.book = frame_book()
        self._step_tracks: list[RequestTrack | None] | None = None
        # The body's input lives at one address for the engine's life: vLLM's piecewise CUDA graphs
        # replay reading the address they were captured with (as its own persistent input buffers).
        self._embeds: torch.Tensor | None = None
        self._embeds_rows = vllm_config.scheduler_config.max_num_batched_tokens

    # -- inputs ------------------------------------------------------------------------

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embeddings without per-request context (text ids; audio ids as codebook 0 only)."""
        ids = input_ids.long()
        t = self.layout.text_tokens
        text = self.emb_text(ids.clamp(0, t - 1))
        code0 = self.emb_code[0]((ids - t).clamp(0, self.layout.audio_tokens - 1))
        return torch.where((ids < t).unsqueeze(-1), text, code0)

    def _batch_rows(self) -> list[int] | None:
        """``query_start_loc`` of this step (row r owns tokens [q[r], q[r+1])), or None on dummy runs."""
        try:
            metadata = get_forward_context().attn_metadata
        except AssertionError:
            return None
        if isinstance(metadata, list):
            raise NotImplementedError("micro-batching is not supported with ChatTTS")
        if not metadata:
            return None
        qsl = getattr(next(iter(metadata.values())), "query_start_loc", None)
        return None if qsl is None else [int(v) for v in qsl.tolist()]

    def _build_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        ids = input_ids.long()
        n = ids.shape[0]
        codes = torch.zeros((n, self.num_vq), dtype=torch.long, device=ids.device)
        codes[:, 0] = (ids - lay.text_tokens).clamp(0, lay.audio_tokens - 1)
        speaker_rows: list[tuple[int, int, RequestTrack]] = []
        qsl = self._batch_rows()
        tracks = self.book.rows
        self._step_tracks = None
        if qsl is not None and len(qsl) - 1 <= len(tracks):
            pos = positions.tolist()
            step_tracks: list[RequestTrack | None] = []
            side: list[tuple[int, np.ndarray]] = []
            for r in range(len(qsl) - 1):
                start, end = qsl[r], qsl[r + 1]
                track = tracks[r]
                step_tracks.append(track)
                if track is None or end <= start:
                    continue
                track.sampling = False
                first, last = pos[start], pos[end - 1]
                # A refine-text request's generated ids are text ids: vLLM's own token ids suffice.
                for p in range(max(first, track.prompt_len), last + 1 if not track.text else 0):
                    j = p - track.prompt_len
                    if j >= len(track.frames):
                        track.broken = (f"request {track.key}: frame {j} is not in the worker's history "
                                        f"(preempted and evicted?)")
                        break
                    side.append((start + p - first, track.frames[j]))
                if first < track.prompt_len and track.speaker is not None:
                    speaker_rows.append((start, min(end, start + track.prompt_len - first), track))
                if track.sample_codes is not None and first < track.prompt_len:
                    # A voice sample's frames in the prompt: every codebook from the payload.
                    for p in range(max(first, track.text_len), min(last, track.prompt_len - 1) + 1):
                        side.append((start + p - first, track.sample_codes[p - track.text_len]))
                produced = last + 1 - track.prompt_len  # frames fed through this step
                track.sampling = produced >= 0 and produced == len(track.frames) and track.broken is None
            self._step_tracks = step_tracks
            if side:
                index = torch.tensor([i for i, _ in side], dtype=torch.long, device=ids.device)
                frames = torch.from_numpy(np.stack([f for _, f in side])).to(ids.device)
                codes[index, 1:] = frames[:, 1:]
        text = self.emb_text(ids.clamp(0, lay.text_tokens - 1))
        # Summed in codebook order, as the reference model does (bit-identical float32).
        audio = self.emb_code[0](codes[:, 0])
        for k in range(1, self.num_vq):
            audio = audio + self.emb_code[k](codes[:, k])
        embeds = torch.where((ids < lay.text_tokens).unsqueeze(-1), text, audio)
        for start, end, track in speaker_rows:
            embeds[start:end] = with_speaker(embeds[start:end], ids[start:end], track.speaker_token_id, track.speaker)
        return embeds

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self._build_inputs(input_ids, positions)
        return self.model(None, positions, intermediate_tensors, inputs_embeds=self._static_embeds(inputs_embeds))

    def _static_embeds(self, embeds: torch.Tensor) -> torch.Tensor:
        """``embeds`` copied into the persistent input buffer (a view of its first rows, same address)."""
        n = embeds.shape[0]
        buf = self._embeds
        if buf is None or buf.shape[0] < n or buf.device != embeds.device:
            # Sized once for the largest step (vLLM's profiling run comes first, before any capture).
            buf = self._embeds = torch.empty((max(n, self._embeds_rows), embeds.shape[1]), dtype=self.body_dtype,
                                             device=embeds.device)
        view = buf[:n]
        view.copy_(embeds)
        return view

    # -- outputs -----------------------------------------------------------------------

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]`` -> float32 ``[N, num_vq, num_audio_tokens]`` (as the reference model)."""
        hidden = hidden.float()
        return torch.stack([head(hidden) for head in self.head_code], dim=1)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        logits = self.code_logits(hidden_states)
        n = logits.shape[0]
        codes = logits.argmax(dim=-1)
        tracks = self._step_tracks if self._step_tracks is not None and len(self._step_tracks) == n else None
        self._step_tracks = None
        tracks = tracks or [None] * n
        audio = [i for i, t in enumerate(tracks) if t is None or not t.text]
        active = [i for i in audio if tracks[i] is not None and tracks[i].sampling]
        if active:
            chosen = sample_tokens(logits[active], [tracks[i] for i in active], self.eos)
            codes[active] = chosen.to(codes.device)
        host = codes.cpu().numpy()  # one device sync per step
        stop_rows = (host == self.eos).any(axis=1)
        for i in audio:
            track = tracks[i]
            if track is None:
                continue
            if track.broken is not None:
                stop_rows[i] = True  # end the request rather than feed it wrong codes
            elif track.sampling:
                track.sampling = False
                if not stop_rows[i]:
                    track.frames.append(host[i].astype(np.int64))
        stop = torch.from_numpy(stop_rows).to(logits.device)
        out = torch.full((n, lay.vocab_size), float("-inf"), dtype=torch.float32, device=logits.device)
        hidden_rows = [i for i in audio if tracks[i] is not None and tracks[i].want_hidden and not stop_rows[i]]
        if hidden_rows:  # the Decoder path's hidden state, read back from the logprobs (layout.py)
            out[hidden_rows, :self.hidden_size] = hidden_states[hidden_rows].float()
        offsets = lay.text_tokens + lay.audio_tokens * torch.arange(self.num_vq, device=logits.device)
        ids = codes + offsets
        first = torch.where(stop, torch.full_like(ids[:, 0], lay.stop_token), ids[:, 0])
        out.scatter_(1, ids[:, 1:], CARRIER_LOGIT)
        out.scatter_(1, first.unsqueeze(1), CHOSEN_LOGIT)
        text = [i for i, t in enumerate(tracks) if t is not None and t.text]
        if text:
            out[text] = self._refine_logits(hidden_states[text], [tracks[i] for i in text])
        return out

    def _refine_logits(self, hidden: torch.Tensor, tracks: list[RequestTrack]) -> torch.Tensor:
        """Refine-text rows: the text head, upstream's sampling, the chosen text id as the only finite logit."""
        logits = self.head_text(hidden.float())[:, None, :]  # [R, 1, T]
        chosen = logits[:, 0].argmax(dim=-1)
        sampling = [j for j, t in enumerate(tracks) if t.sampling and t.broken is None]
        for end in {tracks[j].end_id for j in sampling}:  # one end id per tokenizer: one group
            rows = [j for j in sampling if tracks[j].end_id == end]
            chosen[rows] = sample_tokens(logits[rows], [tracks[j] for j in rows], end)[:, 0].to(chosen.device)
        host = chosen.cpu().tolist()
        for j in sampling:
            tracks[j].sampling = False
            if host[j] != tracks[j].end_id:
                tracks[j].frames.append(np.array([host[j]], np.int64))
        out = torch.full((len(tracks), self.layout.vocab_size), float("-inf"), dtype=torch.float32,
                         device=hidden.device)
        out.scatter_(1, chosen.unsqueeze(1), CHOSEN_LOGIT)
        return out

    # -- weights -----------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # The Llama body from asset/gpt (plain or AWQ): names as in a transformers LlamaModel.
        body = ((name.removeprefix("model."), tensor) for name, tensor in weights if "embed_tokens." not in name)
        loaded = {f"model.{name}" for name in self.model.load_weights(body)}
        loaded |= self._load_embed()
        return loaded

    def _load_embed(self) -> set[str]:
        from safetensors.torch import load_file  # noqa: PLC0415

        path = self.root / checkpoint_layout.EMBED_WEIGHTS
        if not path.exists():
            raise CheckpointError(f"missing {path}")
        state = load_file(str(path))
        loaded: set[str] = set()

        def take(key: str) -> torch.Tensor:
            if key not in state:
                raise CheckpointError(f"{path}: missing {key}")
            return state[key].float()

        def copy(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
            if tuple(param.shape) != tuple(value.shape):
                raise CheckpointError(f"{path}: {name} has shape {tuple(value.shape)}, the model needs "
                                      f"{tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(value)
            loaded.add(name)

        copy(self.emb_text.weight, take("emb_text.weight"), "emb_text.weight")
        for k in range(self.num_vq):
            copy(self.emb_code[k].weight, take(f"emb_code.{k}.weight"), f"emb_code.{k}.weight")
            g = take(f"head_code.{k}.parametrizations.weight.original0")
            v = take(f"head_code.{k}.parametrizations.weight.original1")
            # Weight norm baked in with the op the parametrisation itself uses (identical floats).
            copy(self.head_code[k].weight, torch._weight_norm(v, g, 0), f"head_code.{k}.weight")
        g, v = take("head_text.parametrizations.weight.original0"), take("head_text.parametrizations.weight.original1")
        copy(self.head_text.weight, torch._weight_norm(v, g, 0), "head_text.weight")
        return loaded
