"""Outcome advantage estimators with group baselines (docs/algorithms/README.md#advantage-estimators-algoadvantage;
each estimator's page is cited in its docstring).

Each computes one advantage per sequence from the sequence score ``R_i`` and broadcasts it:
``A_it = A_i * m_it``. ``rewards`` may be (B,) scores or (B, T) token rewards (summed per sequence).
"""
from __future__ import annotations

import torch

from credo.algo.advantages.common import broadcast, group_stats, masked_whiten, sequence_scores
from credo.algo.registry import register_advantage
from credo.types import AdvantageOutput


@register_advantage("grpo", groups=True)
def grpo_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    norm_std: bool = True,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """GRPO: A_i = (R_i - mean_g R) / (std_g R + eps), std unbiased (N-1); without std if norm_std=False.

    verl ``compute_grpo_outcome_advantage``: eps = 1e-6, a group of size 1 gets mean 0 and std 1.
    Returns equal the advantages.
    See docs/algorithms/grpo.md.
    """
    rewards = sequence_scores(rewards, response_mask)
    mean, std, count = group_stats(rewards, group_ids)
    adv = rewards - mean
    if norm_std:
        adv = adv / (std + eps)
    num_groups = float((1.0 / count).sum()) if len(rewards) else 1.0
    zero_std = float(((std == 0).float() / count).sum()) / max(num_groups, 1.0)  # fraction of groups
    adv_t = broadcast(adv, response_mask)  # (B, T)
    return AdvantageOutput(advantages=adv_t, returns=adv_t, metrics={"frac_reward_zero_std": zero_std})


@register_advantage("dr_grpo", groups=True)
def dr_grpo_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
) -> AdvantageOutput:
    """Dr.GRPO: A_i = R_i - mean_g R (no std normalisation; pair with ``seq-mean-token-sum-norm``).

    See docs/algorithms/dr_grpo.md.
    """
    return grpo_advantage(rewards=rewards, group_ids=group_ids, response_mask=response_mask, norm_std=False)


@register_advantage("rloo", groups=True)
def rloo_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
) -> AdvantageOutput:
    """RLOO: A_i = R_i - mean of the other G-1 rewards of the group = G/(G-1) (R_i - mean_g R).

    A group of size 1 gets A = R (verl ``rloo``).
    See docs/algorithms/rloo.md.
    """
    rewards = sequence_scores(rewards, response_mask)
    mean, _, count = group_stats(rewards, group_ids)
    scale = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.ones_like(count))
    adv = scale * (rewards - mean)
    adv_t = broadcast(adv, response_mask)
    return AdvantageOutput(advantages=adv_t, returns=adv_t)


@register_advantage("opo", groups=True)
def opo_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
) -> AdvantageOutput:
    """OPO: length-weighted group baseline b_g = sum_j |y_j| R_j / sum_j |y_j|; A_i = R_i - b_g.

    A group of size 1 gets b = 0, so A = R (verl ``opo``; as ``grpo`` and ``rloo`` treat singletons).

    See docs/algorithms/opo.md.
    """
    r = sequence_scores(rewards, response_mask)  # (B,)
    lengths = response_mask.to(r.dtype).sum(-1)  # (B,)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(groups, dtype=r.dtype).index_add_(0, inverse, torch.ones_like(r))
    num = torch.zeros(groups, dtype=r.dtype).index_add_(0, inverse, lengths * r)
    den = torch.zeros(groups, dtype=r.dtype).index_add_(0, inverse, lengths)
    baseline = torch.where(count > 1, num / den.clamp(min=1e-12), torch.zeros_like(num))[inverse]  # (B,)
    adv_t = broadcast(r - baseline, response_mask)
    return AdvantageOutput(advantages=adv_t, returns=adv_t)


@register_advantage("gpg", groups=True)
def gpg_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    f_norm: float = 1.0,
) -> AdvantageOutput:
    """GPG (arXiv 2504.02546; verl ``gpg``): A_i = alpha (R_i - mean_g R) / f_norm with
    alpha = B / max(#{i : R_i != 0}, 1) over the batch (the paper's correction for rows that carry no signal).

    A group of size 1 has mean 0 (A = alpha R / f_norm). No std normalisation. Default f_norm = 1.0 (verl's).

    See docs/algorithms/gpg.md.
    """
    if f_norm == 0:
        raise ValueError("gpg f_norm must be nonzero")
    r = sequence_scores(rewards, response_mask)  # (B,)
    mean, _, _ = group_stats(r, group_ids)
    alpha = len(r) / max(int(torch.count_nonzero(r)), 1)
    adv_t = broadcast(alpha * (r - mean) / f_norm, response_mask)
    return AdvantageOutput(advantages=adv_t, returns=adv_t, metrics={"gpg/alpha": float(alpha)})


@register_advantage("grpo_passk", groups=True)
def grpo_passk_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    norm_std: bool = True,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """Pass@k GRPO (arXiv 2503.19595; verl ``grpo_passk``): only each group's best sample gets
    A = R_max - R_second (divided by std_g + eps if norm_std); all others get 0. Ties for the best
    go to the first sample. Needs groups of size >= 2.
    See docs/algorithms/grpo_passk.md.
    """
    r = sequence_scores(rewards, response_mask)
    _, std, count = group_stats(r, group_ids)
    if bool((count < 2).any()):
        raise ValueError("grpo_passk needs at least 2 samples per group (rollout.group_size >= 2)")
    adv = torch.zeros_like(r)
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero().flatten()
        vals = r[idx]
        order = torch.argsort(vals, descending=True, stable=True)
        best, second = idx[order[0]], idx[order[1]]
        gap = r[best] - r[second]
        adv[best] = gap / (std[best] + eps) if norm_std else gap
    adv_t = broadcast(adv, response_mask)
    return AdvantageOutput(advantages=adv_t, returns=adv_t)


@register_advantage("reinforce_pp_baseline", groups=True)
def reinforce_pp_baseline_advantage(
    *,
    rewards: torch.Tensor,  # (B,)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
) -> AdvantageOutput:
    """REINFORCE++-baseline: R_i - mean_g R (no std), broadcast, then whitened over all valid tokens
    of the batch (masked mean, unbiased variance, + 1e-8).

    A_it = whiten(R_i - mean_g R) m_it;   returns = A (docs/algorithms/reinforce_pp.md).
    """
    r = sequence_scores(rewards, response_mask)
    mean, _, _ = group_stats(r, group_ids)
    adv_t = masked_whiten(broadcast(r - mean, response_mask), response_mask)
    return AdvantageOutput(advantages=adv_t, returns=adv_t)
