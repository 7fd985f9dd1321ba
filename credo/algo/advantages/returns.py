"""Return-based estimators: GAE (with a critic), REINFORCE++ and ReMax (docs/algorithms/gae.md,
docs/algorithms/reinforce_pp.md, docs/algorithms/remax.md).

Token rewards: a (B,) score is placed on each row's last loss token; (B, T) token rewards are used
as given (times the mask). Positions outside ``response_mask`` (padding, tool / environment tokens) are
transparent for every estimator here: the running return, and GAE's next value and running advantage, are
carried across them unchanged (no discount), as verl 0.9.1 does, so the turns before an environment span
receive the reward placed after it. Computation keeps the inputs' floating dtype.
"""
from __future__ import annotations

import torch

from credo.algo.advantages.common import broadcast, compute_dtype, masked_whiten, token_rewards
from credo.algo.registry import register_advantage
from credo.types import AdvantageOutput

BOOTSTRAPS = ("terminal_zero", "agentgym")


def gae(rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, *, gamma: float, lam: float,
        bootstrap: str = "terminal_zero") -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (B, T), unwhitened. Right to left over loss tokens:
    TD_t = r_t + gamma V_next - V_t, A_t = TD_t + gamma lam A_next; returns = A + V.

    ``bootstrap`` picks V_next at a loss token t:
    - ``terminal_zero`` (default; verl 0.9.1): V of the next loss token, skipping masked spans; 0 after the
      final one.
    - ``agentgym`` (AgentGym-RL's fork): ``values[t + 1]`` whatever position that is (an environment token's
      value at the end of a turn, the value after the final action), 0 at t = T - 1. ``values`` must then hold
      the critic's values on masked real tokens too (the recipe keeps them on every non-padding token).
    The running advantage is carried across masked positions in both."""
    if bootstrap not in BOOTSTRAPS:
        raise ValueError(f"gae bootstrap must be one of {', '.join(BOOTSTRAPS)}, got {bootstrap!r}")
    dtype = compute_dtype(rewards, values)
    r = token_rewards(rewards, response_mask).to(dtype)  # (B, T)
    m = response_mask.to(dtype)
    v = values.detach().to(dtype)
    b, t_len = r.shape
    next_value = torch.zeros(b, dtype=dtype)
    running = torch.zeros(b, dtype=dtype)
    adv = torch.zeros(b, t_len, dtype=dtype)
    for t in reversed(range(t_len)):
        if bootstrap == "agentgym":
            next_value = v[:, t + 1] if t + 1 < t_len else torch.zeros(b, dtype=dtype)
        delta = r[:, t] + gamma * next_value - v[:, t]
        candidate = delta + gamma * lam * running
        if bootstrap == "terminal_zero":
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
    bootstrap: str = "terminal_zero",
) -> AdvantageOutput:
    """GAE (verl ``gae``): advantages whitened over the batch's loss tokens; returns = A + V (unwhitened).

    delta_t = r_t + gamma V_next(t) - V_t;  A_t = delta_t + gamma lam A_next(t);  advantages = whiten(A)
    (next(t): the next loss token, masked spans skipped; V after the final action is 0 with terminal_zero)
    Defaults gamma = lam = 1.0 (verl ``algorithm.gamma`` / ``lam``); ``bootstrap`` as in :func:`gae`
    (``agentgym`` = AgentGym-RL's next-position bootstrap). Needs a critic (``critic.*``).
    See docs/algorithms/gae.md.
    """
    adv, returns = gae(rewards, values, response_mask, gamma=gamma, lam=lam, bootstrap=bootstrap)
    if whiten:
        adv = masked_whiten(adv, response_mask)
    return AdvantageOutput(advantages=adv, returns=returns)


def discounted_returns(rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, T) Ret_t = r_t + gamma Ret_next over loss tokens, right to left; a masked position (an environment span,
    padding) passes the running return through unchanged and undiscounted (verl ``reinforce_plus_plus``), and gets 0.
    """
    r = token_rewards(rewards, response_mask)  # (B, T)
    m = response_mask.to(r.dtype)
    running = torch.zeros(r.shape[0], dtype=r.dtype)
    out = torch.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        running = m[:, t] * (r[:, t] + gamma * running) + (1 - m[:, t]) * running
        out[:, t] = running
    return out * m


@register_advantage("reinforce_pp")
def reinforce_pp_advantage(
    *,
    rewards: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    gamma: float = 1.0,
) -> AdvantageOutput:
    """REINFORCE++: A = whiten(Ret) over all loss tokens of the batch; returns = Ret.

    Ret_t = sum_{k >= t} gamma^(k - t) r_k over the loss tokens (masked spans carried without discount).
    See docs/algorithms/reinforce_pp.md.
    """
    returns = discounted_returns(rewards, response_mask, gamma)
    return AdvantageOutput(advantages=masked_whiten(returns, response_mask), returns=returns)


@register_advantage("remax", needs=("reward_baselines",))
def remax_advantage(
    *,
    rewards: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    reward_baselines: torch.Tensor,  # (B,) score of a greedy response to the same prompt
) -> AdvantageOutput:
    """ReMax: A_t = Ret_t - b_i with Ret the reverse cumulative sum of the masked token rewards (carried across
    masked spans, as verl's cumsum) and b_i the reward of a greedy rollout of the same prompt (the recipe runs it);
    returns = Ret.

    See docs/algorithms/remax.md.
    """
    returns = discounted_returns(rewards, response_mask, 1.0)
    adv = returns - broadcast(reward_baselines.to(returns.dtype), response_mask.to(returns.dtype))
    return AdvantageOutput(advantages=adv, returns=returns)
