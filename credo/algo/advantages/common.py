"""Shared pieces of the advantage estimators: group statistics, reward placement, whitening.

dtype: every estimator computes in the floating dtype of its inputs (:func:`compute_dtype`: float64 rewards give
float64 advantages, as verl's functions do, except verl's GDPO, which casts its components to float32); integer or
bool rewards compute in torch's default dtype.
"""
from __future__ import annotations

import torch


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The floating dtype the inputs promote to (ints, bools and None ignored); the default dtype if none is
    floating."""
    out = None
    for t in tensors:
        if t is not None and isinstance(t, torch.Tensor) and t.is_floating_point():
            out = t.dtype if out is None else torch.promote_types(out, t.dtype)
    return out or torch.get_default_dtype()


def as_real(x: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` as a floating tensor: its own dtype if floating, else ``like``'s (or the default dtype)."""
    if x.is_floating_point():
        return x
    return x.to(like.dtype if like is not None and like.is_floating_point() else torch.get_default_dtype())


def sequence_scores(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence score R_i: ``rewards`` itself if (B,), else the sum over the response of (B, T) token
    rewards, mask or no mask (verl sums ``token_level_rewards``; a reward on an environment token counts)."""
    rewards = as_real(rewards, response_mask)
    return rewards if rewards.dim() == 1 else rewards.sum(-1)


def token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) token rewards: (B, T) input masked, or a (B,) score placed on each row's last loss token."""
    rewards = as_real(rewards, response_mask)
    mask = response_mask.to(compute_dtype(rewards, response_mask))
    rewards = rewards.to(mask.dtype)
    if rewards.dim() == 2:
        return rewards * mask
    positions = torch.arange(mask.shape[-1], dtype=mask.dtype).expand_as(mask)
    last = (positions * mask).argmax(-1)  # (B,) index of the last loss token
    out = torch.zeros_like(mask)
    has_tokens = mask.sum(-1) > 0
    rows = torch.arange(mask.shape[0])[has_tokens]
    out[rows, last[has_tokens]] = rewards[has_tokens]
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


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """sum(m x) / (sum(m) + eps): verl's ``masked_mean`` with eps = 1e-8 (so the two agree to the last bits)."""
    return (x * mask).sum() / (mask.sum() + eps)


def masked_var(x: torch.Tensor, response_mask: torch.Tensor, *, eps: float = 1e-8) -> torch.Tensor:
    """Unbiased variance of x over loss tokens, verl's ``masked_var``: masked_mean((x - mean)^2) n / (n - 1), its
    means dividing by n + eps (eps = 0: the plain unbiased variance). With n <= 1 loss token (where verl raises) the
    biased variance, 0."""
    mask = response_mask.to(x.dtype)
    n = mask.sum()
    var = _masked_mean((x - _masked_mean(x, mask, eps)) ** 2, mask, eps)
    return var * n / (n - 1) if float(n) > 1 else var


def masked_whiten(x: torch.Tensor, response_mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over loss tokens, verl's ``masked_whiten`` (its masked mean and unbiased
    variance, eps 1e-8); 0 off-mask."""
    mask = response_mask.to(x.dtype)
    return (x - _masked_mean(x, mask)) * torch.rsqrt(masked_var(x, mask) + eps) * mask


def explained_variance(returns: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, *,
                       eps: float = 1e-5) -> float:
    """1 - Var(returns - values) / (Var(returns) + eps) over loss tokens, unbiased variances: verl's
    ``vf_explained_var`` (its masked means, eps = 1e-5) for eps > 0; ``eps = 0`` is the exact ratio of plain
    unbiased variances, and a batch whose returns do not vary then has EV = -inf if the critic misses them, nan if
    it matches them exactly (0 / 0)."""
    dtype = compute_dtype(returns, values)
    returns, values = returns.to(dtype), values.to(dtype)
    mean_eps = 1e-8 if eps > 0 else 0.0
    num = masked_var(returns - values, response_mask, eps=mean_eps)
    den = masked_var(returns, response_mask, eps=mean_eps) + eps
    if eps == 0 and float(den) == 0:
        return float("nan") if float(num) == 0 else float("-inf")
    return float(1.0 - num / den)
