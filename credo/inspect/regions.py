"""Clip regions: which branch of a policy loss's weight table each token is in.

The generic reading uses what every clipping loss already returns: its per-token indicator metrics
(``clipfrac_high``, ``clipfrac_low``, ``pg_clipfrac_lower`` = the dual clip, ``pg_clipfrac``); an indicator the loss
does not return is read from its ``ratio`` metric (GSPO's: the sequence ratio) against the loss's own
``clip_low`` / ``clip_high`` / ``clip_c`` hyperparameters (``bypass_mode``, ``gspo``, ``aepo``). Precedence per
valid token::

    A == 0                                   -> zero-adv
    pg_clipfrac_lower and A < 0              -> dual-clip
    clipfrac_high                            -> clip-high
    clipfrac_low                             -> clip-low
    pg_clipfrac                              -> clipped
    otherwise                                -> in-range       (tokens outside the loss mask: masked)

A loss whose indicators mean something else registers its own reading with :func:`register_regions`
(below: GMPO's log-space clip, DPPO's trust-region mask, Clip-Cov / KL-Cov's selected tokens, CISPO's capped IS
weight, ASPO's and AEPO's extra branches). The gradient weight itself (zero or not) is reported next to the
region, not folded into it: PPO and GPPO share regions and differ in the weight of ``clip-high``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from credo.registry import Registry

MASKED, ZERO_ADV, IN_RANGE = "masked", "zero-adv", "in-range"


@dataclass(frozen=True)
class RegionInputs:
    """What a region reading may use; every tensor (B, T), detached."""

    advantages: torch.Tensor
    ratio: torch.Tensor  # exp(logprobs - old_logprobs) (the loss's own "ratio" metric when it returns one)
    mask: torch.Tensor  # bool, the loss mask
    token_metrics: dict[str, torch.Tensor]  # the loss's per-token metrics
    hparams: dict[str, Any]  # the loss's hyperparameters, defaults filled in


RegionFn = Callable[[RegionInputs], list[tuple[str, torch.Tensor]]]
# policy loss name -> its region reading; a loss without one is read by generic_regions
REGION_FNS: Registry[RegionFn] = Registry("loss region reading")


def register_regions(*names: str) -> Callable[[RegionFn], RegionFn]:
    """Register ``fn(inputs) -> [(label, bool (B, T)), ...]`` (first match wins) for the losses ``names``."""
    def deco(fn: RegionFn) -> RegionFn:
        for name in names:
            REGION_FNS.add(name, fn)
        return fn

    return deco


def _flag(inputs: RegionInputs, key: str) -> torch.Tensor | None:
    v = inputs.token_metrics.get(key)
    return None if v is None else v.detach() > 0.5


def generic_regions(inputs: RegionInputs) -> list[tuple[str, torch.Tensor]]:
    """The reading in the module docstring: the loss's indicator metrics, else its clip hyperparameters."""
    a, r, hp = inputs.advantages, inputs.ratio, inputs.hparams
    neg, pos = a < 0, a > 0
    dual, high, low, clipped = (_flag(inputs, k) for k in ("pg_clipfrac_lower", "clipfrac_high", "clipfrac_low",
                                                           "pg_clipfrac"))
    if "clip_high" in hp:  # an indicator the loss does not return: PPO's table from the ratio and its own bounds
        high = pos & (r > 1.0 + float(hp["clip_high"])) if high is None else high
        low = neg & (r < 1.0 - float(hp.get("clip_low", hp["clip_high"]))) if low is None else low
        if dual is None and "clip_c" in hp:
            dual = neg & (r > float(hp["clip_c"]))
    out = []
    if dual is not None:
        out.append(("dual-clip", dual & neg))
    out += [(label, flag) for label, flag in (("clip-high", high), ("clip-low", low), ("clipped", clipped))
            if flag is not None]
    return out


