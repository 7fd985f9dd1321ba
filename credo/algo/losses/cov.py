"""Covariance-based token selection: Clip-Cov and KL-Cov (entropy-mechanism paper, arXiv 2505.22617;
docs/algorithms/clip_cov.md, docs/algorithms/kl_cov.md).

The centred covariance of a token is (A - mean A) (log pi - mean log pi) over the call's valid
tokens. Token counts are those of the call (micro-batch), as in verl.
"""
from __future__ import annotations

import torch

from credo.algo.aggregation import masked_mean
from credo.algo.registry import TokenLoss, register_policy_loss


def _centred_cov(advantages: torch.Tensor, logprobs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    lp = logprobs.detach()
    return (advantages - masked_mean(advantages, valid)) * (lp - masked_mean(lp, valid))  # (B, T)


@register_policy_loss("clip_cov")
def clip_cov_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> TokenLoss:
    """Clip-Cov: PPO-clip (delta not clamped) with k random high-covariance tokens detached.

    L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) corr,  corr = 0 on the k picked tokens, 1 elsewhere
    cov_it = (A_it - mean A) (sg[logprobs_it] - mean sg[logprobs]) over the call's valid tokens (selection only)
    Candidates: valid tokens not already clipped by PPO with clip_cov_lb < cov < clip_cov_ub; pick
    k = max(floor(clip_cov_ratio * N_valid), 1) of them at random (torch's global RNG, so runs are
    reproducible by seed and resume) and zero their loss. pg_clipfrac = fraction of tokens zeroed.
    See docs/algorithms/clip_cov.md.
    """
    valid = response_mask.bool()
    ratio = (logprobs - old_logprobs).exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    cov = _centred_cov(advantages, logprobs, valid)
    candidates = valid & ~(pg2 > pg1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    idx = candidates.flatten().nonzero().flatten()
    k = max(int(clip_cov_ratio * float(valid.sum())), 1)
    keep = torch.ones(advantages.numel(), dtype=logprobs.dtype, device=logprobs.device)
    if idx.numel():
        chosen = idx[torch.randperm(idx.numel())[:k].to(idx.device)]
        keep[chosen] = 0.0
    keep = keep.view_as(advantages)
    loss = torch.maximum(pg1, pg2) * keep
    metrics = {"pg_clipfrac": (keep == 0).float(), "ppo_kl": -(logprobs - old_logprobs).detach(),
               "ratio": ratio.detach()}
    return TokenLoss(loss=loss, token_metrics=metrics)


@register_policy_loss("kl_cov")
def kl_cov_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 0.1,
) -> TokenLoss:
    """KL-Cov: no clipping, L = -A r, plus ppo_kl_coef |delta| on the top-k covariance tokens.

    L = -A r + ppo_kl_coef |delta| 1[top-k cov],  cov_it = (A_it - mean A) (sg[logprobs_it] - mean sg[logprobs])
    k = max(1, floor(kl_cov_ratio * N_valid)). ppo_kl = mean |delta| (verl's definition for kl_cov);
    kl_cov_frac = fraction of tokens penalised.
    See docs/algorithms/kl_cov.md.
    """
    valid = response_mask.bool()
    delta = logprobs - old_logprobs
    ratio = delta.exp()
    loss = -advantages * ratio
    cov = _centred_cov(advantages, logprobs, valid).masked_fill(~valid, float("-inf"))
    k = max(1, int(kl_cov_ratio * float(valid.sum())))
    picked = torch.zeros(advantages.numel(), dtype=torch.bool, device=logprobs.device)
    if valid.any():
        top = torch.topk(cov.flatten(), min(k, int(valid.sum()))).indices
        picked[top] = True
    picked = picked.view_as(advantages)
    loss = torch.where(picked, loss + ppo_kl_coef * delta.abs(), loss)
    metrics = {"kl_cov_frac": picked.float(), "pg_clipfrac": torch.zeros_like(ratio), "ppo_kl": delta.abs().detach(),
               "ratio": ratio.detach()}
    return TokenLoss(loss=loss, token_metrics=metrics)
