"""Gradient-preserving clipping: GPPO (Klear-Reasoner) and CE-GPPO (beta-scaled).

Both keep PPO's forward value but give tokens clipped on the pessimistic side (A > 0 above the
upper bound, A < 0 below the lower bound) a bounded constant gradient weight instead of zero
(docs/algorithms/gppo.md, docs/algorithms/cegppo.md). Neither clamps the log-ratio (the reference code does not).
"""
from __future__ import annotations

import torch

from credo.algo.losses.common import log_carrier
from credo.algo.registry import TokenLoss, register_policy_loss


def _clip_metrics(advantages, ratio, pg1, pg2, loss_before_dual, clip_low, clip_high, clip_c):
    neg = advantages < 0
    return {
        "pg_clipfrac": (pg2 > pg1).float(),
        "pg_clipfrac_lower": ((loss_before_dual > -advantages * clip_c) & neg).float(),
        "clipfrac_high": ((advantages > 0) & (ratio > 1.0 + clip_high)).float(),
        "clipfrac_low": (neg & (ratio < 1.0 - clip_low)).float(),
        "ratio": ratio.detach(),
    }


@register_policy_loss("gppo", zero_adv_inert=True)
def gppo_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float = 10.0,
) -> TokenLoss:
    """GPPO (``compute_gppo_loss``): PPO-clip whose clamp bounds carry the gradient.

    r = exp(logprobs - old_logprobs)                      (no clamp, as in the reference)
    L = max(-A r, -A clamp(r, (1 - clip_low) r/sg(r), (1 + clip_high) r/sg(r)));  A < 0: L = min(L, -A clip_c)

    Weights w: (A>0, r>1+clip_high) -> 1+clip_high; (A<0, r<1-clip_low) -> 1-clip_low;
    (A<0, r>clip_c) -> 0; otherwise r. Forward value equals ``ppo`` at the same clips.
    Released recipe: clip_low 0.2, clip_high 0.28, clip_c 10, plus an SFT term on fully correct
    responses with coefficient 0.1 (``algo.sft_coef``, a recipe-level piece).
    See docs/algorithms/gppo.md.
    """
    delta = logprobs - old_logprobs  # (B, T)
    ratio = delta.exp()  # (B, T)
    carrier = log_carrier(delta)
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    bounded = torch.where(ratio > hi, 1.0 * hi * carrier, torch.where(ratio < lo, 1.0 * lo * carrier, ratio))  # (B, T)
    pg1 = -advantages * ratio
    pg2 = -advantages * bounded
    clipped = torch.maximum(pg1, pg2)
    loss = torch.where(advantages < 0, torch.minimum(clipped, -advantages * clip_c), clipped)
    metrics = _clip_metrics(advantages, ratio, pg1, pg2, clipped, clip_low, clip_high, clip_c)
    metrics["ppo_kl"] = -delta.detach()
    return TokenLoss(loss=loss, token_metrics=metrics)


@register_policy_loss("cegppo", zero_adv_inert=True)
def cegppo_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float = 10.0,
    beta1: float = 0.75,
    beta2: float = 1.0,
) -> TokenLoss:
    """CE-GPPO (``compute_gppo_loss_general_beta``): GPPO with beta-scaled preserved gradients.

    C_low  = {A < 0, r < 1 - clip_low}:  L = -beta1 (1 - clip_low) A r/sg(r)
    C_high = {A > 0, r > 1 + clip_high}: L = -beta2 (1 + clip_high) A r/sg(r)
    otherwise L = -A r;  then A < 0: L = min(L, -A clip_c)

    Weights: beta2 (1 + clip_high) on C_high, beta1 (1 - clip_low) on C_low, 0 for (A<0, r>clip_c),
    r elsewhere. Unlike GPPO the forward value in C_low / C_high is scaled by beta too. With
    beta1 = beta2 = 1 value and gradient equal ``gppo`` at the same clips. Defaults: the 7B release
    (beta1 0.75, beta2 1.0, clip 0.2/0.2, clip_c 10); the 1.5B release uses beta1 0.5.
    pg_clipfrac = fraction of tokens in C_low or C_high.
    See docs/algorithms/cegppo.md.
    """
    delta = logprobs - old_logprobs  # (B, T)
    ratio = delta.exp()
    carrier = log_carrier(delta)
    neg = advantages < 0
    c_low = neg & (ratio < 1.0 - clip_low)
    c_high = (advantages > 0) & (ratio > 1.0 + clip_high)
    # same operation order as gppo, so beta1 = beta2 = 1 reproduces it bit for bit
    low_branch = -advantages * (beta1 * (1.0 - clip_low) * carrier)
    high_branch = -advantages * (beta2 * (1.0 + clip_high) * carrier)
    loss = torch.where(c_low, low_branch, torch.where(c_high, high_branch, -advantages * ratio))
    before_dual = loss
    loss = torch.where(neg, torch.minimum(loss, -advantages * clip_c), loss)
    metrics = {
        "pg_clipfrac": (c_low | c_high).float(),
        "pg_clipfrac_lower": ((before_dual > -advantages * clip_c) & neg).float(),
        "clipfrac_high": c_high.float(),
        "clipfrac_low": c_low.float(),
        "ratio": ratio.detach(),
        "ppo_kl": -delta.detach(),
    }
    return TokenLoss(loss=loss, token_metrics=metrics)
