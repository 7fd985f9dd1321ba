"""EVPO: explained-variance gating between the critic (GAE) and the group baseline (docs/algorithms/evpo.md).

Reading implemented (these points are [derived]; each is a hyperparameter):
- EV = 1 - Var(Ret - V) / (Var(Ret) + ev_eps) over the batch's loss tokens, unbiased variances
  (verl's ``vf_explained_var``: ev_eps = 1e-5, the default; ``ev_eps=0`` is the exact ratio, and a batch whose
  returns do not vary then has EV nan or -inf, so the group baseline is used), with Ret the GAE returns;
- EV > ``threshold`` (0, the paper's value) -> GAE advantages (whitened), else GRPO advantages
  (group mean and std, eps 1e-6);
- the gate is per batch (``gate="batch"``, the abstract's reading) or per prompt group (``"group"``);
- returns are the GAE returns in both branches, so the critic keeps training either way;
- GAE's bootstrap (``bootstrap``): ``terminal_zero`` (default: next loss token's value, 0 after the final action)
  or ``agentgym`` (AgentGym-RL's: the value at the next position, :func:`credo.algo.advantages.returns.gae`).
"""
from __future__ import annotations

import torch

from credo.algo.advantages.common import explained_variance, masked_var, masked_whiten
from credo.algo.advantages.outcome import grpo_advantage
from credo.algo.advantages.returns import gae
from credo.algo.registry import register_advantage
from credo.types import AdvantageOutput


@register_advantage("evpo", needs=("values",))
def evpo_advantage(
    *,
    rewards: torch.Tensor,  # (B,) or (B, T)
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    values: torch.Tensor,  # (B, T)
    threshold: float = 0.0,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_std: bool = True,
    eps: float = 1e-6,
    gate: str = "batch",
    ev_eps: float = 1e-5,
    bootstrap: str = "terminal_zero",
) -> AdvantageOutput:
    """Critic advantages when the critic explains the returns (EV > threshold), group baseline otherwise.

    EV = 1 - Var(Ret - V) / (Var(Ret) + ev_eps)   over the loss tokens (per batch, or per group with gate="group")
    A  = whiten(gae(r, V; gamma, lam))  if EV > threshold,  else  (R_i - mean_g R) / (std_g R + eps)
    returns = the GAE returns in both branches (docs/algorithms/evpo.md).
    """
    if gate not in ("batch", "group"):
        raise ValueError(f"evpo gate must be 'batch' or 'group', got {gate!r}")
    if ev_eps < 0:
        raise ValueError(f"evpo ev_eps must be >= 0, got {ev_eps}")
    gae_adv, returns = gae(rewards, values, response_mask, gamma=gamma, lam=lam, bootstrap=bootstrap)
    gae_adv = masked_whiten(gae_adv, response_mask)
    group_adv = grpo_advantage(rewards=rewards, group_ids=group_ids, response_mask=response_mask,
                               norm_std=norm_std, eps=eps).advantages
    ev = explained_variance(returns, values.detach(), response_mask, eps=ev_eps)
    if gate == "batch":
        use_critic = torch.full((rewards.shape[0],), ev > threshold)
    else:
        use_critic = torch.zeros(rewards.shape[0], dtype=torch.bool)
        for g in torch.unique(group_ids):
            rows = group_ids == g
            use_critic[rows] = explained_variance(returns[rows], values[rows].detach(), response_mask[rows],
                                                  eps=ev_eps) > threshold
    adv = torch.where(use_critic.unsqueeze(-1), gae_adv, group_adv.to(gae_adv.dtype))
    metrics = {"evpo/explained_variance": ev, "evpo/use_critic": float(use_critic.float().mean()),
               **_residual_variances(rewards, group_ids, response_mask, returns, values.detach(), use_critic)}
    return AdvantageOutput(advantages=adv, returns=returns, metrics=metrics)


def _residual_variances(rewards, group_ids, response_mask, returns, values, use_critic) -> dict[str, float]:
    """Variance over the loss tokens of the un-normalised advantage (return minus baseline) under each baseline,
    the quantity the gate's guarantee is about (docs/algorithms/evpo.md, "Evidence"):

    - ``evpo/resid_var_critic``: Var(Ret - V), the critic's;
    - ``evpo/resid_var_batch``: Var(Ret), the batch-mean baseline's (EV's denominator: EV > 0 iff critic < batch);
    - ``evpo/resid_var_group``: Var(R - mean_g R), the group-mean baseline of the GRPO branch (no std division);
    - ``evpo/resid_var_chosen``: the same for the baseline the gate picked per row;
    - ``evpo/picked_lower``: 1 when the chosen variance is at most the smaller of critic and group (+1e-12).
    """
    critic = returns - values
    group = grpo_advantage(rewards=rewards, group_ids=group_ids, response_mask=response_mask,
                           norm_std=False).advantages.to(critic.dtype)
    chosen = torch.where(use_critic.unsqueeze(-1), critic, group)
    v = {name: float(masked_var(x, response_mask))
         for name, x in (("critic", critic), ("batch", returns), ("group", group), ("chosen", chosen))}
    return {**{f"evpo/resid_var_{k}": x for k, x in v.items()},
            "evpo/picked_lower": float(v["chosen"] <= min(v["critic"], v["group"]) + 1e-12)}
