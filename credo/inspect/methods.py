"""Replaying registered losses and estimators on a :class:`~credo.inspect.replay.ReplayBatch`.

Per token and loss (autograd on the registered function, float64)::

    grad_it     = d (sum_t m_it L_it) / d logprob_it     the per-token loss before aggregation (aux terms excluded)
    weight_it   = -grad_it / A_it  (A != 0)               the gradient weight w (dL/dlogprob = -A w;
                                                          docs/algorithms/README.md#notation-and-sign-convention)
    agg_grad_it = d agg(L) / d logprob_it                 the aggregated loss the run optimised (algo.agg, or
                                                          the loss's forced aggregation), + its aux term

Disagreement between two losses a, b over the loss tokens: ``sign`` = both non-zero with opposite signs,
``zero`` = exactly one of them is zero (|g| <= ZERO_TOL). Between two estimators: ``sign`` = sign(A_a) !=
sign(A_b) with both non-zero, ``zero`` = exactly one zero (|A| <= ADV_ZERO_TOL, the dump's rounding), and the
mean |A_a - A_b|.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from credo import algo
from credo.algo.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from credo.inspect.regions import RegionInputs, region_labels
from credo.inspect.replay import DTYPE, ReplayBatch

ZERO_TOL = 1e-12  # |gradient| at or below this counts as zero (float64 replay: clipped branches are exact zeros)
ADV_ZERO_TOL = 1e-5  # |advantage| at or below this counts as zero (the dump rounds advantages to 5 decimals)
REPLAY_SEED = 0  # torch RNG seed for losses that sample tokens (clip_cov)


@dataclass
class LossReplay:
    name: str
    hparams: dict[str, Any]  # as replayed (the run's when it is the run's loss, else the defaults)
    grad: torch.Tensor  # (B, T) d sum(m L) / d logprob
    weight: torch.Tensor  # (B, T) -grad / A, NaN where A == 0 or outside the mask
    agg_grad: torch.Tensor  # (B, T) d agg(L) / d logprob
    regions: list[list[str]]  # (B, T) labels (credo.inspect.regions)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class EstimatorReplay:
    name: str
    hparams: dict[str, Any]
    advantages: torch.Tensor  # (B, T)


@dataclass(frozen=True)
class Skipped:
    kind: str  # "loss" or "estimator"
    name: str
    reason: str


@dataclass(frozen=True)
class Disagreement:
    kind: str  # "loss" or "estimator"
    a: str
    b: str
    tokens: int  # loss tokens compared
    sign: float  # fraction with opposite non-zero signs
    zero: float  # fraction where exactly one is zero
    mean_abs_diff: float  # mean |x_a - x_b| (advantages for estimators, grad for losses)


def _loss_inputs(name: str, batch: ReplayBatch, hparams: dict[str, Any]
                 ) -> tuple[dict[str, torch.Tensor | None], str | None]:
    """The tensors the loss gets, or a reason it cannot be replayed."""
    entry = POLICY_LOSSES[name]
    need = entry.requirements(hparams)
    if "entropy" in need and batch.entropy is None:
        return {}, "needs entropy (not dumped and no checkpoint to recompute it)"
    old = batch.rollout_logprobs if entry.uses_rollout_logprobs else batch.old_logprobs
    return {"old_logprobs": old, "entropy": batch.entropy}, None


def _grad(fn, logprobs: torch.Tensor) -> tuple[torch.Tensor, Any]:
    lp = logprobs.detach().clone().requires_grad_(True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(REPLAY_SEED)
        total, out = fn(lp)
    if not total.requires_grad:  # a loss constant in the log-probs (e.g. every token masked)
        return torch.zeros_like(lp), out
    (g,) = torch.autograd.grad(total, lp, allow_unused=True)
    return (torch.zeros_like(lp) if g is None else g.detach()), out


def replay_loss(name: str, hparams: dict[str, Any], batch: ReplayBatch, advantages: torch.Tensor, *,
                agg: str, loss_scale_factor: float | None) -> LossReplay:
    """Per-token gradients and regions of the registered loss ``name`` on the batch (see the module docstring).

    ref_logprobs are not dumped: they are replayed as sg(logprobs), which makes a KL term's value and gradient 0."""
    entry = POLICY_LOSSES[name]
    inputs, reason = _loss_inputs(name, batch, hparams)
    if reason:
        raise ValueError(reason)
    hp = {**entry.hparams, **hparams}
    mask = batch.mask.to(DTYPE)  # (B, T)
    adv = advantages.to(DTYPE) * mask  # (B, T)

    def per_token(lp):
        out = entry.fn(logprobs=lp, advantages=adv, response_mask=mask, ref_logprobs=lp.detach(), **inputs,
                       **hparams)
        return (out.loss * mask).sum(), out

    def aggregated(lp):
        out = algo.compute_policy_loss(name, logprobs=lp, advantages=adv, response_mask=mask,
                                       ref_logprobs=lp.detach(), agg=agg, loss_scale_factor=loss_scale_factor,
                                       **inputs, **hparams)
        return out.loss, out

    grad, token_loss = _grad(per_token, batch.logprobs)
    agg_grad, agg_out = _grad(aggregated, batch.logprobs)
    grad, agg_grad = grad * mask, agg_grad * mask
    nonzero_adv = batch.mask & (adv.abs() > ZERO_TOL)
    weight = torch.where(nonzero_adv, -grad / torch.where(nonzero_adv, adv, torch.ones_like(adv)),
                         torch.full_like(adv, float("nan")))
    metrics = {k: v.detach() for k, v in token_loss.token_metrics.items()}
    ratio = metrics.get("ratio", batch.ratio)
    regions = region_labels(name, RegionInputs(advantages=adv, ratio=ratio.to(DTYPE), mask=batch.mask,
                                               token_metrics=metrics, hparams=hp))
    return LossReplay(name, hp, grad, weight, agg_grad, regions, dict(agg_out.metrics))


