"""credo's algorithm layer: advantage estimators, per-token policy losses, aggregation, KL, entropy.

Public API::

    out = compute_policy_loss(name, *, logprobs, old_logprobs, advantages, response_mask,
                              entropy=None, ref_logprobs=None, agg="token-mean", norm=None, **hparams)
    out.loss, out.metrics
    adv = compute_advantages(name, *, rewards, group_ids, response_mask, values=None, **hparams)
    adv.advantages, adv.returns

Everything is looked up in a registry; adding a method is one registered function
(see :mod:`credo.algo.registry`).
"""
from __future__ import annotations

from typing import Any

import torch

from credo.algo import advantages as _advantages  # noqa: F401  (registers estimators)
from credo.algo import losses as _losses  # noqa: F401  (registers losses)
from credo.algo.advantages.common import compute_dtype
from credo.algo.aggregation import AGG_MODES, AggNorm, agg_loss, canonical_agg, masked_mean, micro_share
from credo.algo.kl import KL_ESTIMATORS, canonical_kl, kl_penalty
from credo.algo.logprobs import entropy_direction_from_logits, entropy_from_logits, logprobs_from_logits
from credo.algo.registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    TokenLoss,
    check_hparams,
    register_advantage,
    register_policy_loss,
)
from credo.algo.value import value_loss
from credo.types import AdvantageOutput, LossOutput

__all__ = [
    "AGG_MODES", "KL_ESTIMATORS", "AggNorm", "TokenLoss", "agg_loss", "canonical_agg", "canonical_kl",
    "check_advantage_hparams", "check_policy_loss_hparams", "compute_advantages", "compute_policy_loss",
    "advantage_requirements", "entropy_direction_from_logits", "entropy_from_logits", "kl_penalty",
    "policy_loss_inert", "policy_loss_requirements", "policy_loss_uses_rollout_logprobs", "advantage_accepts",
    "list_advantage_estimators", "list_policy_losses",
    "logprobs_from_logits", "masked_mean", "value_loss", "register_advantage", "register_policy_loss",
]


def list_policy_losses() -> list[str]:
    return POLICY_LOSSES.names()


def list_advantage_estimators() -> list[str]:
    return ADVANTAGE_ESTIMATORS.names()


def policy_loss_requirements(name: str, hparams: dict[str, Any] | None = None) -> tuple[str, ...]:
    """Optional inputs (``entropy``, ``ref_logprobs``) the loss needs with these hyperparameters."""
    return POLICY_LOSSES.get(name).requirements(hparams)


def policy_loss_inert(name: str, hparams: dict[str, Any] | None = None) -> bool:
    """Whether rows with all-zero advantages have zero loss and gradient under this loss and leave the other
    rows' losses unchanged (declared at registration; checked for every loss by the tests)."""
    return POLICY_LOSSES.get(name).inert_at_zero_advantage(hparams)


def policy_loss_uses_rollout_logprobs(name: str) -> bool:
    """Whether the loss's old log-probs are the sampler's and it weights tokens itself (verl's bypass mode)."""
    return POLICY_LOSSES.get(name).uses_rollout_logprobs


def advantage_accepts(name: str) -> tuple[str, ...]:
    """Every tensor input the estimator's signature names (required or optional, e.g. ``rollout_is_weights``)."""
    return ADVANTAGE_ESTIMATORS.get(name).inputs


def advantage_requirements(name: str, hparams: dict[str, Any] | None = None) -> tuple[str, ...]:
    """Optional inputs (``values``, ``reward_baselines``, ...) the estimator needs."""
    return ADVANTAGE_ESTIMATORS.get(name).requirements(hparams)


def check_policy_loss_hparams(name: str, hparams: dict[str, Any]) -> None:
    check_hparams(POLICY_LOSSES, name, hparams)


def check_advantage_hparams(name: str, hparams: dict[str, Any]) -> None:
    check_hparams(ADVANTAGE_ESTIMATORS, name, hparams)


