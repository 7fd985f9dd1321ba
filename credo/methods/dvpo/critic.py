"""DVPO's critic loss (``critic.loss: dvpo``; docs/algorithms/dvpo.md): the weighted sum of its terms
(:mod:`credo.algo.dvpo`) on a ``quantile`` head's quantiles against the distributional GAE's quantile targets
(``algo.advantage=dvpo``); registered into :data:`credo.algo.critic.CRITIC_LOSSES`."""
from __future__ import annotations

import torch

from credo.algo.critic import register_critic_loss
from credo.algo.dvpo import dvpo_critic_terms
from credo.algo.registry import TokenLoss


@register_critic_loss("dvpo", needs=("quantiles", "return_quantiles"))
def dvpo_loss(*, values, response_mask, quantiles, return_quantiles, kappa: float = 1.0,
              risk_gamma: float = 1.0, risk_weighting: str = "per_quantile", alpha: float = 0.1, beta: float = 0.1,
              qr_coef: float = 1.0, cvar_coef: float = 1.0, upper_coef: float = 1.0, mean_shift_coef: float = 1.0,
              tail_shape_coef: float = 1.0, curvature_coef: float = 1.0, consistency_coef: float = 1.0,
              tail_curvature: str = "in_tail") -> TokenLoss:
    """DVPO Eq. 11: the sum of the weighted terms of :func:`credo.algo.dvpo.dvpo_critic_terms` per token
    (quantile-Huber with risk weights, lower-tail CVaR, upper-tail gain, mean shift, tail shape, tail curvature,
    head consistency); a coefficient of 0 switches its term off. ``tail_curvature``: Eq. 9's second differences
    inside each tail (``in_tail``) or over the whole quantile axis as the authors' port (``whole_axis``).

    L_t = qr_coef L_QR + cvar_coef L_cvar + upper_coef L_up + mean_shift_coef L_ms + tail_shape_coef L_shape
          + curvature_coef L_curv + consistency_coef L_cons
    L_QR = mean_ij |tau_i - 1[y_j < q_i]| rho_kappa(y_j - q_i)   (each term's formula: docs/algorithms/dvpo.md).
    """
    weights = {"qr": qr_coef, "cvar": cvar_coef, "upper": upper_coef, "mean_shift": mean_shift_coef,
               "tail_shape": tail_shape_coef, "curvature": curvature_coef, "consistency": consistency_coef}
    terms = dvpo_critic_terms(quantiles, return_quantiles.detach(), weights=weights, risk_weighting=risk_weighting,
                              kappa=kappa, risk_gamma=risk_gamma, alpha=alpha, beta=beta,
                              tail_curvature=tail_curvature)  # name -> (B, T)
    loss = torch.stack(list(terms.values())).sum(0) if terms else torch.zeros_like(values)
    metrics = {f"dvpo_{k}": v.detach() for k, v in terms.items()} | {"vpred_mean": values.detach()}
    return TokenLoss(loss=loss, token_metrics=metrics)
