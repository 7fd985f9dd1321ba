"""RLEP in the collector seam: :class:`ReplayCollector` wraps a single-turn collector and mixes the pool's stored
answers into every group it collects (``replay: {...}``; ``docs/algorithms/rlep.md``).

    rollouts = inner.collect(step, timer)            # fresh groups
    replay_step(cfg, pool, ..., rollouts, step)      # + up to replay.num stored answers per group (scored)

Replayed rows were not sampled by the engine (``info["replay"]``, so the batch extra ``sampled`` is False for them):
the step needs the old-log-prob pass, whose log-probs become their behaviour log-probs (ratio 1 at the first
update), as the reference recomputes them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from credo.collect.base import Collector, CollectorNeeds
from credo.collect.registry import COLLECTOR_WRAPPERS, CollectorInputs
from credo.collect.group import noised_frac
from credo.types import Rollouts
from credo.methods.rlep.recipe import collect_at_start, open_replay, replay_step


class ReplayCollector:
    """``inner``'s rollouts with stored answers replayed into their groups; the pool (``replay.pool``'s file, or
    for ``warm_start`` the one :meth:`start` collects from the warm-started policy) and its refreshed entries are
    this collector's state."""

    def __init__(self, inner: Collector, cfg, *, run_dir: Path, tokenizer, runner_for: Callable[[int], Any],
                 engine, runner, data) -> None:
        self.inner, self.cfg, self.tokenizer, self.runner_for = inner, cfg, tokenizer, runner_for
        self.engine, self.runner, self.data = engine, runner, data  # data: the TaskData warm_start collects over
        self.pool = open_replay(cfg, run_dir)  # None for warm_start until start() collected it

    @property
    def needs(self) -> CollectorNeeds:
        # replayed rows need the current policy's log-probs as their behaviour's
        return CollectorNeeds(old_logprob_pass=self.pool is not None or self.inner.needs.old_logprob_pass)

    def start(self, run_dir: Path) -> None:
        """``replay.pool=warm_start``: collect the pool from the current (warm-started) policy into the run."""
        self.inner.start(run_dir)
        if self.cfg.replay.pool == "warm_start":
            self.pool = collect_at_start(self.cfg, self.engine, self.runner, self.data, run_dir)

    def collect(self, step: int, timer) -> Rollouts:
        rollouts = self.inner.collect(step, timer)
        if self.pool is None:
            return rollouts
        with timer("replay"):
            replay_step(self.cfg, self.pool, self.tokenizer, self.runner_for(step), rollouts, step)
        if "reward/noised_frac" in rollouts.metrics:  # the replayed answers were scored by the noisy runner too
            rollouts.metrics["reward/noised_frac"] = noised_frac(rollouts.results)
        return rollouts

    def rewards(self, batch, trajs):
        return self.inner.rewards(batch, trajs)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict() | {"replay": self.pool.state_dict() if self.pool is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
        if self.pool is not None and state.get("replay"):
            self.pool.load_state_dict(state["replay"])



@COLLECTOR_WRAPPERS.register("replay")
def _wrap_replay(x: CollectorInputs, inner: Collector) -> Collector:
    """``replay`` set (RLEP): the collector's groups mixed with replayed answers (the config loader allows it with
    single-turn group collection only)."""
    if x.cfg.replay is None:
        return inner
    return ReplayCollector(inner, x.cfg, run_dir=x.run_dir, tokenizer=x.tokenizer, runner_for=x.runner_for,
                           engine=x.engine, runner=x.runner, data=x.data)
