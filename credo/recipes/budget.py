"""What ends an RL run: ``train.steps``, or a budget of sampled tokens, trained tokens or wall time
(``train.budget`` / ``train.budget_value``; docs/evidence.md, "Budgets").

The loop adds each step's spend to the run state (checkpointed, so a resumed run goes on counting) and stops after
the first step at which the budget's total reaches its value; ``train.steps`` stays an upper bound. That last step
gets the final evaluation and checkpoint an ordinary last step gets.

- ``sampled_tokens``: response tokens the rollout engine sampled for training (credo.rollout.counting), filtered
  groups, tree branches, agent turns and greedy baselines included, the held-out evaluation excluded. A batch
  sampled ahead (one-step-off, bounded staleness) counts at the step that trains on it.
- ``trained_tokens``: response tokens of the step's update batch (``perf/response_tokens``).
- ``wall_s``: the RL loop's wall seconds (evaluation included), summed over resumed segments; not reproducible.
"""
from __future__ import annotations

from typing import Any

SPEND_KEYS = {"sampled_tokens": "budget/sampled_tokens", "trained_tokens": "budget/trained_tokens",
              "wall_s": "timing_s/rl_wall_total"}


def add_spend(state: Any, metrics: dict[str, float], *, sampled: int, wall_s: float) -> None:
    """Add one step's spend to ``state`` and write the running totals into the step's ``metrics``. ``sampled``: what
    the step sampled besides its batch; the batch's own count is its ``perf/sampled_tokens_collect``."""
    sampled = int(metrics.get("perf/sampled_tokens_collect", 0)) + sampled
    state.sampled_tokens += sampled
    state.trained_tokens += float(metrics.get("perf/response_tokens", 0.0))
    metrics["perf/sampled_tokens"] = float(sampled)
    metrics["budget/sampled_tokens"] = float(state.sampled_tokens)
    metrics["budget/trained_tokens"] = float(state.trained_tokens)
    metrics["timing_s/rl_wall_total"] = float(state.wall_s + wall_s)


def spent(cfg: Any, state: Any) -> float:
    unit = cfg.train.budget
    return {"steps": float(state.step), "sampled_tokens": float(state.sampled_tokens),
            "trained_tokens": float(state.trained_tokens), "wall_s": float(state.wall_s)}[unit]


def finished(cfg: Any, state: Any) -> bool:
    """The run has taken its last step: ``train.steps``, or the budget reached."""
    if state.step >= cfg.train.steps:
        return True
    return cfg.train.budget != "steps" and spent(cfg, state) >= cfg.train.budget_value
