"""DVPO's advantage estimator: distributional GAE over a quantile critic (docs/algorithms/dvpo.md, Eq. 2).

The math is :func:`credo.algo.dvpo.distributional_gae` (credo's scalar GAE per quantile); the critic loss is
:mod:`credo.methods.dvpo.critic`. Registered into :data:`credo.algo.registry.ADVANTAGE_ESTIMATORS`, which names this
module among its built-ins.
"""
from __future__ import annotations

import torch

from credo.algo.advantages.common import masked_whiten
from credo.algo.dvpo import distributional_gae
from credo.algo.registry import register_advantage
from credo.types import AdvantageOutput


@register_advantage("dvpo", needs=("value_quantiles",))
def dvpo_advantage(
    *,
    rewards: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    value_quantiles: torch.Tensor,  # (B, T, M) head-mean critic quantiles of the states before each token
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = True,
) -> AdvantageOutput:
    """DVPO: advantage = mean_j A_{t,j} of the distributional GAE (whitened over loss tokens);
    returns = mean_j of the quantile targets q + A; ``return_quantiles`` = the (B, T, M) targets.

    Defaults gamma = 1.0, lam = 0.95 (the port's run script). Needs a quantile critic.
    See docs/algorithms/dvpo.md.
    """
    adv_q, targets = distributional_gae(rewards, value_quantiles, response_mask, gamma=gamma, lam=lam)  # (B, T, M)
    adv = adv_q.mean(-1)  # (B, T)
    if whiten:
        adv = masked_whiten(adv, response_mask)
    return AdvantageOutput(advantages=adv, returns=targets.mean(-1), return_quantiles=targets)
