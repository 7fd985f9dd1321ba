"""The agent collector's guards (credo.guards): ``tool_calls`` and ``env_failures``, checked once per RL step on
the step's episodes before any of them reaches the update."""
from __future__ import annotations

from credo.guards import Guards
from credo.types import RewardResult, Trajectory


def check_tool_calls(guards: Guards, trajs: list[Trajectory], results: list[RewardResult], *, step: int) -> None:
    """``tool_calls``: in a structured-tools run, a step whose episodes attempted no tool call at all trips (the
    peers' failure: reward rose while the model had stopped calling its tools)."""
    attempted = sum(t.info.get("tool_attempted", 0) for t in trajs)
    success = sum(r.correct for r in results) / max(len(results), 1)
    guards.check("tool_calls", attempted > 0,
                 f"RL step {step + 1}: no tool call attempted in {len(trajs)} episodes of a structured-tools run "
                 f"(success {success:.0%}); is the reward reachable without the tools, or the call format unparsed?")


def check_env_failures(guards: Guards, results: list[RewardResult], kept: list[RewardResult], *, step: int) -> None:
    """``env_failures``: a step with episodes the environment failed on trips (they are dropped from the update by
    credo.collect.agent.drop_env_failures, never trained on as empty or zero-reward episodes); a failed episode
    among the kept ones would be trained on and raises whatever the mode (a bug, not a run condition)."""
    if any(r.failed for r in kept):
        raise AssertionError("an episode that failed in the environment was kept for the update")
    failed = sum(r.failed for r in results)
    left = "no rows left: the step is skipped" if not kept else f"{len(kept)} episodes kept"
    guards.check("env_failures", failed == 0,
                 f"RL step {step + 1}: {failed} of {len(results)} episodes ended in an environment failure and are "
                 f"left out of the update ({left})")
