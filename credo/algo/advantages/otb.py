"""Optimal Token Baseline (OTB, arXiv 2602.07078; verl ``optimal_token_baseline`` / ``tir_optimal_token_baseline``).

A per-token baseline from the prompt's group, weighted by each trajectory's *realized energy*::

    G_t   = sum_{s >= t} r_s m_s                      reward-to-go (returns), carried across masked positions
    w_t   = (1 - 2 pi_t + sum_v pi_v^2) * rho_t^2     logit-gradient proxy of ||grad log pi_t||^2; rho: rollout IS
                                                      weights when rollout correction is on, else 1
    W_t   = sum_{s <= t} w_s m_s                      cumulative path energy
    B_t   = sum_i G_t^i W_t^i m_t^i / (sum_i W_t^i m_t^i + eps)     over the group's trajectories i
    A_t   = (G_t - B_t) m_t

``pi_t = exp(old_logprobs)`` is the behaviour policy's probability of the sampled token and ``sum_pi_squared`` its
sum over the vocabulary of pi^2 (:func:`sum_pi_squared_from_logits`). A group of one trajectory gets no baseline
(A = G). ``handle_zero_tail``: when a group's longest trajectory is the only one that long, its baseline beyond the
second-longest length is 0 (there the baseline is its own return, which would zero its advantage).

The single-turn estimator aligns trajectories by absolute position t. The multi-turn (TIR) one aligns them by the
k-th *loss* token, so a tool / environment span (mask 0) does not shift the comparison; its rows without any loss
token take no part in the groups.
"""
from __future__ import annotations

import torch

from credo.algo.advantages.common import compute_dtype, token_rewards
from credo.algo.logprobs import sum_pi_squared_from_logits  # noqa: F401  (re-exported: the statistic OTB reads)
from credo.algo.registry import register_advantage
from credo.types import AdvantageOutput

OTB_INPUTS = ("old_logprobs", "sum_pi_squared")


def reward_to_go(token_rewards_: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) G_t = sum_{s >= t} r_s m_s (not masked: a masked position carries the return of what follows)."""
    return (token_rewards_ * mask).flip(-1).cumsum(-1).flip(-1)


def path_energy(old_logprobs: torch.Tensor, sum_pi_squared: torch.Tensor, mask: torch.Tensor,
                rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token energy w_t = (1 - 2 pi_t + sum pi^2) rho_t^2 and its masked cumulative sum W_t, both (B, T)."""
    w = 1.0 - 2.0 * torch.exp(old_logprobs.to(mask.dtype)) + sum_pi_squared.to(mask.dtype)
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.to(mask.dtype) ** 2
    return w, (w * mask).cumsum(-1)


def _tail_start(lengths: torch.Tensor, inverse: torch.Tensor, members: torch.Tensor, num_groups: int,
                width: int) -> torch.Tensor:
    """(B,) first position whose baseline ``handle_zero_tail`` sets to 0: the second-longest length of the group
    for a group's unique longest member (when longer than all others), ``width`` (none) for every other row."""
    neg = torch.full((num_groups,), -1.0, dtype=torch.float64)
    lens = torch.where(members, lengths.double(), torch.full_like(lengths, -1.0, dtype=torch.float64))
    longest = neg.clone().scatter_reduce_(0, inverse, lens, "amax")  # (G,)
    at_max = members & (lens == longest[inverse])
    n_at_max = torch.zeros(num_groups, dtype=torch.long).index_add_(0, inverse, at_max.long())
    others = torch.where(at_max, torch.full_like(lens, -1.0), lens)
    second = neg.clone().scatter_reduce_(0, inverse, others, "amax")  # (G,) -1: no other member
    size = torch.zeros(num_groups, dtype=torch.long).index_add_(0, inverse, members.long())
    hit = at_max & (n_at_max[inverse] == 1) & (size[inverse] > 1)
    return torch.where(hit, second[inverse].long(), torch.full_like(inverse, width))


def group_token_baseline(returns: torch.Tensor, energy: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor,
                         members: torch.Tensor, *, handle_zero_tail: bool, epsilon: float) -> torch.Tensor:
    """(B, T) B_t = sum_i G_t W_t m_t / (sum_i W_t m_t + eps) over each row's group (position-aligned inputs);
    0 for rows alone in their group and for rows not ``members``; ``handle_zero_tail`` as in the module doc."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    sel = members.to(mask.dtype).unsqueeze(-1)  # (B, 1)
    num = torch.zeros(num_groups, mask.shape[1], dtype=mask.dtype).index_add_(0, inverse, returns * energy * mask * sel)
    den = torch.zeros(num_groups, mask.shape[1], dtype=mask.dtype).index_add_(0, inverse, energy * mask * sel)
    size = torch.zeros(num_groups, dtype=torch.long).index_add_(0, inverse, members.long())
    baseline = (num / (den + epsilon))[inverse]  # (B, T)
    keep = (members & (size[inverse] > 1)).to(mask.dtype).unsqueeze(-1)
    if handle_zero_tail:
        start = _tail_start(mask.sum(-1), inverse, members, num_groups, mask.shape[1])
        positions = torch.arange(mask.shape[1]).unsqueeze(0)
        keep = keep * (positions < start.unsqueeze(-1)).to(mask.dtype)
    return baseline * keep


def _prepare(rewards, response_mask, old_logprobs, sum_pi_squared, rollout_is_weights):
    """(mask, returns G, per-token energy w, cumulative energy W) in the inputs' common floating dtype."""
    dtype = compute_dtype(rewards, response_mask, old_logprobs, sum_pi_squared, rollout_is_weights)
    mask = response_mask.to(dtype)
    returns = reward_to_go(token_rewards(rewards, mask).to(dtype), mask)
    w, cum = path_energy(old_logprobs, sum_pi_squared, mask, rollout_is_weights)
    return mask, returns, w, cum


