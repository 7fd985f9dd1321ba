"""Shared pieces of the advantage estimators: group statistics, reward placement, whitening."""
from __future__ import annotations

import torch


def sequence_scores(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence score R_i: ``rewards`` itself if (B,), else the sum over the response of (B, T) token
    rewards, mask or no mask (verl sums ``token_level_rewards``; a reward on an environment token counts)."""
    if rewards.dim() == 1:
        return rewards.float()
    return rewards.sum(-1).float()


def token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) token rewards: (B, T) input masked, or a (B,) score placed on each row's last loss token."""
    mask = response_mask.float()
    if rewards.dim() == 2:
        return rewards.float() * mask
    positions = torch.arange(mask.shape[-1], dtype=torch.float32).expand_as(mask)
    last = (positions * mask).argmax(-1)  # (B,) index of the last loss token
    out = torch.zeros_like(mask)
    has_tokens = mask.sum(-1) > 0
    rows = torch.arange(mask.shape[0])[has_tokens]
    out[rows, last[has_tokens]] = rewards.float()[has_tokens]
    return out


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


def broadcast(adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) per-sequence values -> (B, T), zero outside the mask."""
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)


def masked_whiten(x: torch.Tensor, response_mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over loss tokens, unbiased variance (verl ``masked_whiten``); 0 off-mask."""
    mask = response_mask.to(x.dtype)
    n = mask.sum()
    mean = (x * mask).sum() / n.clamp(min=1)
    var = (((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def masked_var(x: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance of x over loss tokens."""
    mask = response_mask.to(x.dtype)
    n = mask.sum()
    mean = (x * mask).sum() / n.clamp(min=1)
    return (((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1)


def explained_variance(returns: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / (Var(returns) + 1e-5) over loss tokens (verl ``vf_explained_var``)."""
    return float(1.0 - masked_var(returns - values, response_mask) / (masked_var(returns, response_mask) + 1e-5))
