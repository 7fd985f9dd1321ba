"""DFPO's actor advantage (``algo.advantage: dfpo``; docs/algorithms/dfpo.md, [derived]).

credo's :func:`gae` on the flow critic's old value V_bar (its single-step Euler readout), whitened as ``gae``; with
``risk_readout: cvar`` on CVaR_alpha of the old quantiles q_bar instead (the risk-averse reading of DFPO's
"Conditional Value Risk Optimization"). Also returns the distributional GAE targets y = q_bar + A of the old
quantiles (DVPO Eq. 2, :func:`credo.algo.dvpo.distributional_gae`), the tail terms' targets of ``critic.loss=dfpo``.
Registered into :data:`credo.algo.registry.ADVANTAGE_ESTIMATORS`, which names this module among its built-ins.
"""
from __future__ import annotations

import torch

from credo.algo.advantages.common import masked_whiten
from credo.algo.advantages.returns import gae
from credo.algo.dfpo import cvar_readout
from credo.algo.dvpo import distributional_gae
from credo.algo.registry import register_advantage
from credo.types import AdvantageOutput

RISK_READOUTS = ("mean", "cvar")


@register_advantage("dfpo", needs=("values", "value_quantiles"))
def dfpo_advantage(
    *,
    rewards: torch.Tensor,  # (B,) or (B, T)
    response_mask: torch.Tensor,  # (B, T)
    values: torch.Tensor,  # (B, T) V_bar: the flow critic's value readout at collection
    value_quantiles: torch.Tensor,  # (B, T, M) q_bar: its sorted multi-step quantiles at collection
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = True,
    risk_readout: str = "mean",
    alpha: float = 0.1,
) -> AdvantageOutput:
    """DFPO: A = gae(r, V_bar) (``risk_readout: mean``) or gae(r, CVaR_alpha(q_bar)) (``cvar``), whitened over loss
    tokens; returns = A + baseline (unwhitened); return_quantiles = q_bar + A_q (distributional GAE).
    Defaults gamma 1.0, lam 0.95 (DVPO's script, which credo's DFPO reading follows).

    See docs/algorithms/dfpo.md.
    """
    if risk_readout not in RISK_READOUTS:
        raise ValueError(f"dfpo risk_readout must be mean or cvar, got {risk_readout!r}")
    base = values if risk_readout == "mean" else cvar_readout(value_quantiles, alpha) * response_mask
    adv, returns = gae(rewards, base, response_mask, gamma=gamma, lam=lam)
    _, targets = distributional_gae(rewards, value_quantiles, response_mask, gamma=gamma, lam=lam)  # (B, T, M)
    if whiten:
        adv = masked_whiten(adv, response_mask)
    return AdvantageOutput(advantages=adv, returns=returns, return_quantiles=targets)