def _metrics(w: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor) -> dict[str, float]:
    n = mask.sum().clamp(min=1)
    _, counts = torch.unique(group_ids, return_counts=True)
    return {"otb/token_energy_mean": float((w * mask).sum() / n),
            "otb/frac_singleton_groups": float((counts == 1).double().mean()) if counts.numel() else 0.0}


@register_advantage("optimal_token_baseline", needs=OTB_INPUTS, groups=True)
def optimal_token_baseline_advantage(
    *,
    rewards: torch.Tensor,  # (B,) scores or (B, T) token rewards
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T) behaviour policy's log-prob of each sampled token
    sum_pi_squared: torch.Tensor,  # (B, T) sum_v pi(v)^2 of the behaviour policy
    rollout_is_weights: torch.Tensor | None = None,  # (B, T) rollout-correction weights (w scaled by rho^2)
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> AdvantageOutput:
    """OTB: A_t = G_t - B_t with the energy-weighted group baseline per absolute position (module docstring).

    B_t = sum_i G_t^i W_t^i m_t^i / (sum_i W_t^i m_t^i + eps);   A_t = (G_t - B_t) m_t (docs/algorithms/otb.md).

    verl ``compute_optimal_token_baseline_advantage``: eps 1e-8, ``handle_zero_tail`` True. Returns = G_t.
    """
    mask, returns, w, cum = _prepare(rewards, response_mask, old_logprobs, sum_pi_squared, rollout_is_weights)
    members = torch.ones(mask.shape[0], dtype=torch.bool)  # verl groups every row, empty ones too
    baseline = group_token_baseline(returns, cum, mask, group_ids, members, handle_zero_tail=handle_zero_tail,
                                    epsilon=epsilon)
    return AdvantageOutput(advantages=(returns - baseline) * mask, returns=returns,
                           metrics=_metrics(w, mask, group_ids))


@register_advantage("tir_optimal_token_baseline", needs=OTB_INPUTS, groups=True)
def tir_optimal_token_baseline_advantage(
    *,
    rewards: torch.Tensor,  # (B,) scores or (B, T) token rewards
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T) 0 on environment / tool tokens and padding
    old_logprobs: torch.Tensor,  # (B, T)
    sum_pi_squared: torch.Tensor,  # (B, T)
    rollout_is_weights: torch.Tensor | None = None,  # (B, T)
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> AdvantageOutput:
    """Multi-turn OTB: the group baseline of the k-th loss token of each trajectory (environment spans skipped).

    A_t = (G_t - B_k(t)) m_t,  B_k = sum_i G_k^i W_k^i / (sum_i W_k^i + eps) over the group's rows, k(t) = the
    index of loss token t among its row's loss tokens (docs/algorithms/otb.md).

    verl ``compute_multi_turn_optimal_token_baseline_advantage``: G and W are gathered onto the loss tokens
    (left-packed), the baseline is taken per packed index k, and A is scattered back. Rows without loss tokens
    are left out of the groups. Returns = G_t at every position (not packed).
    """
    mask, returns, w, cum = _prepare(rewards, response_mask, old_logprobs, sum_pi_squared, rollout_is_weights)
    loss = mask > 0
    rows, cols = loss.nonzero(as_tuple=True)
    rank = (loss.long().cumsum(-1) - 1)[rows, cols]  # k: index of the token among its row's loss tokens
    packed_g, packed_w = torch.zeros_like(mask), torch.zeros_like(mask)
    packed_g[rows, rank], packed_w[rows, rank] = returns[rows, cols], cum[rows, cols]
    lengths = loss.sum(-1)  # (B,)
    packed_mask = (torch.arange(mask.shape[1]).unsqueeze(0) < lengths.unsqueeze(-1)).to(mask.dtype)
    baseline = group_token_baseline(packed_g, packed_w, packed_mask, group_ids, lengths > 0,
                                    handle_zero_tail=handle_zero_tail, epsilon=epsilon)
    adv = torch.zeros_like(mask)
    adv[rows, cols] = (packed_g - baseline)[rows, rank]
    return AdvantageOutput(advantages=adv * mask, returns=returns, metrics=_metrics(w, mask, group_ids))
