"""The token-selector seam: which response tokens the policy loss credits.

    selector = build_token_selector(cfg, ...)                       # credo.recipes.stages, from ``token_select``
    policy_batch = selector.select(batch, trajs, metrics, timer, step=step)   # after the advantages

Built-ins: :class:`AllTokens` (``type: none``), :class:`EntropySelector` (``type: entropy``: the top-q entropy
"forking tokens") and VEPO's grounding-sensitive tokens (``type: vepo``,
:class:`credo.methods.vepo.select.VepoSelector`). ``needs`` declares what the step must provide.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch

from credo.train.stats import Timer
from credo.types import TrainBatch, Trajectory


@dataclass(frozen=True)
class SelectorNeeds:
    """What the step needs for the selection."""

    # the separate old-log-prob pass: the selection reads its entropy, or is made from the behaviour policy before
    # the update (so the pass cannot be fused into the update)
    old_logprob_pass: bool = False


class TokenSelector(Protocol):
    needs: SelectorNeeds

    def select(self, batch: TrainBatch, trajs: list[Trajectory], metrics: dict, timer: Timer, *,
               step: int) -> TrainBatch:
        """The batch the policy update sees (its loss mask or advantages restricted); adds its metrics."""


class AllTokens:
    """``token_select.type=none``: every response token keeps its loss."""

    needs = SelectorNeeds()

    def select(self, batch: TrainBatch, trajs, metrics: dict, timer: Timer, *, step: int) -> TrainBatch:
        return batch


@dataclass(frozen=True)
class EntropySelector:
    """``token_select.type=entropy``: the loss on the top-``quantile`` tokens by entropy only."""

    quantile: float

    @property
    def needs(self) -> SelectorNeeds:
        return SelectorNeeds(old_logprob_pass=self.quantile < 1.0)  # 1.0 keeps every token (nothing to read)

    def select(self, batch: TrainBatch, trajs, metrics: dict, timer: Timer, *, step: int) -> TrainBatch:
        return top_entropy_tokens(batch, self.quantile, metrics)


def top_entropy_tokens(batch: TrainBatch, quantile: float, metrics: dict) -> TrainBatch:
    """Restrict the policy loss to the top-``quantile`` entropy tokens ("forking tokens"; 1.0 = all of them), from
    the old-log-prob pass's ``batch.entropy``; ``token_select/frac`` is the share kept."""
    if quantile >= 1.0:
        return batch
    valid = batch.response_mask.bool()
    threshold = torch.quantile(batch.entropy[valid].double(), 1.0 - quantile) if valid.any() else 0.0
    keep = valid & (batch.entropy >= threshold)
    metrics["token_select/frac"] = float(keep.sum()) / max(float(valid.sum()), 1.0)
    return dataclasses.replace(batch, response_mask=keep.float())