def compute_policy_loss(
    name: str,
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T) bool or 0/1 int/float
    entropy: torch.Tensor | None = None,  # (B, T)
    ref_logprobs: torch.Tensor | None = None,  # (B, T)
    agg: str = "token-mean",
    norm: AggNorm | None = None,
    loss_scale_factor: float | None = None,
    token_weights: torch.Tensor | None = None,  # (B, T) detached, e.g. rollout-correction IS weights
    **hparams: Any,
) -> LossOutput:
    """Per-token loss of the registered method ``name``, aggregated with ``agg``.

    ``token_weights`` multiply the per-token loss, unless the loss takes them itself (a sequence-level loss
    reduces them per sequence as its objective requires: GMPO's geometric mean).

    ``norm`` carries the mini-batch normalisers so micro-batch losses sum to the mini-batch loss.
    A method with a prescribed aggregation (e.g. GSPO) overrides ``agg``. Metrics are masked means
    over this call's loss tokens.
    """
    entry = POLICY_LOSSES.get(name)
    check_hparams(POLICY_LOSSES, name, hparams)
    given = {"entropy": entropy, "ref_logprobs": ref_logprobs}
    missing = [n for n in entry.requirements(hparams) if given.get(n) is None]
    if missing:
        raise ValueError(f"policy loss {name!r} needs {', '.join(missing)}")
    mask = response_mask.to(logprobs.dtype)  # (B, T); int, bool and float masks behave the same
    weights = None if token_weights is None else token_weights.detach().to(logprobs.dtype)  # (B, T)
    own_weights = "token_weights" in entry.inputs  # the loss reduces the weights itself (e.g. per sequence)
    extra = {"token_weights": weights} if own_weights else {}
    out = entry.fn(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, response_mask=mask,
        entropy=entropy, ref_logprobs=ref_logprobs, **extra, **hparams,
    )
    mode = entry.forced_agg or agg
    loss_mat = out.loss if weights is None or own_weights else out.loss * weights  # (B, T)
    loss = agg_loss(loss_mat, mask, mode, norm=norm, loss_scale_factor=loss_scale_factor)
    metrics = {k: float(masked_mean(v.detach().to(mask.dtype), mask)) for k, v in out.token_metrics.items()}
    metrics.update(out.metrics)
    if out.aux_loss is not None:
        loss = loss + micro_share(mask, mode, norm) * out.aux_loss
    return LossOutput(loss=loss, metrics=metrics)


def compute_advantages(
    name: str,
    *,
    rewards: torch.Tensor,  # (B,) scores or (B, T) token rewards
    group_ids: torch.Tensor,  # (B,)
    response_mask: torch.Tensor,  # (B, T)
    values: torch.Tensor | None = None,  # (B, T) critic values (gae, evpo)
    reward_baselines: torch.Tensor | None = None,  # (B,) greedy-response rewards (remax)
    entropy_direction: torch.Tensor | None = None,  # (B, T) S_k - C of the behaviour policy (papo)
    entropy_history: list[float] | None = None,  # batch-mean entropies so far (papo)
    value_quantiles: torch.Tensor | None = None,  # (B, T, M) quantile critic's head-mean quantiles (dvpo)
    tree_paths: list | None = None,  # (B,) credo.methods.attnrl.algo.TreePath of every row (attnrl)
    old_logprobs: torch.Tensor | None = None,  # (B, T) behaviour policy's log-probs (optimal_token_baseline)
    sum_pi_squared: torch.Tensor | None = None,  # (B, T) sum_v pi(v)^2 of the behaviour policy (optimal_token_baseline)
    rollout_is_weights: torch.Tensor | None = None,  # (B, T) rollout-correction weights, when on (optional input)
    reward_components: dict | None = None,  # name -> (B,) score of each reward component (gdpo)
    **hparams: Any,
) -> AdvantageOutput:
    """Advantages (and returns where defined) of the registered estimator ``name``.

    Each estimator receives only the inputs its signature names; one that needs an input that is
    missing raises ValueError naming it. Computation keeps the inputs' floating dtype (float64 rewards
    give float64 advantages); integer or bool rewards compute in the default dtype.
    """
    entry = ADVANTAGE_ESTIMATORS.get(name)
    check_hparams(ADVANTAGE_ESTIMATORS, name, hparams)
    mask = response_mask.to(compute_dtype(rewards, values, value_quantiles))  # (B, T)
    given = {"rewards": rewards, "group_ids": group_ids, "response_mask": mask, "values": values,
             "reward_baselines": reward_baselines, "entropy_direction": entropy_direction,
             "entropy_history": entropy_history, "value_quantiles": value_quantiles, "tree_paths": tree_paths,
             "old_logprobs": old_logprobs, "sum_pi_squared": sum_pi_squared,
             "rollout_is_weights": rollout_is_weights, "reward_components": reward_components}
    missing = [n for n in entry.requirements(hparams) if given.get(n) is None]
    if missing:
        raise ValueError(f"advantage estimator {name!r} needs {', '.join(missing)}")
    return entry.fn(**{k: given[k] for k in entry.inputs}, **hparams)
