"""Entropy-split losses: ASPO (flipped ratios for positive tokens, soft dual-clip) and Archer (dual-token
constraints), and AEPO's entropy-balanced update (docs/algorithms/aspo.md, docs/algorithms/archer.md,
docs/algorithms/aepo.md).

Both classify each response token by the entropy of the current policy's next-token distribution
(computed in the training forward pass, detached): per response, the threshold is the 0.8 quantile
of entropy over that response's valid tokens (linear interpolation, as ``torch.quantile``), and
low-entropy ("knowledge") tokens are those with ``entropy <= threshold`` (ties go to low). Masks are
bool throughout (the reference breaks on integer masks). The log-ratio is clamped to [-20, 20].
"""
from __future__ import annotations

from typing import Any

import torch

from credo.algo.kl import kl_penalty
from credo.algo.losses.common import log_carrier, log_ratio
from credo.algo.registry import TokenLoss, register_policy_loss


def low_entropy_mask(entropy: torch.Tensor, response_mask: torch.Tensor, quantile: float = 0.8) -> torch.Tensor:
    """Bool (B, T): valid tokens whose entropy is <= their response's ``quantile`` entropy."""
    valid = response_mask.bool()
    ent = entropy.detach().to(torch.float64).masked_fill(~valid, float("nan"))  # (B, T)
    threshold = torch.nanquantile(ent, quantile, dim=-1, keepdim=True)  # (B, 1); NaN for empty rows
    return (ent <= threshold) & valid


def _subset_mean(x: torch.Tensor, subset: torch.Tensor) -> torch.Tensor:
    w = subset.to(x.dtype)
    return (x * w).sum() / w.sum().clamp(min=1.0)


def _needs_ref(*coefs: str):
    def needs(hp: dict[str, Any]) -> tuple[str, ...]:
        return ("entropy", "ref_logprobs") if any(hp[c] > 0 for c in coefs) else ("entropy",)

    return needs


@register_policy_loss("aspo", needs=_needs_ref("kl_coef"), zero_adv_inert=lambda hp: hp["kl_coef"] == 0)
def aspo_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,  # (B, T) current-policy entropy
    ref_logprobs: torch.Tensor | None = None,  # (B, T)
    low_entropy_clip: float = 0.2,
    high_entropy_clip: float = 0.4,
    entropy_quantile: float = 0.8,
    clip_c: float = 3.0,
    kl_coef: float = 0.001,
    kl_on: str = "all",
) -> TokenLoss:
    """ASPO (Archer2.0 ``compute_policy_loss_archer``): flipped IS ratio for positive tokens.

    eps = low_entropy_clip on low-entropy tokens, high_entropy_clip on the top-20% entropy tokens.
    A < 0:  p = max(r, 1 - eps);  L = -A p;           if p > clip_c:   L = -A clip_c log pi   (c detached)
    A >= 0: q = min(r, 1 + eps);  L = -A (q/sg q)/sg q  (value -A/q);  if r < 1/clip_c: L = -A clip_c log pi
    Weights: A>0: 0 above 1+eps, 1/r on [1/c, 1+eps], c below 1/c; A<0: 0 below 1-eps, r on [1-eps, c], c above c.
    Plus kl_coef * mean of k3(logprobs, ref_logprobs) over all valid tokens (kl_on="all", credo's
    reading of the released run) or over low-entropy tokens only (kl_on="low_entropy"); kl_coef=0
    disables it. The KL mean is taken within each call (micro-batch), as in the reference.
    See docs/algorithms/aspo.md.
    """
    if kl_on not in ("all", "low_entropy"):
        raise ValueError(f"kl_on must be 'all' or 'low_entropy', got {kl_on!r}")
    valid = response_mask.bool()
    low = low_entropy_mask(entropy, response_mask, entropy_quantile)  # (B, T) bool
    eps = torch.where(low, torch.full_like(logprobs, low_entropy_clip), torch.full_like(logprobs, high_entropy_clip))
    delta = log_ratio(logprobs, old_logprobs)
    ratio = delta.exp()
    neg = advantages < 0
    p = torch.maximum(ratio, 1.0 - eps)
    neg_dual = neg & (p > clip_c)
    loss_neg = torch.where(neg_dual, -advantages * clip_c * logprobs, -advantages * p)
    q = torch.minimum(ratio, 1.0 + eps)
    pos_dual = ~neg & (1.0 / q.detach() > clip_c)
    loss_pos = torch.where(pos_dual, -advantages * clip_c * logprobs, -advantages * (q / q.detach()) / q.detach())
    loss = torch.where(neg, loss_neg, loss_pos)
    pos_clip = (advantages > 0) & (ratio > 1.0 + eps)
    neg_clip = neg & (ratio < 1.0 - eps)
    metrics = {
        "pg_clipfrac": (pos_clip | neg_clip).float(),
        "pg_clipfrac_lower": neg_dual.float(),
        "clipfrac_high": pos_clip.float(),
        "clipfrac_low": neg_clip.float(),
        "aspo_pos_dual_frac": ((advantages > 0) & pos_dual).float(),
        "aspo_neg_dual_frac": neg_dual.float(),
        "high_entropy_frac": (valid & ~low).float(),
        "ppo_kl": -delta.detach(),
        "ratio": ratio.detach(),
    }
    aux = None
    if kl_coef > 0:
        kl = kl_penalty(logprobs, ref_logprobs, "k3")
        kl_mean = _subset_mean(kl, valid if kl_on == "all" else low)
        aux = kl_coef * kl_mean
        metrics_scalar = {"aspo_kl_loss": float(kl_mean.detach())}
    else:
        metrics_scalar = {}
    return TokenLoss(loss=loss, token_metrics=metrics, metrics=metrics_scalar, aux_loss=aux)


