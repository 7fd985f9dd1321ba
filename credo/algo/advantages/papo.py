"""PAPO: polarity-aware advantage reweighting (docs/algorithms/papo.md; paper only, [derived]).

credo implements the reading that page states; every choice below is a hyperparameter.

1. Base advantages A from a group estimator (``base``: grpo, dr_grpo or rloo).
2. Entropy polarity per token, P_t = -A_t D_t with D_t = S_k - C from the behaviour policy's logits
   (:func:`credo.algo.logprobs.entropy_direction_from_logits`; the recipe computes it in the
   old-log-prob pass). P > 0 predicts that reinforcing the token expands entropy.
3. Phase signal phi from the history of batch-mean entropies H_1..H_s (``phase_fn``):
   ``relative_to_start``: (H_s - H_1) / H_1;  ``ema_trend``: (H_s - EMA_{s-1}) / H_1 with EMA
   coefficient ``ema``;  ``none``: 0 (no reweighting).
4. Branch weights, both kept positive, from the weight map (``weight_map``): ``linear``:
   w_plus = 1 - strength phi, w_minus = 1 + strength phi; ``exp``: w_plus = exp(-strength phi),
   w_minus = exp(strength phi); both then clipped to [w_min, w_max]. w_plus applies to P > 0
   (expansion), w_minus to P <= 0: when entropy falls (phi < 0) expansion is reinforced more, when
   it is high or rising consolidation is.
5. ``use="sign"`` applies the branch weight as is; ``use="magnitude"`` scales its deviation from 1 by
   |P| / mean|P| (capped at 1). Optionally (``renormalize``) mean|A~| is rescaled to mean|A|.
"""
from __future__ import annotations

import math

import torch

from credo.algo.registry import ADVANTAGE_ESTIMATORS, register_advantage
from credo.types import AdvantageOutput

PHASE_FNS = ("relative_to_start", "ema_trend", "none")
WEIGHT_MAPS = ("linear", "exp")


def papo_weights(phi: float, *, weight_map: str = "linear", strength: float = 1.0, w_min: float = 0.5,
                 w_max: float = 2.0) -> tuple[float, float]:
    """(w_plus, w_minus) for phase ``phi``, clipped to [w_min, w_max]."""
    if weight_map not in WEIGHT_MAPS:
        raise ValueError(f"weight_map must be one of {WEIGHT_MAPS}, got {weight_map!r}")
    if weight_map == "linear":
        w_pos, w_neg = 1.0 - strength * phi, 1.0 + strength * phi
    else:
        w_pos, w_neg = math.exp(-strength * phi), math.exp(strength * phi)
    return min(max(w_pos, w_min), w_max), min(max(w_neg, w_min), w_max)


def papo_phase(history: list[float], phase_fn: str = "relative_to_start", ema: float = 0.9) -> float:
    """Phase signal from batch-mean entropies, oldest first (the current batch last)."""
    if phase_fn not in PHASE_FNS:
        raise ValueError(f"phase_fn must be one of {PHASE_FNS}, got {phase_fn!r}")
    if phase_fn == "none" or len(history) < 2 or history[0] <= 0:
        return 0.0
    if phase_fn == "relative_to_start":
        return (history[-1] - history[0]) / history[0]
    trend = history[0]
    for h in history[1:-1]:
        trend = ema * trend + (1 - ema) * h
    return (history[-1] - trend) / history[0]


@register_advantage("papo", needs=("entropy_direction", "entropy_history"), groups=True)
def papo_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    entropy_direction: torch.Tensor,  # (B, T) D_t = S_k - C of the behaviour policy
    entropy_history: list[float],  # batch-mean entropies so far, current batch last
    base: str = "grpo",
    norm_std: bool = True,
    eps: float = 1e-6,
    phase_fn: str = "relative_to_start",
    ema: float = 0.9,
    weight_map: str = "linear",
    strength: float = 1.0,
    w_min: float = 0.5,
    w_max: float = 2.0,
    use: str = "sign",
    renormalize: bool = True,
) -> AdvantageOutput:
    """Group advantages reweighted per entropy-polarity branch by the entropy phase (module docstring).

    P_t = -A_t D_t;   A~_t = A_t w_plus(phi) if P_t > 0 else A_t w_minus(phi);   optionally A~ *= sum|A| / sum|A~|
    with A the ``base`` estimator's advantages and phi the entropy phase (docs/algorithms/papo.md).
    """
    if base not in ("grpo", "dr_grpo", "rloo"):
        raise ValueError(f"papo base must be grpo, dr_grpo or rloo, got {base!r}")
    if use not in ("sign", "magnitude"):
        raise ValueError(f"papo use must be 'sign' or 'magnitude', got {use!r}")
    extra = {"norm_std": norm_std, "eps": eps} if base == "grpo" else {}
    base_out = ADVANTAGE_ESTIMATORS[base].fn(rewards=rewards, group_ids=group_ids, response_mask=response_mask, **extra)
    adv = base_out.advantages  # (B, T)
    mask = response_mask.to(adv.dtype)
    polarity = -adv * entropy_direction.to(adv.dtype) * mask  # (B, T)
    phi = papo_phase(entropy_history, phase_fn, ema)
    w_pos, w_neg = papo_weights(phi, weight_map=weight_map, strength=strength, w_min=w_min, w_max=w_max)
    weight = torch.where(polarity > 0, torch.full_like(adv, w_pos), torch.full_like(adv, w_neg))
    if use == "magnitude":
        scale = polarity.abs() / ((polarity.abs() * mask).sum() / mask.sum().clamp(min=1)).clamp(min=1e-12)
        weight = 1.0 + (weight - 1.0) * scale.clamp(max=1.0)
    new_adv = adv * weight * mask
    if renormalize:
        new_adv = new_adv * (adv.abs().sum() / new_adv.abs().sum().clamp(min=1e-12))
    n = mask.sum().clamp(min=1)
    expand = (polarity > 0).to(adv.dtype) * mask
    metrics = {"papo/phase": phi, "papo/w_pos": w_pos, "papo/w_neg": w_neg,
               "papo/frac_expand": float(expand.sum() / n),
               "papo/mean_polarity": float(polarity.sum() / n),
               # share of the advantage mass sum|A| on the expansion branch (P > 0), before and after reweighting
               "papo/expand_share_base": _share(adv * mask, expand), "papo/expand_share": _share(new_adv, expand),
               **base_out.metrics}
    return AdvantageOutput(advantages=new_adv, returns=new_adv, metrics=metrics)


def _share(adv: torch.Tensor, select: torch.Tensor) -> float:
    """sum |adv| over the selected tokens / sum |adv| (0 when every advantage is 0)."""
    total = float(adv.abs().sum())
    return float((adv.abs() * select).sum()) / total if total > 0 else 0.0
