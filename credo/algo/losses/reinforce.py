"""Log-prob (REINFORCE-style) losses from verl 0.9.1: DRO (``dro``, docs/algorithms/dro.md) and bypass mode
(``bypass_mode``, docs/algorithms/bypass_mode.md)."""
from __future__ import annotations

from typing import Any

import torch

from credo.algo.losses import bypass_correction as bc
from credo.algo.losses.common import LOG_RATIO_CLAMP
from credo.algo.losses.ppo import ppo_clip_loss
from credo.algo.registry import TokenLoss, register_policy_loss

LOSS_TYPES = ("ppo_clip", "reinforce")


@register_policy_loss("dro")
def dro_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.05,
) -> TokenLoss:
    """Direct Reward Optimization (verl ``dro``): policy gradient with a quadratic log-ratio penalty.

    L = -(A logprobs - beta / 2 (logprobs - old_logprobs)^2)   (log-ratio not clamped, as verl)
    Gradient: dL/dlogprobs = -A + beta (logprobs - old_logprobs). Not inert at A = 0 (the penalty remains).
    ``beta`` is verl's ``policy_loss.dro_beta``, which verl requires > 0 and leaves unset; credo's 0.05 is the
    value of verl's own DRO unit test. Metrics: ppo_kl = mean(old_logprobs - logprobs); pg_clipfrac 0 (no clip).
    See docs/algorithms/dro.md.
    """
    if isinstance(beta, bool) or beta <= 0:
        raise ValueError(f"dro beta must be > 0 (verl policy_loss.dro_beta), got {beta}")
    delta = logprobs - old_logprobs  # (B, T)
    loss = -(advantages * logprobs - 0.5 * beta * delta.square())  # (B, T)
    d = delta.detach()
    metrics = {"pg_clipfrac": torch.zeros_like(d), "ppo_kl": -d,
               "ratio": d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()}
    return TokenLoss(loss=loss, token_metrics=metrics)


def _bypass_inert(hp: dict[str, Any]) -> bool:
    """Batch-normalised IS weights (reinforce) couple every row through the mean; anything else is per row."""
    return not (hp["rollout_is_batch_normalize"] and hp["loss_type"] == "reinforce" and hp["rollout_is"] != "none")


def _check_bypass(loss_type: str, rollout_is: str, rollout_is_threshold: float, rollout_is_low: float | None) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"bypass_mode loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    if rollout_is not in bc.IS_LEVELS:
        raise ValueError(f"bypass_mode rollout_is must be one of {', '.join(bc.IS_LEVELS)}, got {rollout_is!r}")
    bc.check_is_threshold(rollout_is_threshold, rollout_is_low)


def _masked_scalars(token_metrics: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    """Token metrics as scalars over the kept tokens (verl computes them over the rejection-masked mask)."""
    return {k: float((v.detach() * mask).sum() / mask.sum().clamp(min=1.0)) for k, v in token_metrics.items()}


@register_policy_loss("bypass_mode", zero_adv_inert=_bypass_inert, uses_rollout_logprobs=True)
def bypass_mode_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T) the sampler's rollout log-probs (bypass mode)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    loss_type: str = "ppo_clip",
    rollout_is: str = "none",
    rollout_is_threshold: float = 2.0,
    rollout_is_low: float | None = None,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str = "",
    rollout_rs_threshold: str | float | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float = 3.0,
) -> TokenLoss:
    """verl bypass mode (``compute_policy_loss_bypass_mode``): the anchor is the sampler, no recomputed old log-probs.

    lr = sg(logprobs) - rollout_logprobs; keep = rejection mask of ``rollout_rs`` (1 when off); w = IS weight of
    ``rollout_is`` from lr (token / sequence, TIS at ``rollout_is_threshold`` or IcePop with ``rollout_is_low``,
    optionally normalised to mean 1 over this call; 1 when "none"), detached.
    ppo_clip:  L = keep * PPO-clip(logprobs vs rollout_logprobs; clip_low, clip_high, clip_c)  (w not applied)
    reinforce: L = -keep * A * w * logprobs
    Weights: ppo_clip as ``ppo`` times keep; reinforce keep * w. Rejected tokens stay in the normalisers.
    Metrics: ppo_kl / pg_clipfrac (and PPO's clip fractions) over the kept tokens; ``rollout_corr/*`` as verl.
    See docs/algorithms/bypass_mode.md.
    """
    _check_bypass(loss_type, rollout_is, rollout_is_threshold, rollout_is_low)
    options = bc.parse_rs(rollout_rs, rollout_rs_threshold)
    mask = response_mask
    lr = (logprobs - old_logprobs).detach()  # (B, T) log(pi / pi_rollout)
    has_tokens = bool(mask.sum() > 0)
    corr: dict[str, float] = {}
    keep = torch.ones_like(lr)
    if options:
        keep, rs_metrics = bc.rejection_mask(lr, mask, options)  # no metrics without tokens
        corr.update(rs_metrics)
    w = torch.ones_like(lr)
    if rollout_is != "none":
        w, is_metrics = bc.is_weights(lr, mask, level=rollout_is, upper=float(rollout_is_threshold),
                                      lower=rollout_is_low, batch_normalize=rollout_is_batch_normalize)
        corr.update(is_metrics)  # no metrics without tokens
    if has_tokens:
        corr.update(bc.offpolicy_metrics(logprobs, old_logprobs, mask))
    kept = mask * keep  # (B, T) verl's effective response mask
    if loss_type == "ppo_clip":
        base = ppo_clip_loss(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
                             response_mask=kept, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c)
        loss, token_metrics = base.loss * keep, base.token_metrics  # (B, T)
    else:
        loss = -advantages * w * logprobs * keep  # (B, T)
        token_metrics = {"pg_clipfrac": torch.zeros_like(lr), "ppo_kl": -(logprobs - old_logprobs).detach()}
    metrics = _masked_scalars(token_metrics, kept)
    metrics.update({f"rollout_corr/{k}": v for k, v in corr.items()})
    return TokenLoss(loss=loss, metrics=metrics)
