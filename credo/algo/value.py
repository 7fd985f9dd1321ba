"""Critic loss (``baselines.md`` §6, verl ``compute_value_loss``)."""
from __future__ import annotations

import torch

from credo.algo.aggregation import AggNorm, agg_loss, masked_mean
from credo.types import LossOutput


def value_loss(
    values: torch.Tensor,  # (B, T) current critic values
    old_values: torch.Tensor,  # (B, T) values when the batch was collected
    returns: torch.Tensor,  # (B, T) targets
    response_mask: torch.Tensor,  # (B, T)
    *,
    cliprange_value: float = 0.5,
    agg: str = "token-mean",
    norm: AggNorm | None = None,
) -> LossOutput:
    """L_V = 1/2 agg(max((V - Ret)^2, (clip(V, V_old - k, V_old + k) - Ret)^2)), k = cliprange_value.

    Metrics: vf_clipfrac = mean 1[clipped term larger]; vpred_mean = mean V.
    """
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    plain_sq = (values - returns).square()
    clipped_sq = (clipped - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(plain_sq, clipped_sq), response_mask, agg, norm=norm)
    metrics = {"vf_clipfrac": float(masked_mean((clipped_sq > plain_sq).float(), response_mask)),
               "vpred_mean": float(masked_mean(values.detach(), response_mask))}
    return LossOutput(loss=loss, metrics=metrics)
