"""Critic (value-model) losses, registered by name (``critic.loss``), one signature::

    @register_critic_loss("name", needs=(...))
    def my_loss(*, values, old_values, returns, response_mask, quantiles=None, return_quantiles=None, kl=None,
                aux=None, ref_entropy=None, ref_logprobs=None, my_hparam: float = 1.0) -> TokenLoss

Each returns a per-token loss (B, T); :func:`compute_critic_loss` aggregates it with the policy's aggregation
and mini-batch normalisers (so micro-batch losses sum to the mini-batch loss).

- ``clipped_mse``: PPO's clipped value regression (verl ``compute_value_loss``; docs/algorithms/gae.md).
- ``dvpo``: DVPO's distributional critic (docs/algorithms/dvpo.md), the weighted sum of its terms
  (:mod:`credo.algo.dvpo`); needs a ``quantile`` head and the distributional GAE's quantile targets
  (``algo.advantage=dvpo``).
- ``vrpo``: VRPO [paper, secondary; derived reading, docs/algorithms/vrpo.md]: the clipped value regression on a
  ``vib`` head's bottleneck ``z`` plus ``vib_beta * KL(q(z|h) || N(0, I))``, guided by a frozen LM (the
  reference policy): per-token statistics ``x_t`` (the frozen LM's entropy, or its surprisal ``-log p(y_t)``, the
  log of a per-token perplexity), normalised per response to mean 1, either **re-weight** the value regression
  (``aux_mode=weight``: ``w_t = 1 - aux_coef + aux_coef * min(x_t / mean(x), weight_max)``) or are **targets** of
  the auxiliary head (``aux_mode=target``: ``+ aux_coef * (aux_t - x_t / mean(x))^2``); ``none`` = the VIB alone.
- ``dfpo``: DFPO's value-flow critic [derived, docs/algorithms/dfpo.md]: uncertainty-weighted bootstrapped and
  distributional conditional flow matching (Value Flows' BCFM / DCFM) on a ``flow`` head plus DVPO's tail terms on
  its multi-step quantiles (:mod:`credo.algo.dfpo`); its targets come from the flow target pass
  (:mod:`credo.train.flow_targets`, which reads this loss's pass hyperparameters too).
"""
from __future__ import annotations

from typing import Any

import torch

from credo.algo.aggregation import AggNorm, agg_loss, masked_mean
from credo.algo.registry import Registered, TokenLoss, _register, _same_fn, check_hparams
from credo.registry import Registry
from credo.types import LossOutput

CRITIC_TENSOR_ARGS = ("values", "old_values", "returns", "response_mask", "quantiles", "return_quantiles", "kl",
                      "aux", "ref_entropy", "ref_logprobs", "flow", "flow_targets", "flow_weights", "token_rewards")
# the built-ins are this module's; a method package outside credo.algo that registers one is named in builtins
CRITIC_LOSSES: Registry[Registered] = Registry("critic loss", same=_same_fn)
register_critic_loss = _register(CRITIC_LOSSES, CRITIC_TENSOR_ARGS)


