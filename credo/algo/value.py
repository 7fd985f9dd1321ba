"""Critic loss (verl ``compute_value_loss``; docs/algorithms/gae.md, docs/algorithms/recipe_pieces.md#critic)."""
from __future__ import annotations

import torch

from credo.algo.aggregation import AggNorm, agg_loss, masked_mean
from credo.algo.critic import clipped_sq_error  # the formula lives once, with the registered critic losses
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
    per_token, clipped = clipped_sq_error(values, old_values, returns, cliprange_value)  # (B, T) each
    loss = agg_loss(per_token, response_mask, agg, norm=norm)
    metrics = {"vf_clipfrac": float(masked_mean(clipped.float(), response_mask)),
               "vpred_mean": float(masked_mean(values.detach(), response_mask))}
    return LossOutput(loss=loss, metrics=metrics)