def estimator_inputs(batch: ReplayBatch) -> dict[str, Any]:
    """Every estimator input a dump can supply (the rest are missing: the estimator is skipped)."""
    given = {"rewards": batch.rewards, "group_ids": batch.group_ids, "response_mask": batch.mask.to(DTYPE),
             "old_logprobs": batch.old_logprobs}
    return given if batch.values is None else {**given, "values": batch.values}


def replay_estimator(name: str, hparams: dict[str, Any], batch: ReplayBatch) -> EstimatorReplay:
    """Advantages of the registered estimator ``name``; ValueError naming what it needs that the dump lacks."""
    entry = ADVANTAGE_ESTIMATORS[name]
    given = estimator_inputs(batch)
    missing = [n for n in entry.requirements(hparams) if n not in given]
    if missing:
        raise ValueError(f"needs {', '.join(missing)} (not in a rollout dump)")
    out = algo.compute_advantages(name, **given, **hparams)
    return EstimatorReplay(name, {**entry.hparams, **hparams}, out.advantages.to(DTYPE) * batch.mask)


def _differ(xa: torch.Tensor, xb: torch.Tensor, tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) bool: (opposite non-zero signs, exactly one of the two zero)."""
    za, zb = xa.abs() <= tol, xb.abs() <= tol
    return ~za & ~zb & (torch.sign(xa) != torch.sign(xb)), za ^ zb


def _pair(kind: str, a: str, b: str, xa: torch.Tensor, xb: torch.Tensor, mask: torch.Tensor,
          tol: float) -> Disagreement:
    sign, zero = _differ(xa, xb, tol)
    n = max(int(mask.sum()), 1)
    diff = float(((xa - xb).abs() * mask).sum()) / n
    return Disagreement(kind, a, b, int(mask.sum()), float((sign & mask).sum()) / n, float((zero & mask).sum()) / n,
                        diff)


def disagreements(losses: list[LossReplay], estimators: list[EstimatorReplay],
                  mask: torch.Tensor) -> tuple[list[Disagreement], torch.Tensor, torch.Tensor]:
    """Pairwise rates, plus (B, T) bool flags of the tokens where some pair of losses (resp. estimators)
    disagrees in sign or zero / non-zero."""
    rows, loss_flag, est_flag = [], torch.zeros_like(mask), torch.zeros_like(mask)
    for kind, items, flag, tol in (("loss", [(x.name, x.grad) for x in losses], loss_flag, ZERO_TOL),
                                   ("estimator", [(x.name, x.advantages) for x in estimators], est_flag, ADV_ZERO_TOL)):
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                (a, xa), (b, xb) = items[i], items[j]
                rows.append(_pair(kind, a, b, xa, xb, mask, tol))
                sign, zero = _differ(xa, xb, tol)
                flag |= mask & (sign | zero)
    return rows, loss_flag, est_flag
