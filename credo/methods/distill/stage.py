"""The RL step's distillation stage (``distill`` set): the teacher pass and the reverse KL into the rewards, the
advantages or the loss (credo.algo.distill has the formulas).

    rewards = apply_distill(cfg, teacher, batch, metrics, timer, rewards)   # before the estimator
    apply_distill_advantages(cfg, batch, metrics)                            # after it

The student's log-probs are the old-log-prob pass's (``batch.old_logprobs``: the pass is never fused away while
distilling, credo.recipes.stages.fuse_old_logprobs); the loss mode's term is computed in the update
(credo.train.update.actor_loss) from ``batch.teacher_logprobs``.
"""
from __future__ import annotations

import torch

from credo.algo import masked_mean
from credo.algo.distill import distill_advantages, distill_token_rewards, reverse_kl_tokens
from credo.config import RunConfig
from credo.methods.distill.teacher import teacher_logprobs
from credo.train.stats import Timer
from credo.types import TrainBatch


def needs_student_logprobs(cfg: RunConfig) -> bool:
    """Whether the step needs the student's no-grad log-probs before the update (any distill mode: the reverse-KL
    metrics, and the reward and advantage modes' terms)."""
    return cfg.distill is not None


def apply_distill(cfg: RunConfig, teacher, batch: TrainBatch, metrics: dict, timer: Timer,
                  rewards: torch.Tensor) -> torch.Tensor:
    """The teacher's log-probs into ``batch.teacher_logprobs`` and the metrics; returns ``rewards`` ((B,) or
    (B, T)), in reward mode turned into the dense ``w * r_t + c * (q_t - s_t)``."""
    d = cfg.distill
    if teacher is None or d is None:
        return rewards
    if batch.old_logprobs is None:
        raise RuntimeError("distillation needs the student's old log-probs; the old-log-prob pass did not run")
    with timer("teacher"):
        batch.teacher_logprobs = teacher_logprobs(cfg, teacher, batch)  # (B, T)
    mask = batch.response_mask
    kl = reverse_kl_tokens(batch.old_logprobs, batch.teacher_logprobs, mask)  # (B, T)
    metrics["distill/reverse_kl"] = float(masked_mean(kl, mask))
    metrics["distill/teacher_logprob"] = float(masked_mean(batch.teacher_logprobs, mask))
    metrics["distill/student_logprob"] = float(masked_mean(batch.old_logprobs, mask))
    if d.mode != "reward":
        return rewards
    return distill_token_rewards(rewards, batch.old_logprobs, batch.teacher_logprobs, mask, coef=d.coef,
                                 reward_weight=d.reward_weight)


def apply_distill_advantages(cfg: RunConfig, batch: TrainBatch, metrics: dict) -> None:
    """Advantage and loss modes: ``batch.advantages`` weighted by ``w``, plus (advantage mode) the per-token
    ``c * (q_t - s_t)``. Reward mode left them to the estimator."""
    d = cfg.distill
    if d is None or d.mode == "reward" or batch.teacher_logprobs is None:
        return
    coef = d.coef if d.mode == "advantage" else 0.0
    batch.advantages = distill_advantages(batch.advantages, batch.old_logprobs, batch.teacher_logprobs,
                                          batch.response_mask, coef=coef, reward_weight=d.reward_weight)
    metrics["distill/advantage_mean"] = float(masked_mean(batch.advantages, batch.response_mask))
