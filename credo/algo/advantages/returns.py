"""Return-based estimators: GAE (with a critic), REINFORCE++ and ReMax (``baselines.md`` §2).

Token rewards: a (B,) score is placed on each row's last loss token; (B, T) token rewards are used
as given. Positions outside ``response_mask`` (padding, tool / environment tokens) are transparent:
GAE carries V and the running advantage across them unchanged, as verl's multi-turn GAE does.
"""
from __future__ import annotations

import torch

from credo.algo.advantages.common import broadcast, masked_whiten, token_rewards
from credo.algo.registry import register_advantage
from credo.types import AdvantageOutput


def gae(rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, *, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (B, T), unwhitened. TD_t = r_t + gamma V_{t+1} - V_t,
    A_t = TD_t + gamma lam A_{t+1}, right to left over loss tokens; terminal value 0; returns = A + V."""
    r = token_rewards(rewards, response_mask)  # (B, T)
    m = response_mask.float()
    v = values.detach().float()
    b, t_len = r.shape
    next_value = torch.zeros(b)
    running = torch.zeros(b)
    adv = torch.zeros(b, t_len)
    for t in reversed(range(t_len)):
        delta = r[:, t] + gamma * next_value - v[:, t]
        candidate = delta + gamma * lam * running
        next_value = m[:, t] * v[:, t] + (1 - m[:, t]) * next_value  # skip masked positions
        running = m[:, t] * candidate + (1 - m[:, t]) * running
        adv[:, t] = running
    return adv * m, (adv + v) * m


@register_advantage("gae", needs=("values",))
def gae_advantage(
    *,
    rewards: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    values: torch.Tensor,  # (B, T) critic values of the states before each response token
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> AdvantageOutput:
    """GAE (verl ``gae``): advantages whitened over the batch's loss tokens; returns = A + V (unwhitened).

    Defaults gamma = lam = 1.0 (verl ``algorithm.gamma`` / ``lam``). Needs a critic (``critic.*``).
    """
    adv, returns = gae(rewards, values, response_mask, gamma=gamma, lam=lam)
    if whiten:
        adv = masked_whiten(adv, response_mask)
    return AdvantageOutput(advantages=adv, returns=returns)


def discounted_returns(rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Ret_t = sum_{k >= t} gamma^(k - t) r_k over loss tokens, reset across masked positions (B, T)."""
    r = token_rewards(rewards, response_mask)
    m = response_mask.float()
    running = torch.zeros(r.shape[0])
    out = torch.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + gamma * running
        out[:, t] = running
        running = running * m[:, t]
    return out * m


@register_advantage("reinforce_pp")
def reinforce_pp_advantage(
    *,
    rewards: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    gamma: float = 1.0,
) -> AdvantageOutput:
    """REINFORCE++: A = whiten(Ret) over all loss tokens of the batch; returns = Ret."""
    returns = discounted_returns(rewards, response_mask, gamma)
    return AdvantageOutput(advantages=masked_whiten(returns, response_mask), returns=returns)


@register_advantage("remax", needs=("reward_baselines",))
def remax_advantage(
    *,
    rewards: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    reward_baselines: torch.Tensor,  # (B,) score of a greedy response to the same prompt
) -> AdvantageOutput:
    """ReMax: A_t = Ret_t - b_i with Ret the reverse cumulative sum of token rewards and b_i the
    reward of a greedy rollout of the same prompt (the recipe runs it); returns = Ret."""
    returns = discounted_returns(rewards, response_mask, 1.0)
    adv = returns - broadcast(reward_baselines.float(), response_mask)
    return AdvantageOutput(advantages=adv, returns=returns)