@register_regions("gmpo")
def _gmpo(inputs: RegionInputs) -> list[tuple[str, torch.Tensor]]:
    """GMPO clips the log-ratio to [-clip_low, clip_high] per token (binding or not, verl's metric)."""
    return [("log-clip", _flag(inputs, "pg_clipfrac")), ("log-clip", _flag(inputs, "pg_clipfrac_lower"))]


@register_regions("dppo_tv", "dppo_kl")
def _dppo(inputs: RegionInputs) -> list[tuple[str, torch.Tensor]]:
    """DPPO: outside the divergence trust region (no gradient), or inside with a truncated IS weight."""
    return [("outside-trust", _flag(inputs, "pg_clipfrac")), ("truncated-is", _flag(inputs, "pg_clipfrac_lower"))]


@register_regions("clip_cov")
def _clip_cov(inputs: RegionInputs) -> list[tuple[str, torch.Tensor]]:
    """Clip-Cov: the randomly detached high-covariance tokens, then PPO's clip from the ratio."""
    a, r, hp = inputs.advantages, inputs.ratio, inputs.hparams
    ppo_clipped = (a > 0) & (r > 1.0 + hp["clip_high"]) | (a < 0) & (r < 1.0 - hp["clip_low"])
    return [("cov-detached", _flag(inputs, "pg_clipfrac")), ("clipped", ppo_clipped)]


@register_regions("kl_cov")
def _kl_cov(inputs: RegionInputs) -> list[tuple[str, torch.Tensor]]:
    """KL-Cov: the top-covariance tokens that carry the |delta| penalty."""
    return [("kl-penalised", _flag(inputs, "kl_cov_frac"))]


@register_regions("cispo")
def _cispo(inputs: RegionInputs) -> list[tuple[str, torch.Tensor]]:
    """CISPO: the IS weight is capped (r > 1 + clip_high) or floored (r < 1 - clip_low); the gradient stays."""
    clipped = _flag(inputs, "pg_clipfrac")
    return [("is-capped", clipped & (inputs.ratio > 1.0)), ("is-floored", clipped & (inputs.ratio <= 1.0))]


@register_regions("aspo")
def _aspo(inputs: RegionInputs) -> list[tuple[str, torch.Tensor]]:
    """ASPO: its two soft dual clips (A > 0 below 1/clip_c, A < 0 above clip_c), then the generic reading."""
    return [("pos-dual", _flag(inputs, "aspo_pos_dual_frac")), ("dual-clip", _flag(inputs, "aspo_neg_dual_frac")),
            *generic_regions(inputs)]


@register_regions("aepo")
def _aepo(inputs: RegionInputs) -> list[tuple[str, torch.Tensor]]:
    """AEPO: high-entropy clip-high tokens whose gradient is preserved, then the generic reading."""
    return [("preserved", _flag(inputs, "preserved_frac")), *generic_regions(inputs)]


def region_labels(loss_name: str, inputs: RegionInputs) -> list[list[str]]:
    """(B, T) labels: ``masked`` outside the loss mask, ``zero-adv`` where A == 0, else the first matching
    region of the loss's reading (:data:`REGION_FNS`, else :func:`generic_regions`), else ``in-range``."""
    fn = REGION_FNS.get(loss_name) if loss_name in REGION_FNS else generic_regions
    b, t = inputs.advantages.shape
    labels = torch.zeros(b, t, dtype=torch.long)  # index into names; 0 = in-range
    names = [IN_RANGE]
    taken = torch.zeros(b, t, dtype=torch.bool)
    for label, flag in [(MASKED, ~inputs.mask), (ZERO_ADV, inputs.advantages == 0), *fn(inputs)]:
        if flag is None:
            continue
        hit = flag.to(torch.bool) & ~taken  # (B, T)
        if hit.any():
            if label not in names:
                names.append(label)
            labels[hit] = names.index(label)
        taken |= hit
    return [[names[j] for j in row] for row in labels.tolist()]