@register_policy_loss("archer", needs=_needs_ref("low_entropy_kl_coef", "high_entropy_kl_coef"),
                      zero_adv_inert=lambda hp: hp["low_entropy_kl_coef"] == 0 and hp["high_entropy_kl_coef"] == 0)
def archer_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,  # (B, T) current-policy entropy
    ref_logprobs: torch.Tensor | None = None,  # (B, T)
    low_entropy_clip: float = 0.2,
    high_entropy_clip: float = 0.5,
    entropy_quantile: float = 0.8,
    clip_c: float = 10.0,
    low_entropy_kl_coef: float = 0.001,
    high_entropy_kl_coef: float = 0.0,
) -> TokenLoss:
    """Archer (ArcherCodeR ``compute_policy_loss`` with ``use_token_entropy_separate``).

    Per token PPO-clip with a symmetric, entropy-type range eps_tau (low_entropy_clip on
    knowledge tokens, high_entropy_clip on the top-20% reasoning tokens) and dual clip clip_c:
    L = max(-A r, -A clip(r, 1 - eps_tau, 1 + eps_tau));  A < 0: L = min(L, -A clip_c).
    Clipped tokens get zero gradient (plain PPO). Plus
    low_entropy_kl_coef * mean_K(k3) + high_entropy_kl_coef * mean_R(k3), each KL a masked mean over
    its own token set (K = low-entropy, R = high-entropy), taken within each call as in the reference.
    See docs/algorithms/archer.md.
    """
    valid = response_mask.bool()
    low = low_entropy_mask(entropy, response_mask, entropy_quantile)
    high = valid & ~low
    eps = torch.where(low, torch.full_like(logprobs, low_entropy_clip), torch.full_like(logprobs, high_entropy_clip))
    delta = log_ratio(logprobs, old_logprobs)
    ratio = delta.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
    clipped = torch.maximum(pg1, pg2)
    neg = advantages < 0
    loss = torch.where(neg, torch.minimum(clipped, -advantages * clip_c), clipped)
    metrics = {
        "pg_clipfrac": (pg2 > pg1).float(),
        "pg_clipfrac_lower": ((clipped > -advantages * clip_c) & neg).float(),
        "clipfrac_high": ((advantages > 0) & (ratio > 1.0 + eps)).float(),
        "clipfrac_low": (neg & (ratio < 1.0 - eps)).float(),
        "high_entropy_frac": high.float(),
        "high_entropy_clipfrac": ((pg2 > pg1) & high).float(),
        "ppo_kl": -delta.detach(),
        "ratio": ratio.detach(),
    }
    aux, scalars = None, {}
    if low_entropy_kl_coef > 0 or high_entropy_kl_coef > 0:
        kl = kl_penalty(logprobs, ref_logprobs, "k3")
        kl_low, kl_high = _subset_mean(kl, low), _subset_mean(kl, high)
        aux = low_entropy_kl_coef * kl_low + high_entropy_kl_coef * kl_high
        scalars = {"kl_loss_low_entropy": float(kl_low.detach()), "kl_loss_high_entropy": float(kl_high.detach())}
    return TokenLoss(loss=loss, token_metrics=metrics, metrics=scalars, aux_loss=aux)


