"""Critic (value-model) losses, registered by name (``critic.loss``), one signature::

    @register_critic_loss("name", needs=(...))
    def my_loss(*, values, old_values, returns, response_mask, quantiles=None, return_quantiles=None, kl=None,
                aux=None, ref_entropy=None, ref_logprobs=None, my_hparam: float = 1.0) -> TokenLoss

Each returns a per-token loss (B, T); :func:`compute_critic_loss` aggregates it with the policy's aggregation
and mini-batch normalisers (so micro-batch losses sum to the mini-batch loss).

- ``clipped_mse``: PPO's clipped value regression (verl ``compute_value_loss``; docs/algorithms/gae.md).
- ``vrpo``: VRPO [paper, secondary; derived reading, docs/algorithms/vrpo.md]: the clipped value regression on a
  ``vib`` head's bottleneck ``z`` plus ``vib_beta * KL(q(z|h) || N(0, I))``, guided by a frozen LM (the
  reference policy): per-token statistics ``x_t`` (the frozen LM's entropy, or its surprisal ``-log p(y_t)``, the
  log of a per-token perplexity), normalised per response to mean 1, either **re-weight** the value regression
  (``aux_mode=weight``: ``w_t = 1 - aux_coef + aux_coef * min(x_t / mean(x), weight_max)``) or are **targets** of
  the auxiliary head (``aux_mode=target``: ``+ aux_coef * (aux_t - x_t / mean(x))^2``); ``none`` = the VIB alone.

The method packages register their own critic losses, named among the table's built-ins: ``dvpo``
(:mod:`credo.methods.dvpo.critic`) and ``dfpo`` (:mod:`credo.methods.dfpo.critic`).
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
# built-ins: this module's, and the method packages' named here (imported on the first lookup or listing)
CRITIC_LOSSES: Registry[Registered] = Registry("critic loss", builtins=(
    "credo.methods.dvpo.critic", "credo.methods.dfpo.critic"), same=_same_fn)
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
