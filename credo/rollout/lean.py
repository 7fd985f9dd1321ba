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
kernel (tested: same greedy tokens, log-probs to 1e-5). What stays fixed for one continuation is prepared once, at
:meth:`LeanDecoder.start`: the rotary cos / sin of every reachable position (static rotary types), and, for small
models, stacked query / key / value and gate / up weights (two matrix products fewer per layer and step, where a
step of a small model costs its number of calls more than its arithmetic: docs/performance.md). Models outside the family (or with sliding-window
attention, another activation, tensor-parallel pretraining slices, logit soft-capping) are not supported:
:func:`lean_decoder` returns None and the engine keeps the generic path.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.modules import module as _module_mod
from transformers.activations import SiLUActivation
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm

SUPPORTED = ("llama", "qwen2")
# stacked projection weights for models up to this hidden size: their decode step is bound by the number of calls;
# a larger model's matrix products dominate, and the copy would cost memory for little
FUSE_MAX_HIDDEN = 512
STATIC_ROPE = ("default", "linear", "llama3")  # rotary types whose cos / sin of a position do not depend on the call
_RMS_NORMS = (Qwen2RMSNorm, LlamaRMSNorm)
_MLPS = (Qwen2MLP, LlamaMLP)
_SILUS = (SiLUActivation, torch.nn.SiLU)


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
    """Per-layer keys / values (B, kv_heads, capacity, head_dim), written in place; ``key_bias`` (B, kv_heads,
    capacity), the attention scores' additive bias, is 0 on the columns a row attends to and -inf elsewhere (repeated
    per key / value head); ``length`` columns are filled. ``rope``: the cos / sin (positions, head_dim)
    of every position the continuation can reach (None: the rotary module is called per step); ``fused``: per layer,
    the stacked projection weights read at the start (None for a layer that runs its own modules)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_bias: torch.Tensor
    length: int
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    fused: list["FusedLayer | None"] = field(default_factory=list)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (the unfinished ones) in every tensor."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.key_bias = self.key_bias.index_select(0, rows)


class LeanDecoder:
    """Decode steps of a Llama-family model from its own parameter tensors (see the module docstring).

    ``start`` also prepares what stays fixed during one continuation: the rotary cos / sin of every position it can
    reach (static rotary types only; a dynamic one is called per step), and, for a small model (hidden size <=
    ``FUSE_MAX_HIDDEN``) whose projections are plain ``nn.Linear`` modules without hooks, one weight per layer for
    the query / key / value projections and one for the gate / up projections, so a decode step makes two matrix
    products fewer per layer. These are copies of the weights at ``start``: :meth:`refresh` re-reads them when the
    weights change mid-continuation (a partial rollout's decode hook).
    """

    def __init__(self, model: torch.nn.Module):
        base = model.model
        self.layers = list(base.layers)
        self.embed, self.norm, self.rotary = base.embed_tokens, base.norm, base.rotary_emb
        self.head = model.get_output_embeddings()
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.heads, self.kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
        self.groups = self.heads // self.kv_heads
        self.fuse = model.config.hidden_size <= FUSE_MAX_HIDDEN
        self.static_rope = getattr(self.rotary, "rope_type", "default") in STATIC_ROPE

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
        dtype = keys[0].dtype if keys else torch.float32
        bias = torch.full((b, self.kv_heads, p + new_tokens), float("-inf"), dtype=dtype, device=attention_mask.device)
        bias[:, :, :p].masked_fill_(attention_mask.bool()[:, None], 0.0)
        state = DecodeState(keys, values, bias, p)
        if self.static_rope:  # a row's position stays below P + new_tokens (its own length - 1)
            with torch.no_grad():
                cos, sin = self.rotary(self.embed.weight, torch.arange(p + new_tokens, device=bias.device)[None])
            state.rope = cos[0], sin[0]  # (positions, head_dim)
        self.refresh(state)
        return state

    @torch.no_grad()
    def refresh(self, state: DecodeState) -> None:
        """Re-read the stacked projection weights from the model (at the start, and after its weights changed)."""
        state.fused = [fuse_layer(layer) if self.fuse else None for layer in self.layers]

    @torch.no_grad()
    def step(self, state: DecodeState, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, V) after feeding ``ids`` (B,) at ``positions`` (B, 1)."""
        col = state.length
        state.key_bias[:, :, col] = 0.0
        x = self.embed(ids.unsqueeze(-1))  # (B, 1, H)
        b = x.shape[0]
        bias = state.key_bias[:, :, : col + 1].reshape(b * self.kv_heads, 1, col + 1)  # a view: no copy
        if state.rope is not None:
            at = positions.reshape(-1)
            cos, sin = state.rope[0].index_select(0, at), state.rope[1].index_select(0, at)  # (B, head_dim)
            cos, sin = cos.view(b, 1, 1, -1), sin.view(b, 1, 1, -1)
        else:
            cos, sin = self.rotary(x, positions)  # (B, 1, head_dim)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        hd, nq, nk = self.head_dim, self.heads, self.kv_heads
        for i, layer in enumerate(self.layers):
            a, fused = layer.self_attn, state.fused[i] if state.fused else None
            h = _norm(layer.input_layernorm, x)
            if fused is not None:
                qkv = F.linear(h, fused.qkv_weight, fused.qkv_bias).view(b, nq + 2 * nk, 1, hd)
                qk = qkv[:, : nq + nk]  # (B, heads + kv_heads, 1, head_dim): one rotation for both
                qk = qk * cos + _rotate_half(qk) * sin
                q, k, v = qk[:, :nq], qk[:, nq:], qkv[:, nq + nk:]
            else:
                q = a.q_proj(h).view(b, 1, -1, hd).transpose(1, 2)  # (B, heads, 1, head_dim)
                k = a.k_proj(h).view(b, 1, -1, hd).transpose(1, 2)  # (B, kv_heads, 1, head_dim)
                v = a.v_proj(h).view(b, 1, -1, hd).transpose(1, 2)
                q = q * cos + _rotate_half(q) * sin
                k = k * cos + _rotate_half(k) * sin
            state.keys[i][:, :, col] = k[:, :, 0]
            state.values[i][:, :, col] = v[:, :, 0]
            o = _attend(q.reshape(b * nk, self.groups, hd), state.keys[i], state.values[i], bias, col + 1,
                        self.scaling)  # (B * kv_heads, groups, head_dim)
            x = x + _linear(a.o_proj, o.reshape(b, 1, -1))  # heads in order: kv head j holds query heads j*groups..
            h = _norm(layer.post_attention_layernorm, x)
            if fused is not None:
                gate, up = F.linear(h, fused.gate_up_weight).chunk(2, dim=-1)
                x = x + _linear(layer.mlp.down_proj, F.silu(gate) * up)
            else:
                x = x + layer.mlp(h)
        state.length = col + 1
        return _linear(self.head, _norm(self.norm, x))[:, -1]  # (B, V)


@dataclass
class FusedLayer:
    """One layer's query / key / value weights stacked (rows: q, then k, then v) and its gate / up weights."""

    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor


def _plain(module: torch.nn.Module) -> bool:
    """A module whose forward is exactly its class's (no hooks, no adapter or parametrization subclass)."""
    return not (module._forward_hooks or module._forward_pre_hooks or _global_hooks())


def _global_hooks() -> bool:
    return bool(_module_mod._global_forward_hooks or _module_mod._global_forward_pre_hooks)


def fuse_layer(layer: torch.nn.Module) -> FusedLayer | None:
    """The layer's stacked projection weights, or None where a projection is not a plain bias-consistent Linear or
    the MLP is not gate / up / down with SiLU."""
    a, mlp = layer.self_attn, layer.mlp
    projs = (a.q_proj, a.k_proj, a.v_proj)
    gate, up = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
    mods = (*projs, gate, up, getattr(mlp, "down_proj", None))
    if type(mlp) not in _MLPS or not _plain(mlp) or type(getattr(mlp, "act_fn", None)) not in _SILUS:
        return None
    if not all(type(m) is torch.nn.Linear and _plain(m) for m in mods) or gate.bias is not None or up.bias is not None:
        return None
    biases = [p.bias for p in projs]
    if any(x is None for x in biases) and not all(x is None for x in biases):
        return None
    qkv_bias = None if biases[0] is None else torch.cat(biases)
    return FusedLayer(torch.cat([p.weight for p in projs]), qkv_bias, torch.cat([gate.weight, up.weight]))


def _linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``, calling F.linear directly for a plain ``nn.Linear`` (no module-call overhead)."""
    if type(module) is torch.nn.Linear and _plain(module):
        return F.linear(x, module.weight, module.bias)
    return module(x)


def _norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm; transformers' own float32 one as ``F.rms_norm`` (the same arithmetic in one call)."""
    if type(module) in _RMS_NORMS and x.dtype == torch.float32 and _plain(module):
        return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)
    return module(x)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, length: int,
            scale: float) -> torch.Tensor:
    """One decode step's attention: the query heads of a key / value group attend as ``groups`` queries of that
    head (no repeated keys / values). ``q`` (B * kv_heads, groups, head_dim); ``keys`` / ``values`` the cache
    (B, kv_heads, capacity, head_dim), of which the first ``length`` columns count; ``bias`` (B * kv_heads, 1,
    length), 0 or -inf. softmax(q k^T * scale + bias) v as three calls: at a decode step's shapes (one query per
    head, tens of keys) this is several times faster than ``F.scaled_dot_product_attention``'s CPU kernel
    (docs/performance.md) and equal up to float rounding."""
    n, d = q.shape[0], q.shape[-1]
    k = keys[:, :, :length].reshape(n, length, d)  # views: the cache's rows are (kv_heads, capacity) blocks
    v = values[:, :, :length].reshape(n, length, d)
    scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)  # (B * kv_heads, groups, length)
    return torch.bmm(scores.softmax(-1), v)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
