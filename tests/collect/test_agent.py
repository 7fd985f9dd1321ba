"""credo.collect.agent: the per-group diversity metrics of a step's episodes."""
from __future__ import annotations

import pytest

from credo.collect.agent import group_diversity
from credo.types import Example, Trajectory


def _traj(group: int, response: list[int], last_turn: tuple[int, int]) -> Trajectory:
    return Trajectory(example=Example(prompt="p", answer=""), group_id=group, prompt_ids=[1], response_ids=response,
                      rollout_logprobs=[0.0] * len(response), response_mask=[1] * len(response),
                      finish_reason="eos", turns=[(0, 1), last_turn])


def test_group_diversity_hand_computed():
    trajs = [
        # group 0: three episodes, two identical; the final turns (tokens 2:4) are [5, 6], [5, 6], [7, 6]
        _traj(0, [1, 2, 5, 6], (2, 4)), _traj(0, [1, 2, 5, 6], (2, 4)), _traj(0, [1, 3, 7, 6], (2, 4)),
        # group 1: two different episodes with the same final turn [9]
        _traj(1, [4, 9], (1, 2)), _traj(1, [5, 9], (1, 2)),
    ]
    out = group_diversity(trajs)
    assert out["agent/distinct_episodes_per_group"] == pytest.approx((2 + 2) / 2)
    assert out["agent/distinct_answers_per_group"] == pytest.approx((2 + 1) / 2)
    assert out["agent/distinct_share"] == pytest.approx((2 / 3 + 2 / 2) / 2)
    assert group_diversity([]) == {}
