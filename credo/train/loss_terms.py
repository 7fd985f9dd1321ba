"""Loss terms: the policy's loss is the policy-gradient term plus the sum of the enabled registered terms.

    loss = L_pg + sum_k  coef_k * agg(term_k)        (terms in ``order``; credo.train.update.actor_loss)

A term is registered once, with a builder that reads its config keys and returns the term (or None when the config
leaves it off); the term itself is math on tensors and never sees the config::

    @LOSS_TERMS.register("my_term")
    def my_term(cfg) -> LossTerm | None: ...

Built-in terms (docs/algorithms/README.md has the formulas):

    kl       algo.kl_coef > 0, not algo.kl_in_reward    + beta * agg(KL_est(pi, pi_ref))          actor/kl_loss
    entropy  algo.entropy_coef != 0                     - c_H * agg(H_t)                          actor/entropy_loss
    sft      algo.sft_coef > 0                          + c_sft * agg_correct(-log pi(y_t))       actor/sft_loss
    distill  distill.mode=loss (credo.methods.distill)  + c * agg(KL_est(pi, pi_teacher))        distill/kl_loss

Each term declares what it reads from the batch (``reads``: the trainer runs the passes that provide it, e.g. the
reference pass for ``ref_logprobs``), whether it needs the policy's entropy, and whether rows whose advantages are
all zero get no gradient from it (``inert_at_zero_advantage``: only then may the update leave such rows out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from credo.algo import AggNorm, agg_loss, kl_penalty
from credo.registry import Registry
from credo.types import TrainBatch


@dataclass(frozen=True)
class TermInputs:
    """What a term's ``__call__`` receives for one micro-batch."""

    logprobs: torch.Tensor  # (B, T) the policy's log-probs, with gradient
    entropy: torch.Tensor | None  # (B, T) the policy's entropy, with gradient (None unless a term or loss needs it)
    batch: TrainBatch  # the micro-batch
    agg: str  # algo.agg
    norm: AggNorm  # the mini-batch's normalisers
    prepared: Any = None  # what the term's ``prepare`` returned for this mini-batch


class LossTerm(Protocol):
    name: str  # metric key of the term's (unweighted) value
    order: int  # terms are added in this order (then by name): floating-point sums depend on it
    reads: tuple[str, ...]  # batch fields / extras the term reads
    needs_entropy: bool
    inert_at_zero_advantage: bool

    def prepare(self, mini_batch: TrainBatch, scale: float) -> Any:
        """Per mini-batch, before its micro-batches (e.g. a normaliser over the mini-batch's own token set)."""

    def __call__(self, x: TermInputs) -> tuple[float, torch.Tensor] | None:
        """(coefficient, scalar value) of this micro-batch, or None for no contribution: loss += coef * value."""


LOSS_TERMS: Registry[Callable[[Any], LossTerm | None]] = Registry(
    "loss term", builtins=("credo.methods.distill.terms",))


def build_loss_terms(cfg) -> tuple[LossTerm, ...]:
    """The run's enabled terms, in their summation order."""
    terms = [t for _, build in LOSS_TERMS.items() if (t := build(cfg)) is not None]
    return tuple(sorted(terms, key=lambda t: (t.order, t.name)))


# ----------------------------------------------------------------------------------------------- built-in terms

@dataclass(frozen=True)
class KLTerm:
    """``+ beta * agg(k(log pi - log pi_ref))``: the KL penalty to the frozen reference, in the loss (GRPO)."""

    coef: float
    estimator: str
    name: str = "actor/kl_loss"
    order: int = 10
    reads: tuple[str, ...] = ("ref_logprobs",)
    needs_entropy: bool = False
    inert_at_zero_advantage: bool = False

    def prepare(self, mini_batch: TrainBatch, scale: float) -> None:
        return None

    def __call__(self, x: TermInputs) -> tuple[float, torch.Tensor]:
        kl = kl_penalty(x.logprobs, x.batch.ref_logprobs, self.estimator)
        return self.coef, agg_loss(kl, x.batch.response_mask, x.agg, norm=x.norm)


@dataclass(frozen=True)
class EntropyTerm:
    """``- c_H * agg(H_t)``: the entropy bonus."""

    coef: float
    name: str = "actor/entropy_loss"
    order: int = 30
    reads: tuple[str, ...] = ()
    needs_entropy: bool = True
    inert_at_zero_advantage: bool = False

    def prepare(self, mini_batch: TrainBatch, scale: float) -> None:
        return None

    def __call__(self, x: TermInputs) -> tuple[float, torch.Tensor]:
        return -self.coef, agg_loss(x.entropy, x.batch.response_mask, x.agg, norm=x.norm)


def correct_mask(batch: TrainBatch, correct_score: float) -> torch.Tensor:
    """(B, T) loss mask restricted to fully correct responses (score == correct_score)."""
    return batch.response_mask * (batch.scores == correct_score).float().unsqueeze(-1)


@dataclass(frozen=True)
class SFTTerm:
    """``+ c_sft * agg_C(-log pi(y_t))`` over the tokens of fully correct responses C (GPPO / CE-GPPO recipes),
    aggregated with the normalisers of C within the mini-batch."""

    coef: float
    correct_score: float
    name: str = "actor/sft_loss"
    order: int = 40
    reads: tuple[str, ...] = ("scores",)
    needs_entropy: bool = False
    inert_at_zero_advantage: bool = False

    def prepare(self, mini_batch: TrainBatch, scale: float) -> AggNorm:
        return AggNorm.of(correct_mask(mini_batch, self.correct_score), scale)

    def __call__(self, x: TermInputs) -> tuple[float, torch.Tensor] | None:
        if x.prepared.num_tokens <= 0:  # no correct response in the mini-batch
            return None
        mask = correct_mask(x.batch, self.correct_score)
        return self.coef, agg_loss(-x.logprobs, mask, x.agg, norm=x.prepared)


@LOSS_TERMS.register("kl")
def _kl(cfg) -> KLTerm | None:
    a = cfg.algo
    return KLTerm(a.kl_coef, a.kl_estimator) if a.kl_coef > 0 and not a.kl_in_reward else None


@LOSS_TERMS.register("entropy")
def _entropy(cfg) -> EntropyTerm | None:
    return EntropyTerm(cfg.algo.entropy_coef) if cfg.algo.entropy_coef != 0 else None


@LOSS_TERMS.register("sft")
def _sft(cfg) -> SFTTerm | None:
    a = cfg.algo
    return SFTTerm(a.sft_coef, a.sft_correct_score) if a.sft_coef > 0 else None