def clipped_sq_error(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                     cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(1/2 max((V - Ret)^2, (clip(V, V_old - k, V_old + k) - Ret)^2), clipped-term-larger mask), both (B, T)."""
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    plain_sq = (values - returns).square()
    clipped_sq = (clipped - returns).square()
    return 0.5 * torch.maximum(plain_sq, clipped_sq), clipped_sq > plain_sq


@register_critic_loss("clipped_mse")
def clipped_mse(*, values, old_values, returns, response_mask, cliprange_value: float = 0.5) -> TokenLoss:
    """L_t = 1/2 max((V_t - Ret_t)^2, (clip(V_t, V_old - k, V_old + k) - Ret_t)^2), k = cliprange_value.

    PPO's clipped value regression, verl ``compute_value_loss`` (docs/algorithms/gae.md).
    """
    loss, clipped = clipped_sq_error(values, old_values, returns, cliprange_value)  # (B, T)
    return TokenLoss(loss=loss, token_metrics={"vf_clipfrac": clipped.float(), "vpred_mean": values.detach()})


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
    from credo.algo.dvpo import dvpo_critic_terms

    weights = {"qr": qr_coef, "cvar": cvar_coef, "upper": upper_coef, "mean_shift": mean_shift_coef,
               "tail_shape": tail_shape_coef, "curvature": curvature_coef, "consistency": consistency_coef}
    terms = dvpo_critic_terms(quantiles, return_quantiles.detach(), weights=weights, risk_weighting=risk_weighting,
                              kappa=kappa, risk_gamma=risk_gamma, alpha=alpha, beta=beta,
                              tail_curvature=tail_curvature)  # name -> (B, T)
    loss = torch.stack(list(terms.values())).sum(0) if terms else torch.zeros_like(values)
    metrics = {f"dvpo_{k}": v.detach() for k, v in terms.items()} | {"vpred_mean": values.detach()}
    return TokenLoss(loss=loss, token_metrics=metrics)


def _vrpo_needs(h: dict[str, Any]) -> tuple[str, ...]:
    if h["aux_mode"] not in ("weight", "target", "none") or h["aux_source"] not in ("entropy", "surprisal"):
        raise ValueError(f"vrpo: aux_mode must be weight|target|none and aux_source entropy|surprisal, got "
                         f"{h['aux_mode']!r}, {h['aux_source']!r}")
    if h["aux_mode"] == "none":
        return ("kl",)
    frozen = "ref_entropy" if h["aux_source"] == "entropy" else "ref_logprobs"
    return ("kl", "aux", frozen) if h["aux_mode"] == "target" else ("kl", frozen)


def frozen_lm_signal(stat: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) a frozen-LM statistic divided by its mean over each response's loss tokens (mean 1 per row)."""
    mask = response_mask.float()
    stat = stat.detach().float().clamp(min=0.0) * mask
    mean = stat.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return stat / mean.clamp(min=1e-6)


@register_critic_loss("vrpo", needs=_vrpo_needs)
def vrpo_loss(*, values, old_values, returns, response_mask, kl=None, aux=None, ref_entropy=None, ref_logprobs=None,
              cliprange_value: float = 0.5, vib_beta: float = 1e-3, aux_mode: str = "weight",
              aux_source: str = "entropy", aux_coef: float = 0.5, weight_max: float = 3.0) -> TokenLoss:
    """VRPO reading (module docstring): w_t * L_clip,t + vib_beta * KL_t [+ aux_coef * (aux_t - x_t)^2].

    weight: L_t = w_t L_clip,t + vib_beta KL_t,  w_t = 1 - aux_coef + aux_coef min(x_t, weight_max)
    target: L_t = L_clip,t + aux_coef (aux_t - x_t)^2 + vib_beta KL_t;   none: L_t = L_clip,t + vib_beta KL_t
    L_clip,t = 1/2 max((V_t - Ret_t)^2, (clip(V_t, V_old - k, V_old + k) - Ret_t)^2) (docs/algorithms/vrpo.md).
    """
    _vrpo_needs({"aux_mode": aux_mode, "aux_source": aux_source})  # validates both
    mse, clipped = clipped_sq_error(values, old_values, returns, cliprange_value)  # (B, T)
    metrics = {"vf_clipfrac": clipped.float(), "vpred_mean": values.detach(), "vib_kl": kl.detach()}
    loss = mse
    if aux_mode != "none":
        x = frozen_lm_signal(ref_entropy if aux_source == "entropy" else -ref_logprobs, response_mask)  # (B, T)
        if aux_mode == "weight":
            w = (1.0 - aux_coef) + aux_coef * x.clamp(max=weight_max)
            loss = w * mse
            metrics["vrpo_weight_dev"] = (w - 1.0).abs().detach()  # mean |w - 1|
        else:
            aux_sq = (aux - x).square()
            loss = mse + aux_coef * aux_sq
            metrics["vrpo_aux_loss"] = aux_sq.detach()
    return TokenLoss(loss=loss + vib_beta * kl, token_metrics=metrics)


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
    from credo.algo.dfpo import dfpo_critic_terms, next_loss_index

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


def list_critic_losses() -> list[str]:
    return CRITIC_LOSSES.names()


def critic_loss_requirements(name: str, hparams: dict[str, Any] | None = None) -> tuple[str, ...]:
    return CRITIC_LOSSES.get(name).requirements(hparams)


def check_critic_loss_hparams(name: str, hparams: dict[str, Any]) -> None:
    check_hparams(CRITIC_LOSSES, name, hparams)


def compute_critic_loss(name: str, *, response_mask: torch.Tensor, agg: str = "token-mean",
                        norm: AggNorm | None = None, inputs: dict[str, torch.Tensor | None],
                        **hparams: Any) -> LossOutput:
    """Per-token loss of the registered critic loss ``name`` (given the tensors in ``inputs`` it accepts),
    aggregated with ``agg``; metrics are masked means over this call's loss tokens."""
    entry = CRITIC_LOSSES.get(name)
    check_hparams(CRITIC_LOSSES, name, hparams)
    missing = [n for n in entry.requirements(hparams) if inputs.get(n) is None]
    if missing:
        raise ValueError(f"critic loss {name!r} needs {', '.join(missing)} (a quantile head for quantiles, "
                         "algo.advantage=dvpo / dfpo for return_quantiles, a vib head for kl / aux, a reference "
                         "model for ref_entropy / ref_logprobs, a flow head and its target pass for flow / "
                         "flow_targets / flow_weights / token_rewards)")
    mask = response_mask.float()
    args = {k: inputs.get(k) for k in entry.inputs if k != "response_mask"}
    out = entry.fn(response_mask=mask, **args, **hparams)
    loss = agg_loss(out.loss, mask, agg, norm=norm)
    metrics = {k: float(masked_mean(v.detach().float(), mask)) for k, v in out.token_metrics.items()}
    return LossOutput(loss=loss, metrics=metrics | out.metrics)
