"""DPPO (Divergence PPO, arXiv 2602.04879 "Rethinking the Trust Region in LLM RL"): binary-TV and binary-KL
(docs/algorithms/dppo.md).

Both variants replace PPO's ratio clip by a mask on a divergence between the sampled token's new and old
probabilities, and replace the dual clip by a truncated, detached IS weight on the log-prob (verl ``dppo_tv`` /
``dppo_kl``). Defaults: the divergence thresholds of verl's recipe ``examples/dppo_trainer/
run_qwen3_30b_a3b_megatron.sh`` (0.15 / 0.15 for TV, 0.05 / 0.05 for KL); ``clip_c`` 20.0, the fallback in
verl's functions (``config.get("clip_ratio_c", 20.0)``; with verl's ``ActorConfig`` the key exists and defaults to
3.0; the recipe sets 10000, i.e. effectively no truncation).
"""
from __future__ import annotations

import torch

from credo.algo.losses.common import log_ratio
from credo.algo.registry import TokenLoss, register_policy_loss

BINARY_KL_EPS = 1e-8  # verl's epsilon inside log((1 - p_old + eps) / (1 - p + eps))


def _check(clip_low: float, clip_high: float, clip_c: float) -> None:
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"DPPO divergence thresholds must be >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if clip_c <= 0:
        raise ValueError(f"clip_c (IS-weight truncation) must be > 0, got {clip_c}")


def _dppo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
               valid: torch.Tensor, clip_c: float) -> TokenLoss:
    """L = -A sg(min(r, clip_c)) logprobs valid, with verl's metrics; ``valid`` (B, T) bool, already detached."""
    delta = log_ratio(logprobs, old_logprobs)  # (B, T), clamped to +-20 as verl
    ratio = delta.exp()  # (B, T)
    weight = ratio.clamp(max=clip_c).detach()  # (B, T) truncated IS weight
    keep = valid.to(logprobs.dtype)  # (B, T)
    loss = -advantages * weight * logprobs * keep  # (B, T)
    metrics = {
        "pg_clipfrac": 1.0 - keep,  # tokens outside the trust region (no gradient)
        "pg_clipfrac_lower": (ratio.detach() > clip_c).to(keep.dtype) * keep,  # truncated and valid
        "ppo_kl": -delta.detach(),
        "ratio": ratio.detach(),
    }
    return TokenLoss(loss=loss, token_metrics=metrics)


@register_policy_loss("dppo_tv", zero_adv_inert=True)
def dppo_tv_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    clip_low: float = 0.15,
    clip_high: float = 0.15,
    clip_c: float = 20.0,
) -> TokenLoss:
    """DPPO-Binary-TV (verl ``dppo_tv``): mask tokens whose probability moved too far in the advantage's direction.

    p = exp(logprobs), p_old = exp(old_logprobs) (unclamped), r = exp(clamp(logprobs - old_logprobs, -20, 20))
    valid = (p - p_old <= clip_high) if A > 0 else (p - p_old >= -clip_low)   (A = 0 uses the A < 0 side)
    L = -A sg[min(r, clip_c)] logprobs 1[valid]
    Weight w = min(r, clip_c) on valid tokens, 0 on invalid ones. Metrics: pg_clipfrac = mean 1[not valid];
    pg_clipfrac_lower = mean 1[r > clip_c and valid]; ppo_kl = mean(old_logprobs - logprobs) (clamped delta).
    See docs/algorithms/dppo.md.
    """
    _check(clip_low, clip_high, clip_c)
    diff = (logprobs.exp() - old_logprobs.exp()).detach()  # (B, T) p - p_old
    valid = torch.where(advantages > 0, diff <= clip_high, diff >= -clip_low)  # (B, T)
    return _dppo_loss(logprobs, old_logprobs, advantages, valid, clip_c)


@register_policy_loss("dppo_kl", zero_adv_inert=True)
def dppo_kl_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    clip_low: float = 0.05,
    clip_high: float = 0.05,
    clip_c: float = 20.0,
) -> TokenLoss:
    """DPPO-Binary-KL (verl ``dppo_kl``): mask tokens whose binary KL to the old policy is too large, unless the
    move is in the safe direction.

    D = p_old (log p_old - log p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))   (binary KL, verl's 1e-8)
    valid = (D <= clip_high or p <= p_old) if A > 0 else (D <= clip_low or p >= p_old)
    L = -A sg[min(r, clip_c)] logprobs 1[valid]; weight and metrics as ``dppo_tv``.
    See docs/algorithms/dppo.md.
    """
    _check(clip_low, clip_high, clip_c)
    lp, old_lp = logprobs.detach(), old_logprobs.detach()
    p, p_old = lp.exp(), old_lp.exp()  # (B, T)
    eps = BINARY_KL_EPS
    binary_kl = p_old * (old_lp - lp) + (1.0 - p_old) * torch.log((1.0 - p_old + eps) / (1.0 - p + eps))  # (B, T)
    valid_pos = (binary_kl <= clip_high) | (p <= p_old)
    valid_neg = (binary_kl <= clip_low) | (p >= p_old)
    valid = torch.where(advantages > 0, valid_pos, valid_neg)  # (B, T)
    return _dppo_loss(logprobs, old_logprobs, advantages, valid, clip_c)
