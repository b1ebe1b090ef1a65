"""The ChatTTS GPT: a Llama body fed by text or summed audio-code embeddings.

Module and parameter names follow the official checkpoint so its state dicts load as
they are:

* ``asset/Embed.safetensors`` -> :class:`ChatTTSEmbed` (``emb_code.{0..3}.weight``,
  ``emb_text.weight``, ``head_text.parametrizations.weight.original{0,1}``,
  ``head_code.{0..3}.parametrizations.weight.original{0,1}``: weight-normed, g then v);
* ``asset/gpt/model.safetensors`` -> a transformers ``LlamaModel`` without its token
  embedding (``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.mlp.*``,
  ``layers.{i}.{input,post_attention}_layernorm.weight``, ``norm.weight``).

The forward pass is written here over the Llama modules (not ``LlamaModel.forward``)
so that the reference engine owns its KV cache layout (``engines/kvcache.py``): per-layer
tensors ``[batch, kv_heads, length, head_dim]`` with a boolean validity mask for left
padding, which lets requests join and leave a running batch between steps.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from chattts_runtime.model.config import GPTSizes


class ChatTTSEmbed(nn.Module):
    """Input embeddings and output heads (``asset/Embed.safetensors``)."""

    def __init__(self, sizes: GPTSizes):
        super().__init__()
        h = sizes.hidden_size
        self.num_vq = sizes.num_vq
        self.emb_code = nn.ModuleList(nn.Embedding(sizes.num_audio_tokens, h) for _ in range(sizes.num_vq))
        self.emb_text = nn.Embedding(sizes.num_text_tokens, h)
        self.head_text = weight_norm(nn.Linear(h, sizes.num_text_tokens, bias=False), name="weight")
        self.head_code = nn.ModuleList(
            weight_norm(nn.Linear(h, sizes.num_audio_tokens, bias=False), name="weight")
            for _ in range(sizes.num_vq))

    def fuse_weight_norm(self) -> None:
        """Bake g * v / |v| into plain weights: same outputs, no per-step renormalisation."""
        for head in (self.head_text, *self.head_code):
            if parametrize.is_parametrized(head, "weight"):
                parametrize.remove_parametrizations(head, "weight", leave_parametrized=True)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [..., num_vq]`` -> the sum of the codebooks' embeddings ``[..., hidden]``."""
        out = self.emb_code[0](codes[..., 0])
        for i in range(1, self.num_vq):
            out = out + self.emb_code[i](codes[..., i])
        return out

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, hidden]`` -> float32 logits ``[B, num_vq, num_audio_tokens]``."""
        hidden = hidden.float()
        return torch.stack([head(hidden) for head in self.head_code], dim=1)


def build_llama_body(sizes: GPTSizes, dtype: torch.dtype = torch.float32) -> nn.Module:
    from transformers import LlamaConfig, LlamaModel  # noqa: PLC0415  (heavy, lazy)

    config = LlamaConfig(
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_attention_heads=sizes.num_attention_heads,
        num_key_value_heads=sizes.num_key_value_heads,
        num_hidden_layers=sizes.num_hidden_layers,
        max_position_embeddings=sizes.max_position_embeddings,
        rms_norm_eps=sizes.rms_norm_eps,
        rope_theta=sizes.rope_theta,
        vocab_size=1,  # the token embedding is dropped: inputs are always embeddings
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        attn_implementation="sdpa",
    )
    body = LlamaModel(config).to(dtype)
    body.embed_tokens = None
    return body


class KVCache(Protocol):
    valid: torch.Tensor
    length: int

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def advance(self, t: int, valid: torch.Tensor | None = None) -> None: ...



def unit_speaker(speaker: torch.Tensor) -> torch.Tensor:
    """A speaker vector (``[H]``, or ``[B, H]`` rows) as the ``[spk_emb]`` position carries it: L2-normalised
    in float32, as the reference model does; the one normalisation every engine uses."""
    return F.normalize(speaker.to(torch.float32), p=2.0, dim=-1, eps=1e-12)


def with_speaker(emb: torch.Tensor, ids: torch.Tensor, speaker_token_id: int, unit: torch.Tensor) -> torch.Tensor:
    """``emb`` (``[T, H]``) with the rows at ``ids == speaker_token_id`` replaced by ``unit`` (``[H]``, from
    ``unit_speaker``): the one ``[spk_emb]`` injection of the reference model and the vLLM plugin."""
    where = (ids == speaker_token_id).unsqueeze(-1)
    return torch.where(where, unit.to(device=emb.device, dtype=emb.dtype).expand_as(emb), emb)

class ChatTTSGPT(nn.Module):
    """Embeddings + Llama body + heads, with an explicit-cache forward step."""

    def __init__(self, sizes: GPTSizes, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.sizes = sizes
        self.embed = ChatTTSEmbed(sizes).to(dtype)
        self.llama = build_llama_body(sizes, dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.llama.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.llama.norm.weight.device

    def forward_step(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        cache: "KVCache",
        new_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the body over ``T`` new positions of each row and extend ``cache`` by them.

        inputs_embeds ``[B, T, H]``; position_ids ``[B, T]``; ``cache`` holds the rows'
        earlier positions (see ``engines.kvcache.BatchKVCache``: ``valid [B, S]`` marks
        real columns, ``append(layer, k, v)`` stores new keys and returns all of them);
        ``new_valid [B, T]`` marks left padding among the new positions (batched prefill).
        Returns the final-normed hidden states ``[B, T, H]``.
        """
        llama = self.llama
        h = inputs_embeds.to(self.dtype)
        bsz, t, _ = h.shape
        new_mask = torch.ones(t, t, dtype=torch.bool, device=h.device).tril().expand(bsz, 1, t, t)
        if new_valid is not None:
            # Padding keys are hidden from real queries; a padding query sees itself only, so
            # no row of the softmax is empty (an empty row would turn into NaN and spread).
            eye = torch.eye(t, dtype=torch.bool, device=h.device)
            new_mask = (new_mask & new_valid[:, None, None, :]) | eye
        attn_mask = torch.cat((cache.valid[:, None, None, :].expand(bsz, 1, t, cache.length), new_mask), dim=-1)
        cos, sin = llama.rotary_emb(h, position_ids)
        out = self.body(h, cos, sin, attn_mask, cache.append)
        cache.advance(t, new_valid)
        return out

    def body(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
             write_kv: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
             attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """The Llama layers and final norm over ``h [B, T, H]``.

        ``write_kv(layer, k, v)`` stores the new keys/values wherever the caller keeps its
        cache and returns the keys/values to attend to; ``mask`` is the boolean attention
        mask over those. Shared by the reference engine's cache and the graph engine's slots.
        ``attend(q, keys, values)``, when given, replaces the masked ``scaled_dot_product_attention``
        (the graph engine's ragged decode kernel, which knows each row's length itself).
        """
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: PLC0415

        s = self.sizes
        b, t, _ = h.shape
        groups = s.num_attention_heads // s.num_key_value_heads
        for idx, layer in enumerate(self.llama.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(b, t, -1, s.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(b, t, -1, s.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(b, t, -1, s.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys, values = write_kv(idx, k, v)
            if attend is not None:
                o = attend(q, keys, values)
            else:
                if groups > 1:
                    keys = keys.repeat_interleave(groups, dim=1)
                    values = values.repeat_interleave(groups, dim=1)
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.llama.norm(h)

    def prompt_embeds(self, input_ids: Sequence[int], speaker: torch.Tensor | None,
                      speaker_token_id: int | None) -> torch.Tensor:
        """Text prompt -> ``[1, T, H]``; the ``[spk_emb]`` position carries the L2-normed speaker."""
        ids = torch.tensor(list(input_ids), dtype=torch.long, device=self.device)
        emb = self.embed.emb_text(ids)
        if speaker is not None and speaker_token_id is not None:
            emb = with_speaker(emb, ids, speaker_token_id, unit_speaker(speaker.to(emb.device)))
        return emb.unsqueeze(0)
