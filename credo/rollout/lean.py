"""A lean decode step for Llama-family models (Llama, Qwen2): one token per row on a preallocated KV cache.

Transformers' generic forward spends most of a small model's decode step outside arithmetic (module dispatch,
mask construction, keyword plumbing), and its ``DynamicCache`` grows by ``torch.cat``, copying every layer's
keys and values once per generated token. :class:`LeanDecoder` runs the same layers from the same parameter
tensors (no copy: an optimizer step is seen at once) as a short loop over the model's own submodules (norms,
projections, MLPs, head: hooks and adapters on them still apply), and writes each step's keys and values in
place into a cache allocated once for the whole continuation. The prefill stays with transformers; its cache
is copied in.

Numerics follow transformers' implementation (the model's own norms and rotary module, its attention
scaling); the result equals the generic forward up to float rounding of the attention
kernel (tested: same greedy tokens, log-probs to 1e-5). Models outside the family (or with sliding-window
attention, another activation, tensor-parallel pretraining slices, logit soft-capping) are not supported:
:func:`lean_decoder` returns None and the engine keeps the generic path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SUPPORTED = ("llama", "qwen2")


def lean_decoder(model: torch.nn.Module) -> "LeanDecoder | None":
    """A :class:`LeanDecoder` for ``model``, or None when its architecture is not one this path implements."""
    cfg = model.config
    base = getattr(model, "model", None)
    if cfg.model_type not in SUPPORTED or base is None or not hasattr(base, "layers"):
        return None
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return None
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "final_logit_softcapping", None):
        return None
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ())):
        return None
    if not isinstance(model.get_output_embeddings(), torch.nn.Linear):
        return None
    return LeanDecoder(model)


@dataclass
class DecodeState:
    """Per-layer keys / values (B, kv_heads, capacity, head_dim), written in place; ``key_mask`` (B, capacity)
    marks the columns a row attends to; ``length`` columns are filled."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_mask: torch.Tensor
    length: int

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (the unfinished ones) in every tensor."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.key_mask = self.key_mask.index_select(0, rows)


class LeanDecoder:
    def __init__(self, model: torch.nn.Module):
        base = model.model
        self.layers = list(base.layers)
        self.embed, self.norm, self.rotary = base.embed_tokens, base.norm, base.rotary_emb
        self.head = model.get_output_embeddings()
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.groups = model.config.num_attention_heads // model.config.num_key_value_heads

    def start(self, cache, attention_mask: torch.Tensor, new_tokens: int) -> DecodeState:
        """Copy a prefilled transformers cache (B rows, P columns) into a state with room for ``new_tokens``."""
        b, p = attention_mask.shape
        keys, values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values  # (B, kv_heads, P, head_dim)
            kk = k.new_zeros(b, k.shape[1], p + new_tokens, k.shape[3])
            vv = v.new_zeros(b, v.shape[1], p + new_tokens, v.shape[3])
            kk[:, :, :p] = k
            vv[:, :, :p] = v
            keys.append(kk)
            values.append(vv)
        key_mask = torch.zeros(b, p + new_tokens, dtype=torch.bool, device=attention_mask.device)
        key_mask[:, :p] = attention_mask.bool()
        return DecodeState(keys, values, key_mask, p)

    @torch.no_grad()
    def step(self, state: DecodeState, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, V) after feeding ``ids`` (B,) at ``positions`` (B, 1)."""
        col = state.length
        state.key_mask[:, col] = True
        mask = state.key_mask[:, None, None, : col + 1]  # (B, 1, 1, L)
        x = self.embed(ids.unsqueeze(-1))  # (B, 1, H)
        cos, sin = self.rotary(x, positions)  # (B, 1, head_dim)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        b = x.shape[0]
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_proj(h).view(b, 1, -1, self.head_dim).transpose(1, 2)  # (B, heads, 1, head_dim)
            k = a.k_proj(h).view(b, 1, -1, self.head_dim).transpose(1, 2)  # (B, kv_heads, 1, head_dim)
            v = a.v_proj(h).view(b, 1, -1, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            state.keys[i][:, :, col] = k[:, :, 0]
            state.values[i][:, :, col] = v[:, :, 0]
            # the query heads of a key/value group attend as `groups` queries of that head (no repeated K / V)
            qg = q.reshape(b, -1, self.groups, self.head_dim)  # (B, kv_heads, groups, head_dim)
            o = F.scaled_dot_product_attention(qg, state.keys[i][:, :, : col + 1], state.values[i][:, :, : col + 1],
                                               attn_mask=mask, scale=self.scaling)  # (B, kv_heads, groups, head_dim)
            x = x + a.o_proj(o.reshape(b, 1, -1))  # heads in order: kv head j holds query heads j*groups..
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        state.length = col + 1
        return self.head(self.norm(x))[:, -1]  # (B, V)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
