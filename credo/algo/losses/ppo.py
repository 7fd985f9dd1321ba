"""PPO-clip (with clip-higher and dual-clip) and plain policy gradient (GPG).

docs/algorithms/ppo.md, docs/algorithms/gpg.md.
"""
from __future__ import annotations

import torch

from credo.algo.losses.common import LOG_RATIO_CLAMP, log_ratio
from credo.algo.registry import TokenLoss, register_policy_loss


@register_policy_loss("ppo", zero_adv_inert=True)
def ppo_clip_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float = 3.0,
) -> TokenLoss:
    """PPO-clip with clip-higher and dual-clip (verl ``vanilla``; docs/algorithms/ppo.md).

    r = exp(clamp(logprobs - old_logprobs, -20, 20))
    L1 = -A r,  L2 = -A clip(r, 1 - clip_low, 1 + clip_high),  Lc = max(L1, L2)
    L  = min(Lc, -A clip_c) if A < 0 else Lc

    Gradient weight w: 0 for (A>0, r>1+clip_high), (A<0, r<1-clip_low), (A<0, r>clip_c); r elsewhere.
    Metrics: pg_clipfrac = mean 1[L2 > L1]; pg_clipfrac_lower = mean 1[Lc > -A c and A < 0] (dual clip
    active); clipfrac_high = mean 1[A > 0, r > 1 + clip_high]; clipfrac_low = mean 1[A < 0, r < 1 - clip_low];
    ppo_kl = mean(old_logprobs - logprobs).
    See docs/algorithms/ppo.md.
    """
    if clip_c <= 1.0:
        raise ValueError(f"clip_c must be > 1 for the dual clip, got {clip_c}")
    delta = log_ratio(logprobs, old_logprobs)  # (B, T)
    ratio = delta.exp()  # (B, T)
    pg1 = -advantages * ratio  # (B, T)
    pg2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    clipped = torch.maximum(pg1, pg2)  # (B, T)
    pg3 = -advantages * clip_c  # (B, T)
    dual = torch.minimum(clipped, pg3)  # (B, T)
    negative = advantages < 0
    loss = torch.where(negative, dual, clipped)  # (B, T)
    metrics = {
        "pg_clipfrac": (pg2 > pg1).float(),
        "pg_clipfrac_lower": ((clipped > pg3) & negative).float(),
        "clipfrac_high": ((advantages > 0) & (ratio > 1.0 + clip_high)).float(),
        "clipfrac_low": (negative & (ratio < 1.0 - clip_low)).float(),
        "ppo_kl": -delta.detach(),
        "ratio": ratio.detach(),
    }
    return TokenLoss(loss=loss, token_metrics=metrics)


@register_policy_loss("gpg", zero_adv_inert=True)
def gpg_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> TokenLoss:
    """Plain policy gradient (GPG / REINFORCE on the current log-prob; docs/algorithms/gpg.md).

    L = -A log pi; w = 1 everywhere. No ratio, no clipping (pg_clipfrac is 0 by definition).
    See docs/algorithms/gpg.md.
    """
    delta = (logprobs - old_logprobs).detach()
    zeros = torch.zeros_like(logprobs)
    metrics = {"pg_clipfrac": zeros, "ppo_kl": -delta, "ratio": delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()}
    return TokenLoss(loss=-advantages * logprobs, token_metrics=metrics)
