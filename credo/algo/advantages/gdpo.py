"""GDPO: group reward-decoupled normalisation (arXiv 2601.05242; verl ``compute_gdpo_outcome_advantage``).

Instead of normalising the summed reward, each reward component k is group-normalised on its own, so a component
with a large spread does not drown out the others::

    A_k,i = (r_k,i - mean_g r_k) / (std_g r_k + eps)     GRPO per component (std unbiased; no std if not norm_std)
    A_i   = sum_k w_k A_k,i                              broadcast over the response
    A     = masked_whiten(A)                             over every loss token of the batch (unbiased var, + 1e-8)

The components are ``reward_components`` (name -> (B,) score). Without components (and no ``reward_keys``) the
sequence score is the only component (verl's fallback), i.e. GRPO followed by batch whitening.
"""
from __future__ import annotations

import torch

from credo.algo.advantages.common import compute_dtype, group_stats, masked_whiten, sequence_scores
from credo.algo.advantages.outcome import grpo_advantage
from credo.algo.registry import register_advantage
from credo.types import AdvantageOutput


def select_components(reward_components: dict | None, reward_keys: list) -> list[tuple[str, torch.Tensor]]:
    """The (name, (B,) score) pairs GDPO normalises: ``reward_keys`` in order, or every component if empty.

    A key that is not a component raises ValueError naming the available ones.
    """
    comps = dict(reward_components or {})
    keys = list(reward_keys) or list(comps)
    missing = [k for k in keys if k not in comps]
    if missing:
        raise ValueError(f"gdpo: reward component {missing[0]!r} not found; available: {sorted(comps) or 'none'} "
                         f"(reward.mix components or a verifier's extra dict keys)")
    return [(k, torch.as_tensor(comps[k])) for k in keys]


@register_advantage("gdpo", needs=("reward_components",), groups=True)
def gdpo_advantage(
    *,
    rewards: torch.Tensor,  # (B,) scores or (B, T) token rewards (the fallback component)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    reward_components: dict | None = None,  # name -> (B,) score of each reward component
    reward_keys: list = [],  # (read only) components to use, in order; [] = all of them
    reward_weights: list = [],  # (read only) w_k per used component; [] = 1 each
    norm_std: bool = True,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """GDPO: sum_k w_k GRPO(r_k), whitened over the batch's loss tokens (docs/algorithms/gdpo.md).

    A_k,i = (r_k,i - mean_g r_k) / (std_g r_k + eps);   A = masked_whiten(sum_k w_k A_k,i)

    ``reward_components`` is a required input (the trainer provides it; ``{}`` when the rewards have none); the
    function itself also takes None, as ``{}``.

    verl: eps 1e-6, ``norm_adv_by_std_in_grpo`` True, weights 1. Returns equal the advantages.
    """
    comps = select_components(reward_components, reward_keys)
    scores = comps or [("score", sequence_scores(rewards, response_mask))]
    if reward_weights and len(reward_weights) != len(scores):
        raise ValueError(f"gdpo: reward_weights has {len(reward_weights)} entries for {len(scores)} reward "
                         f"components ({', '.join(k for k, _ in scores)})")
    weights = [float(w) for w in reward_weights] or [1.0] * len(scores)
    dtype = compute_dtype(rewards, response_mask, *(v for _, v in scores))
    mask = response_mask.to(dtype)
    total = torch.zeros_like(mask)
    metrics: dict[str, float] = {}
    for (key, score), w in zip(scores, weights):
        if score.shape != (mask.shape[0],):
            raise ValueError(f"gdpo: reward component {key!r} has shape {tuple(score.shape)}, expected "
                             f"({mask.shape[0]},)")
        out = grpo_advantage(rewards=score.to(dtype), group_ids=group_ids, response_mask=mask, norm_std=norm_std,
                             eps=eps)
        total = total + w * out.advantages
        metrics[f"gdpo/{key}/frac_zero_std"] = out.metrics["frac_reward_zero_std"]
    adv = masked_whiten(total, mask)
    seq = sequence_scores(rewards, mask).to(dtype)
    _, std, count = group_stats(seq, group_ids)
    metrics["frac_reward_zero_std"] = (float(((std == 0).to(dtype) / count).sum() / (1.0 / count).sum())
                                      if len(seq) else 0.0)
    return AdvantageOutput(advantages=adv, returns=adv, metrics=metrics)