@register_policy_loss("aepo", needs=("entropy",), zero_adv_inert=True)
def aepo_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,  # (B, T) current-policy entropy
    ref_logprobs: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float = 3.0,
    entropy_quantile: float = 0.8,
    high_entropy_rescale: float = 1.0,
    high_entropy_adv_weight: float = 0.0,
) -> TokenLoss:
    """AEPO's entropy-balanced update (docs/algorithms/aepo.md; [paper, secondary], reading [derived]).

    A' = A (1 + high_entropy_adv_weight) on high-entropy tokens, A elsewhere;  r = exp(clamp(delta, -20, 20))
    Lc = max(-A' r, -A' clip(r, 1 - clip_low, 1 + clip_high)), except high & A' > 0 & r > 1 + clip_high:
         Lc = -A' high_entropy_rescale (1 + clip_high) r/sg(r);   L = min(Lc, -A' clip_c) if A' < 0 else Lc

    PPO-clip with dual clip (ARPO's 0.2 / 0.2 / 3), except that high-entropy tokens (above their response's
    ``entropy_quantile``, as Archer / ASPO split) with A > 0 and r > 1 + clip_high keep a gradient of weight
    high_entropy_rescale * (1 + clip_high) through the GPPO stop-gradient trick instead of zero, and the
    advantages of high-entropy tokens are multiplied by (1 + high_entropy_adv_weight) (entropy-aware
    advantage). The paper gives no values for the two factors: the defaults (1.0, 0.0) are credo's.
    """
    valid = response_mask.bool()
    high = valid & ~low_entropy_mask(entropy, response_mask, entropy_quantile)
    adv = advantages * torch.where(high, torch.full_like(advantages, 1.0 + high_entropy_adv_weight),
                                   torch.ones_like(advantages))
    delta = log_ratio(logprobs, old_logprobs)
    ratio = delta.exp()
    carrier = log_carrier(delta)
    preserve = high & (adv > 0) & (ratio > 1.0 + clip_high)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(pg1, pg2)
    clipped = torch.where(preserve, -adv * (high_entropy_rescale * (1.0 + clip_high)) * carrier, clipped)
    neg = adv < 0
    loss = torch.where(neg, torch.minimum(clipped, -adv * clip_c), clipped)
    metrics = {"pg_clipfrac": (pg2 > pg1).float(), "pg_clipfrac_lower": ((clipped > -adv * clip_c) & neg).float(),
               "high_entropy_frac": high.float(), "preserved_frac": preserve.float(), "ppo_kl": -delta.detach(),
               "ratio": ratio.detach()}
    return TokenLoss(loss=loss, token_metrics=metrics)
