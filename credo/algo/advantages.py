"""Advantage estimators, registered by name (``baselines.md`` §2).

Outcome estimators take one scalar reward per sequence, compute a per-sequence advantage ``A_i``
and broadcast it over the response tokens: ``A_it = A_i * m_it``.
"""
from __future__ import annotations

import torch

from credo.algo.registry import register_advantage
from credo.types import AdvantageOutput


def group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased (N-1) std and group size, each (B,).

    A group of size 1 gets mean 0 and std 1 (verl convention, so its advantage is the raw reward).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)  # (B,)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    r = rewards.to(torch.float64)
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(r))
    total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, r)
    mean = total / count  # (G,)
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, (r - mean[inverse]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()  # (G,)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[inverse].to(rewards.dtype), std[inverse].to(rewards.dtype), count[inverse].to(rewards.dtype)


def _broadcast(adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)  # (B, 1) * (B, T)


@register_advantage("grpo")
def grpo_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    values: torch.Tensor | None = None,
    norm_std: bool = True,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """GRPO: A_i = (R_i - mean_g R) / (std_g R + eps), std unbiased (N-1); without std if norm_std=False.

    verl ``compute_grpo_outcome_advantage``: eps = 1e-6, a group of size 1 gets mean 0 and std 1.
    Returns equal the advantages.
    """
    rewards = rewards.float()
    mean, std, count = group_stats(rewards, group_ids)
    adv = rewards - mean
    if norm_std:
        adv = adv / (std + eps)
    num_groups = float((1.0 / count).sum()) if len(rewards) else 1.0
    zero_std = float(((std == 0).float() / count).sum()) / max(num_groups, 1.0)  # fraction of groups
    adv_t = _broadcast(adv, response_mask)  # (B, T)
    return AdvantageOutput(advantages=adv_t, returns=adv_t, metrics={"frac_reward_zero_std": zero_std})


@register_advantage("dr_grpo")
def dr_grpo_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    values: torch.Tensor | None = None,
) -> AdvantageOutput:
    """Dr.GRPO: A_i = R_i - mean_g R (no std normalisation; pair with ``seq-mean-token-sum-norm``)."""
    return grpo_advantage(rewards=rewards, group_ids=group_ids, response_mask=response_mask, norm_std=False)


@register_advantage("rloo")
def rloo_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    values: torch.Tensor | None = None,
) -> AdvantageOutput:
    """RLOO: A_i = R_i - mean of the other G-1 rewards of the group = G/(G-1) (R_i - mean_g R).

    A group of size 1 gets A = R (verl ``rloo``).
    """
    rewards = rewards.float()
    mean, _, count = group_stats(rewards, group_ids)
    scale = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.ones_like(count))
    adv = scale * (rewards - mean)
    adv_t = _broadcast(adv, response_mask)
    return AdvantageOutput(advantages=adv_t, returns=adv_t)
