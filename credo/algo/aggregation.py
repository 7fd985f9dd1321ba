"""Loss aggregation: reduce a per-token loss matrix to a scalar.

Modes (docs/algorithms/recipe_pieces.md#ppo-epochs-mini-batches-micro-batches-and-exact-aggregation;
``m`` = response mask, ``|y_i| = sum_t m_it``):

    token-mean               sum_it m L / N                          N = loss tokens in the mini-batch
    seq-mean-token-sum       sum_i [|y_i|>0] sum_t m L / B           B = non-empty sequences in the mini-batch
    seq-mean-token-mean      sum_i [|y_i|>0] (sum_t m L / |y_i|) / B
    seq-mean-token-sum-norm  sum_it m L / (B S)                      S = loss_scale_factor, else padded length T
                             (alias "constant-norm"; Dr.GRPO's 1/G and constant 1/MAX_TOKENS; verl 0.9.1)

B counts the sequences with at least one loss token (verl 0.9.1's ``agg_loss`` when ``global_batch_size`` is not
given; its trainer passes every row of the mini-batch, which differs only when a row has no loss token).

Micro-batch invariance: pass an :class:`AggNorm` computed once over the whole mini-batch and
the sum of the micro-batch losses equals the loss of the full mini-batch exactly (unlike the
legacy verl actor, which normalises per micro-batch). Without ``norm`` the local micro-batch
counts are used.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_ALIASES = {"constant-norm": "seq-mean-token-sum-norm"}


def canonical_agg(mode: str) -> str:
    mode = _ALIASES.get(mode, mode)
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGG_MODES + tuple(_ALIASES))}")
    return mode


@dataclass(frozen=True)
class AggNorm:
    """Normalisers of one optimizer mini-batch, shared by all its micro-batches."""

    num_tokens: float  # N: loss tokens in the mini-batch
    num_seqs: float  # B: sequences with at least one loss token
    scale_factor: float  # S: constant divisor of seq-mean-token-sum-norm

    @classmethod
    def of(cls, response_mask: torch.Tensor, loss_scale_factor: float | None = None) -> "AggNorm":
        mask = response_mask.float()  # (B, T)
        return cls(
            num_tokens=float(mask.sum()),
            num_seqs=float((mask.sum(-1) > 0).sum()),
            scale_factor=float(loss_scale_factor if loss_scale_factor is not None else mask.shape[-1]),
        )


def agg_loss(
    loss_mat: torch.Tensor,  # (B, T) per-token loss
    response_mask: torch.Tensor,  # (B, T) bool or 0/1
    mode: str = "token-mean",
    *,
    norm: AggNorm | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss into a scalar (see module docstring for the formulas)."""
    mode = canonical_agg(mode)
    mask = response_mask.to(loss_mat.dtype)  # (B, T)
    if norm is None:
        norm = AggNorm.of(mask, loss_scale_factor)
    masked = loss_mat * mask  # (B, T)
    if mode == "token-mean":
        return masked.sum() / _nonzero(norm.num_tokens)
    if mode == "seq-mean-token-sum":
        return masked.sum() / _nonzero(norm.num_seqs)
    if mode == "seq-mean-token-mean":
        seq_len = mask.sum(-1).clamp(min=1.0)  # (B,); empty rows have a zero numerator
        return (masked.sum(-1) / seq_len).sum() / _nonzero(norm.num_seqs)
    return masked.sum() / (_nonzero(norm.num_seqs) * _nonzero(norm.scale_factor))


def micro_share(response_mask: torch.Tensor, mode: str, norm: AggNorm | None) -> float:
    """This call's share of the mini-batch: local tokens / N for token modes, local sequences / B for
    sequence modes; 1 without ``norm``. Shares of the micro-batches of a mini-batch sum to 1."""
    if norm is None:
        return 1.0
    mask = response_mask.float()
    if canonical_agg(mode) == "token-mean":
        return float(mask.sum()) / _nonzero(norm.num_tokens)
    return float((mask.sum(-1) > 0).sum()) / _nonzero(norm.num_seqs)


def masked_mean(x: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over loss tokens (0 when there are none)."""
    mask = response_mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _nonzero(x: float) -> float:
    return x if x > 0 else 1.0
