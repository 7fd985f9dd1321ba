"""Batch transforms: a method's change to the batch between collection and the policy update.

A transform runs in one of three phases of the RL step (credo/recipes/step.py), in ``order`` within its phase::

    rewards     after the passes, before the estimator   (batch, rewards) -> rewards     KL-in-reward, distill reward
    advantages  after the estimator                      batch -> batch                  distill advantage / loss
    policy      the policy update's view of the batch    batch -> batch                  token selection (entropy, VEPO)

It declares what it ``reads`` (batch fields and extras, e.g. ``old_logprobs``, ``entropy``, ``ref_logprobs``) and
what it ``writes``; the trainer derives the passes it runs from those declarations (credo.train.plan): a transform
reading ``old_logprobs`` or ``entropy`` keeps the old-log-prob pass, one reading ``ref_logprobs`` loads the frozen
reference. Registered once, with a builder that reads its config keys and returns the transform, or None when the
config leaves it off::

    @BATCH_TRANSFORMS.register("my_transform")
    def build(ctx: BuildContext) -> BatchTransform | None: ...

The transform's ``__call__(batch, rewards, io)`` returns ``(batch, rewards)`` (either may be the one it got); it
adds its metrics to ``io.metrics`` and times itself with ``io.timer``. A transform of the ``policy`` phase returns
the batch the policy update sees (e.g. a narrower ``response_mask``): the critic and the metrics keep the whole one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from credo.algo import kl_penalty, masked_mean
from credo.algo.advantages import token_rewards
from credo.registry import Registry
from credo.types import TrainBatch

PHASES = ("rewards", "advantages", "policy")


@dataclass(frozen=True)
class BuildContext:
    """What a transform's builder may use (built once per run)."""

    cfg: Any  # the RunConfig: builders read their keys from it; the transform itself holds plain values
    model: Any  # the policy
    tokenizer: Any
    run_dir: Path


@dataclass
class StepIO:
    """The step's shared outputs a transform adds to, and what it may read besides the batch."""

    metrics: dict[str, float]
    timer: Any  # credo.tracking Timer: ``with io.timer("name"):``
    step: int
    trajs: list  # the step's trajectories (row order = the batch's)


class BatchTransform(Protocol):
    name: str
    phase: str  # one of PHASES
    order: int
    reads: tuple[str, ...]
    writes: tuple[str, ...]

    def __call__(self, batch: TrainBatch, rewards: torch.Tensor | None,
                 io: StepIO) -> tuple[TrainBatch, torch.Tensor | None]: ...


BATCH_TRANSFORMS: Registry[Callable[[BuildContext], BatchTransform | None]] = Registry(
    "batch transform", builtins=("credo.methods.distill.terms", "credo.methods.vepo.select"))


def build_transforms(ctx: BuildContext) -> tuple[BatchTransform, ...]:
    """The run's enabled transforms, by phase then order then name."""
    out = []
    for name, build in BATCH_TRANSFORMS.items():
        t = build(ctx)
        if t is None:
            continue
        if t.phase not in PHASES:
            raise ValueError(f"batch transform {name!r}: phase {t.phase!r} is not one of {', '.join(PHASES)}")
        out.append(t)
    return tuple(sorted(out, key=lambda t: (PHASES.index(t.phase), t.order, t.name)))


def run_phase(transforms: tuple[BatchTransform, ...], phase: str, batch: TrainBatch, rewards: torch.Tensor | None,
              io: StepIO) -> tuple[TrainBatch, torch.Tensor | None]:
    """Apply the transforms of ``phase`` in order."""
    for t in transforms:
        if t.phase == phase:
            batch, rewards = t(batch, rewards, io)
    return batch, rewards


# ----------------------------------------------------------------------------------------------- built-ins

@dataclass(frozen=True)
class KLInReward:
    """``r_t <- r_t - beta * k(log pi_old - log pi_ref)_t`` on every response token (verl's ``use_kl_in_reward``);
    the scores become token rewards (each on its row's last loss token) first."""

    coef: float
    estimator: str
    name: str = "kl_in_reward"
    phase: str = "rewards"
    order: int = 20
    reads: tuple[str, ...] = ("old_logprobs", "ref_logprobs")
    writes: tuple[str, ...] = ("rewards",)

    def __call__(self, batch: TrainBatch, rewards: torch.Tensor, io: StepIO) -> tuple[TrainBatch, torch.Tensor]:
        kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, self.estimator) * batch.response_mask  # (B, T)
        io.metrics["actor/reward_kl_penalty"] = float((self.coef * kl.sum(-1)).mean())
        io.metrics["actor/reward_kl_penalty_coeff"] = self.coef
        token_scores = rewards if rewards.dim() == 2 else token_rewards(rewards, batch.response_mask)
        return batch, token_scores - self.coef * kl


@dataclass(frozen=True)
class TopEntropyTokens:
    """``token_select.type=entropy``: the policy loss on the top ``share`` (``token_select.top_fraction``) of the
    response tokens by the behaviour policy's entropy only (the "forking tokens"); ``token_select/frac`` is the
    share kept."""

    share: float
    name: str = "token_select"
    phase: str = "policy"
    order: int = 10
    reads: tuple[str, ...] = ("entropy",)
    writes: tuple[str, ...] = ("response_mask",)

    def __call__(self, batch: TrainBatch, rewards, io: StepIO) -> tuple[TrainBatch, Any]:
        valid = batch.response_mask.bool()
        threshold = torch.quantile(batch.entropy[valid].double(), 1.0 - self.share) if valid.any() else 0.0
        keep = valid & (batch.entropy >= threshold)
        io.metrics["token_select/frac"] = float(keep.sum()) / max(float(valid.sum()), 1.0)
        return dataclasses.replace(batch, response_mask=keep.float()), rewards


@BATCH_TRANSFORMS.register("kl_in_reward")
def _kl_in_reward(ctx: BuildContext) -> KLInReward | None:
    a = ctx.cfg.algo
    return KLInReward(a.kl_coef, a.kl_estimator) if a.kl_in_reward and a.kl_coef > 0 else None


@BATCH_TRANSFORMS.register("entropy_tokens")
def _entropy_tokens(ctx: BuildContext) -> TopEntropyTokens | None:
    s = ctx.cfg.token_select
    return TopEntropyTokens(s.top_fraction) if s.type == "entropy" and s.top_fraction < 1.0 else None


def kl_metric(batch: TrainBatch, estimator: str) -> float:
    """``actor/kl``: the batch's mean KL estimate between the behaviour and the reference policy."""
    kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, estimator) * batch.response_mask
    return float(masked_mean(kl, batch.response_mask))
