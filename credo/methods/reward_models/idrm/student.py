"""The student's attention for Interaction Distillation: eager maps and q / k projections captured by forward hooks.

The student is the unchanged :class:`credo.models.ValueModel` scored by :func:`credo.rewards.rm_scoring.rm_scores`
(Siamese: chosen and rejected rows encoded separately, as ``pair_scores``). Hooks on ``backbone.layers[l].self_attn``
take the attention weights (B, H, L, L) the eager kernel returns with its output (``sdpa`` returns none: refused,
:func:`require_eager`), and hooks on ``q_proj`` / ``k_proj`` take the pre-RoPE projections (B, L, H * d) and
(B, L, H_kv * d) for the virtual cross-attention. ``backbone.set_attn_implementation("eager")`` switches a model for
the training only (:func:`eager_attention`), so the saved reward model keeps the configured kernel.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from credo.config import ConfigError
from credo.methods.reward_models.idrm.algo import attention_mass_fifths


@dataclass
class Captured:
    """What the hooks saw in one forward, by 0-based layer index."""

    attn: dict[int, torch.Tensor] = field(default_factory=dict)  # (B, H, L, L)
    q: dict[int, torch.Tensor] = field(default_factory=dict)  # (B, L, H * d)
    k: dict[int, torch.Tensor] = field(default_factory=dict)  # (B, L, H_kv * d)


def decoder_layers(backbone: torch.nn.Module) -> list[torch.nn.Module]:
    layers = getattr(backbone, "layers", None)
    if layers is None or not all(hasattr(l, "self_attn") for l in layers):
        raise NotImplementedError(f"idrm: {type(backbone).__name__} has no .layers[i].self_attn; the student needs a "
                                  "transformers decoder such as Qwen2 or Llama")
    return list(layers)


def head_shape(backbone: torch.nn.Module) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim) of the backbone's attention."""
    c = backbone.config
    heads = c.num_attention_heads
    return heads, getattr(c, "num_key_value_heads", None) or heads, getattr(c, "head_dim", None) or \
        c.hidden_size // heads


def require_eager(backbone: torch.nn.Module) -> None:
    kind = getattr(backbone.config, "_attn_implementation", None)
    if kind != "eager":
        raise ConfigError(f"idrm: the student's attention is {kind!r}; alignment needs model.attn_implementation="
                          "eager (sdpa returns no attention maps)")


@contextlib.contextmanager
def eager_attention(backbone: torch.nn.Module) -> Iterator[None]:
    """The backbone runs eager attention inside the block and its configured kernel after it."""
    before = getattr(backbone.config, "_attn_implementation", None)
    if before != "eager":
        backbone.set_attn_implementation("eager")
    try:
        yield
    finally:
        if before != "eager":
            backbone.set_attn_implementation(before)


@contextlib.contextmanager
def capture(backbone: torch.nn.Module, layers: list[int], *, qk: bool = True) -> Iterator[Captured]:
    """Record the attention maps (and, with ``qk``, the q / k projections) of ``layers`` during the block."""
    require_eager(backbone)
    mods = decoder_layers(backbone)
    out, handles = Captured(), []

    def keep(store: dict, idx: int, pick):
        return lambda _m, _args, o: store.__setitem__(idx, pick(o))

    try:
        for i in layers:
            attn = mods[i].self_attn
            handles.append(attn.register_forward_hook(keep(out.attn, i, lambda o: o[1])))
            if qk:
                handles.append(attn.q_proj.register_forward_hook(keep(out.q, i, lambda o: o)))
                handles.append(attn.k_proj.register_forward_hook(keep(out.k, i, lambda o: o)))
        yield out
    finally:
        for h in handles:
            h.remove()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """RoPE on flat projections: x * cos + rotate_half(x) * sin per head (B, L, heads * d); ``cos``, ``sin``
    (B, L, d) from the backbone's ``rotary_emb`` at the sequence's own position ids."""
    b, n = x.shape[:2]
    h = x.view(b, n, heads, head_dim)
    x1, x2 = h[..., : head_dim // 2], h[..., head_dim // 2 :]
    rot = torch.cat((-x2, x1), dim=-1)
    return (h * cos.unsqueeze(2) + rot * sin.unsqueeze(2)).reshape(b, n, heads * head_dim)


@torch.no_grad()
def eos_attention_mass(rm, tokenizer, pairs, *, batch_size: int = 64) -> torch.Tensor:
    """(5,) the student's last-layer EOS-row attention (head mean) mass per fifth of the sequence, averaged over the
    chosen and rejected rows of ``pairs`` (Figure 1's diagnostic, ``idrm/attn_mass_q1..5``)."""
    from credo.rewards.rm_scoring import response_batch, rm_scores

    backbone = rm.backbone
    last = len(decoder_layers(backbone)) - 1
    total, rows = torch.zeros(5), 0
    with eager_attention(backbone):
        for i in range(0, len(pairs), batch_size):
            chunk = pairs[i : i + batch_size]
            batch = response_batch(tokenizer, [p.prompt for p in chunk] * 2,
                                   [p.chosen for p in chunk] + [p.rejected for p in chunk])
            with capture(backbone, [last], qk=False) as cap:
                rm_scores(rm, batch)
            valid = batch.attention_mask.bool()
            eos = valid.shape[1] - 1 - valid.flip(-1).long().argmax(-1)  # (B,) last real column
            maps = cap.attn[last].float().mean(1).cpu()  # (B, L, L)
            row = maps[torch.arange(maps.shape[0]), eos]  # (B, L)
            total += attention_mass_fifths(row, valid).sum(0)
            rows += maps.shape[0]
    return total / max(rows, 1)
