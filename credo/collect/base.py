"""The collector seam: what a step's rollout collection is, whatever the method that collects.

    collector = build_collector(cfg, ...)            # credo.recipes.stages: chosen once from the config
    collector.start(run_dir)                         # a new run, after the step-0 evaluation (e.g. a pool to collect)
    rollouts  = collector.collect(step, timer)       # generate + score (+ shape, filter, branch, replay ...)
    rewards   = collector.rewards(batch, trajs)      # the reward tensor the estimator reads (default batch.scores)
    state     = collector.state_dict()               # saved with every checkpoint, under one key

Implementations (composition, not inheritance): :class:`credo.collect.group.GroupCollector` (single-turn
groups), :class:`credo.collect.agent.AgentCollector` (multi-turn episodes),
:class:`credo.methods.attnrl.collector.TreeCollector` (AttnRL trees) and
:class:`credo.methods.rlep.collector.ReplayCollector`, which wraps a single-turn collector and mixes stored answers
into its groups. ``needs`` declares what the trainer's step must do because of how the rows were collected.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from credo.tracking.timer import Timer
    from credo.types import TrainBatch, Trajectory


@dataclass(frozen=True)
class CollectorNeeds:
    """What the step needs because of how the rows were collected."""

    old_logprob_pass: bool = False  # a separate no-grad old-log-prob pass is required (e.g. replayed rows)


class Collector(Protocol):
    """One step's rollouts, and the state a resumed run needs to continue the same collection."""

    @property
    def needs(self) -> CollectorNeeds: ...

    def start(self, run_dir: Path) -> None:
        """A new run (not a resumed one): called once after the step-0 evaluation, before the first step."""

    def collect(self, step: int, timer: Timer) -> Any:
        """Generate and score the rollouts of 0-indexed RL ``step``: a :class:`credo.types.Rollouts`
        (not imported here: credo.collect.group imports this module)."""

    def rewards(self, batch: TrainBatch, trajs: list[Trajectory]) -> torch.Tensor:
        """The rewards the advantage estimator reads: (B,) scores or (B, T) token rewards."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
