"""The log-prob guards: ``finite_logprobs`` (before the update) and ``first_ratio`` (after it).

finite_logprobs: every loss token of a row the engine sampled (``response_mask`` 1, batch extra ``sampled``) has a
finite behaviour log-prob. credo never zero-fills a missing one (a log-prob of 0.0 reads as probability 1 and makes
the PPO / IS ratio of that token exp(logprob) instead of ~1): the vLLM transports, the agent loop and
:func:`credo.models.batch.collate` write NaN where the engine gave none, so the guard sees it here. Rows the engine did
not sample (replayed answers) are out of scope: their behaviour log-probs are the trainer's (the old-log-prob pass).
Unless the guard raised, the offending tokens then leave the loss (``response_mask`` 0, log-prob slot 0.0), so no
NaN reaches a loss in ``warn`` or ``off`` mode.

first_ratio: on an on-policy step (every row sampled by the policy being updated: ``policy_version == step``, so no
one-step-off prefetch and no stale row), the first mini-batch of the first PPO epoch is scored before any optimizer
step, by the same weights that sampled it. Its ratio against the *sampler's* log-probs,

    dev = mean_t |exp(logprobs_t - rollout_logprobs_t) - 1|      over the first mini-batch's loss tokens,

is then 1 up to numerics. The sampler's log-probs, not ``old_logprobs``, are the reference: with the old-log-prob
pass fused into the update (the default) the PPO ratio is exp(0) = 1 by construction and catches nothing, and with
the pass the ratio against the sampler covers both the trainer's own consistency (pass vs update forward) and the
trainer / engine mismatch (a temperature the trainer does not assume, weights the engine did not receive, another
dtype or kernel). credo.train.update reports ``actor/first_ratio_dev`` on every step that updates the policy; the
guard checks it against ``guards.ratio_tol`` on on-policy steps only.
"""
from __future__ import annotations

import torch

from credo.guards import Guards
from credo.models.batch import SAMPLED
from credo.types import TrainBatch, Trajectory

FIRST_RATIO_METRIC = "actor/first_ratio_dev"


def sampled_loss_tokens(batch: TrainBatch) -> torch.Tensor:
    """(B, T) bool: the loss tokens (``response_mask`` 1) of the rows the engine sampled (the extra ``sampled``;
    every row when absent)."""
    sampled = batch.extras.get(SAMPLED)
    sampled = sampled if sampled is not None else torch.ones(batch.batch_size, dtype=torch.bool)
    return batch.response_mask.bool() & sampled[:, None]


def missing_behaviour(batch: TrainBatch) -> torch.Tensor:
    """(B, T) bool: sampled loss tokens whose behaviour log-prob is NaN or +-inf."""
    return ~torch.isfinite(batch.rollout_logprobs) & sampled_loss_tokens(batch)


def check_behaviour_logprobs(guards: Guards, batch: TrainBatch) -> int:
    """The ``finite_logprobs`` guard on a collated batch, before any pass reads it; returns how many tokens lacked
    a finite behaviour log-prob. Raises :class:`credo.guards.GuardError` in ``error`` mode; otherwise those tokens
    leave the loss (``response_mask`` 0) and their log-prob slot becomes 0.0."""
    bad = missing_behaviour(batch)  # (B, T)
    n = int(bad.sum())
    if guards.enabled("finite_logprobs"):
        nan = int((bad & batch.rollout_logprobs.isnan()).sum())
        guards.check("finite_logprobs", n == 0,
                     f"{n} of {int(sampled_loss_tokens(batch).sum())} sampled response tokens "
                     f"({int(bad.any(-1).sum())} rows) have no finite behaviour log-prob ({nan} missing/NaN, "
                     f"{n - nan} inf): the rollout engine returned none for them")
    if n:
        batch.response_mask = batch.response_mask.masked_fill(bad, 0.0)
        batch.rollout_logprobs = batch.rollout_logprobs.masked_fill(bad, 0.0)
    return n


def ratio_deviation(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """mean over ``mask`` of |exp(logprobs - rollout_logprobs) - 1| (the log-ratio clamped to [-20, 20]); 0.0 for
    an empty mask. logprobs, rollout_logprobs, mask: (B, T)."""
    n = mask.sum()
    if float(n) == 0:
        return 0.0
    log_ratio = (logprobs.detach() - rollout_logprobs).clamp(-20.0, 20.0)  # (B, T)
    dev = torch.where(mask.bool(), (log_ratio.exp() - 1.0).abs(), 0.0)  # (B, T); no NaN from outside the mask
    return float(dev.sum() / n)


def on_policy(trajs: list[Trajectory], step: int) -> bool:
    """Whether step ``step``'s rows were all sampled by the policy being updated (policy lag 0; a partial rollout's
    tokens each by that policy, where the row records per-token versions)."""
    return bool(trajs) and all(t.policy_version == step and all(v == step for v in t.token_versions) for t in trajs)


def check_first_ratio(guards: Guards, metrics: dict[str, float], trajs: list[Trajectory], *, step: int) -> None:
    """The ``first_ratio`` guard after a policy update: ``metrics[FIRST_RATIO_METRIC]`` (absent when no live row
    was updated) must be <= ``guards.ratio_tol`` when the step was on-policy (:func:`on_policy`)."""
    dev = metrics.get(FIRST_RATIO_METRIC)
    if dev is None or not on_policy(trajs, step) or not guards.enabled("first_ratio"):
        return
    tol = guards.cfg.ratio_tol
    guards.check("first_ratio", dev <= tol,  # a NaN deviation fails too
                 f"on an on-policy step the first mini-batch's mean |ratio - 1| against the sampler's log-probs is "
                 f"{dev:.3g} > guards.ratio_tol={tol:g}: trainer and engine disagree (sampling temperature, weights "
                 f"not synced, dtype or kernel; vLLM in bf16 deviates legitimately, raise ratio_tol for it)")
