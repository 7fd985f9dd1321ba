"""On-policy distillation's pieces of the RL step (``distill`` set), registered on the step's extension points:

    distill_teacher     batch transform, phase rewards: the teacher's log-probs of the student's tokens into the
                        batch extra ``teacher_logprobs`` and the reverse-KL metrics; in reward mode the dense
                        rewards ``w * r_t + c * (q_t - s_t)``
    distill_advantages  batch transform, phase advantages (advantage and loss modes): ``A_t <- w * A_t`` plus, in
                        advantage mode, ``c * (q_t - s_t)``
    distill             loss term (loss mode): ``+ c * agg(k(log pi, q))``

Formulas and modes: docs/algorithms/distill.md (credo.algo.distill has the math). The student's no-grad log-probs
``s_t`` are the old-log-prob pass's: the teacher transform reads ``old_logprobs``, so the trainer never fuses that
pass away while distilling (credo.train.plan).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

from credo.algo import agg_loss, masked_mean
from credo.algo.distill import distill_advantages, distill_loss_tokens, distill_token_rewards, reverse_kl_tokens
from credo.methods.distill.teacher import load_teacher, teacher_logprobs
from credo.train.loss_terms import LOSS_TERMS, TermInputs
from credo.train.transforms import BATCH_TRANSFORMS, BuildContext, StepIO
from credo.types import TrainBatch, declare_extra

TEACHER_LOGPROBS = declare_extra("teacher_logprobs", "on-policy distillation (credo.methods.distill): (B, T) the "
                                 "teacher's log-probs of the student's tokens, 0 off the response")


@dataclass(frozen=True)
class DistillTeacher:
    """The teacher pass, its metrics and (reward mode) the dense distillation rewards."""

    score: Callable[[TrainBatch], torch.Tensor]  # batch -> (B, T) teacher log-probs
    mode: str
    coef: float
    reward_weight: float
    name: str = "distill_teacher"
    phase: str = "rewards"
    order: int = 10
    reads: tuple[str, ...] = ("old_logprobs",)
    writes: tuple[str, ...] = (TEACHER_LOGPROBS, "rewards")

    def __call__(self, batch: TrainBatch, rewards: torch.Tensor, io: StepIO) -> tuple[TrainBatch, torch.Tensor]:
        if batch.old_logprobs is None:
            raise RuntimeError("distillation needs the student's old log-probs; the old-log-prob pass did not run")
        with io.timer("teacher"):
            batch.set_extra(TEACHER_LOGPROBS, self.score(batch))  # (B, T)
        teacher, mask = batch.extra(TEACHER_LOGPROBS), batch.response_mask
        kl = reverse_kl_tokens(batch.old_logprobs, teacher, mask)  # (B, T)
        io.metrics["distill/reverse_kl"] = float(masked_mean(kl, mask))
        io.metrics["distill/teacher_logprob"] = float(masked_mean(teacher, mask))
        io.metrics["distill/student_logprob"] = float(masked_mean(batch.old_logprobs, mask))
        if self.mode != "reward":
            return batch, rewards
        return batch, distill_token_rewards(rewards, batch.old_logprobs, teacher, mask, coef=self.coef,
                                            reward_weight=self.reward_weight)


@dataclass(frozen=True)
class DistillAdvantages:
    """Advantage and loss modes: ``A_t <- w * A_t (+ c * (q_t - s_t) in advantage mode)``."""

    coef: float  # 0 in loss mode (the KL is the loss term's)
    reward_weight: float
    name: str = "distill_advantages"
    phase: str = "advantages"
    order: int = 10
    reads: tuple[str, ...] = ("advantages", "old_logprobs", TEACHER_LOGPROBS)
    writes: tuple[str, ...] = ("advantages",)

    def __call__(self, batch: TrainBatch, rewards: Any, io: StepIO) -> tuple[TrainBatch, Any]:
        batch.advantages = distill_advantages(batch.advantages, batch.old_logprobs, batch.extra(TEACHER_LOGPROBS),
                                              batch.response_mask, coef=self.coef,
                                              reward_weight=self.reward_weight)
        io.metrics["distill/advantage_mean"] = float(masked_mean(batch.advantages, batch.response_mask))
        return batch, rewards


@dataclass(frozen=True)
class DistillLoss:
    """``+ c * agg(k(log pi_t, q_t))``: the KL estimator to the teacher on the student's samples (loss mode)."""

    coef: float
    estimator: str
    name: str = "distill/kl_loss"
    order: int = 20
    reads: tuple[str, ...] = (TEACHER_LOGPROBS,)
    needs_entropy: bool = False
    inert_at_zero_advantage: bool = False

    def prepare(self, mini_batch: TrainBatch, scale: float) -> None:
        return None

    def __call__(self, x: TermInputs) -> tuple[float, torch.Tensor]:
        tokens = distill_loss_tokens(x.logprobs, x.batch.extra(TEACHER_LOGPROBS), self.estimator)
        return self.coef, agg_loss(tokens, x.batch.response_mask, x.agg, norm=x.norm)


@BATCH_TRANSFORMS.register("distill_teacher")
def _teacher(ctx: BuildContext) -> DistillTeacher | None:
    d = ctx.cfg.distill
    if d is None:
        return None
    teacher = load_teacher(ctx.cfg, ctx.tokenizer)  # a bad teacher fails the run here, before any training
    return DistillTeacher(functools.partial(teacher_logprobs, ctx.cfg, teacher), d.mode, d.coef, d.reward_weight)


@BATCH_TRANSFORMS.register("distill_advantages")
def _advantages(ctx: BuildContext) -> DistillAdvantages | None:
    d = ctx.cfg.distill
    if d is None or d.mode == "reward":
        return None
    return DistillAdvantages(d.coef if d.mode == "advantage" else 0.0, d.reward_weight)


@LOSS_TERMS.register("distill")
def _loss(cfg) -> DistillLoss | None:
    d = cfg.distill
    # coef 0: no term at all, so the update is plain GRPO's (a zero-weighted term would still keep the rows whose
    # advantages are all zero in the update, changing its row set and summation order; issue 37's equivalence test)
    return DistillLoss(d.coef, d.estimator) if d is not None and d.mode == "loss" and d.coef > 0 else None
