"""DFPO's critic loss (``critic.loss: dfpo``; docs/algorithms/dfpo.md, [derived]): uncertainty-weighted bootstrapped
and distributional conditional flow matching (Value Flows' BCFM / DCFM) on a ``flow`` head
(:mod:`credo.methods.dfpo.flow_head`) plus DVPO's tail terms on its multi-step quantiles (:mod:`credo.algo.dfpo`);
its targets come from the flow target pass (:mod:`credo.train.flow_targets`, which reads this loss's pass
hyperparameters too). Registered into :data:`credo.algo.critic.CRITIC_LOSSES`."""
from __future__ import annotations

from typing import Any

import torch

from credo.algo.critic import register_critic_loss
from credo.algo.dfpo import dfpo_critic_terms, next_loss_index
from credo.algo.registry import TokenLoss


def _dfpo_needs(h: dict[str, Any]) -> tuple[str, ...]:
    base = ("flow", "flow_targets", "flow_weights", "token_rewards")
    tails = ("cvar_coef", "upper_coef", "tail_shape_coef", "mean_shift_coef")
    return base + ("return_quantiles",) if any(h[k] for k in tails) else base


@register_critic_loss("dfpo", needs=_dfpo_needs)
def dfpo_loss(*, values, response_mask, flow=None, flow_targets=None, flow_weights=None, token_rewards=None,
              return_quantiles=None, bcfm_coef: float = 1.0, dcfm_coef: float = 1.0, geo: str = "none",
              geo_coef: float = 0.0, cvar_coef: float = 1.0, upper_coef: float = 1.0, tail_shape_coef: float = 1.0,
              mean_shift_coef: float = 0.0, curvature_coef: float = 0.0, consistency_coef: float = 0.0,
              alpha: float = 0.1, beta: float = 0.1, samples: int = 4, flow_steps: int = 10, gamma: float = 1.0,
              dcfm_gamma_scale: bool = False, uw: str = "up", uw_temp: float = 0.3, uw_std: str = "jacobian",
              jacobian: str = "jvp", ret_agg: str = "mean", q_agg: str = "mean", target: str = "old") -> TokenLoss:
    """DFPO (module docstring; :func:`credo.algo.dfpo.dfpo_critic_terms`): w_t (bcfm_coef BCFM + dcfm_coef m_t DCFM)
    + geo_coef L^geo + DVPO's tail terms on the flow quantiles.

    L_t = w_t (bcfm_coef L^B_t + dcfm_coef m_t L^D_t) + geo_coef L^geo_t + cvar_coef L^cvar_t + upper_coef L^up_t
          + tail_shape_coef L^tail_t [+ mean shift, curvature, consistency]   (docs/algorithms/dfpo.md).

    ``samples`` .. ``target`` are read by the flow target pass (:class:`credo.train.flow_targets.FlowPassOptions`);
    ``target: old`` (the critic at the start of the step) is the one implemented.
    """
    if target != "old":
        raise NotImplementedError(f"dfpo target={target!r}: only target=old is implemented (an EMA target needs a "
                                  "second critic copy kept and checkpointed across steps)")
    dev = values.device  # the critic's; the batch's targets may be on the CPU
    flow_targets, flow_weights, token_rewards = (x.to(dev) for x in (flow_targets, flow_weights, token_rewards))
    return_quantiles = None if return_quantiles is None else return_quantiles.to(dev)
    _, nonterminal = next_loss_index(response_mask.to(dev))
    coefs = {"bcfm": bcfm_coef, "dcfm": dcfm_coef, "geo": geo_coef, "cvar": cvar_coef, "upper": upper_coef,
             "tail_shape": tail_shape_coef, "mean_shift": mean_shift_coef, "curvature": curvature_coef,
             "consistency": consistency_coef}
    terms = dfpo_critic_terms(flow.velocity, flow.quantiles, flow_targets, flow_weights, token_rewards,
                              nonterminal, return_quantiles, coefs=coefs, geo=geo, alpha=alpha, beta=beta)
    loss = torch.stack(list(terms.values())).sum(0) if terms else torch.zeros_like(values)
    metrics = {f"dfpo_{k}": v.detach() for k, v in terms.items()}
    metrics |= {"vpred_mean": values.detach(), "dfpo_weight": flow_weights.detach()}
    return TokenLoss(loss=loss, token_metrics=metrics)
