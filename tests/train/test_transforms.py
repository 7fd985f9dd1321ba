"""credo.train.transforms: the built-in batch transforms by hand, and the phase order."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from credo.tracking.timer import Timer
from credo.config import load_config
from credo.train.transforms import (BATCH_TRANSFORMS, BuildContext, KLInReward, StepIO, TopEntropyTokens, build_transforms,
                                    run_phase)
from tests.train.test_loss_terms import _batch


def io() -> StepIO:
    return StepIO(metrics={}, timer=Timer(), step=0, trajs=[])


def test_kl_in_reward_by_hand():
    b = _batch()
    b.old_logprobs = torch.full((2, 3), -0.5)  # k1 KL = -0.5 - (-1) = 0.5 per response token
    x = io()
    _, rewards = KLInReward(0.1, "k1")(b, torch.tensor([1.0, 0.0]), x)
    # row 0: the score 1 on its last token (t=1), each of its 2 tokens - 0.1 * 0.5; row 1: 3 tokens, score 0
    expected = torch.tensor([[-0.05, 0.95, 0.0], [-0.05, -0.05, -0.05]])
    torch.testing.assert_close(rewards, expected)
    # the penalty metric: mean over rows of 0.1 * sum_t KL_t = (0.1 + 0.15) / 2
    assert x.metrics["actor/reward_kl_penalty"] == pytest.approx(0.125)


def test_top_entropy_tokens_by_hand():
    b = _batch()
    b.entropy = torch.tensor([[1.0, 3.0, 9.0], [2.0, 5.0, 4.0]])  # valid: 1, 3 | 2, 5, 4 (9 is padding)
    x = io()
    out, _ = TopEntropyTokens(0.4)(b, None, x)
    # the 0.6-quantile of (1, 2, 3, 4, 5) is 3.4: keeps 4 and 5, 2 of 5 tokens
    assert out.response_mask.tolist() == [[0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    assert x.metrics["token_select/frac"] == pytest.approx(0.4)
    assert b.response_mask.sum() == 5  # the critic and the metrics keep the whole batch


def test_phases_run_in_order_and_a_bad_phase_is_refused(tmp_path):
    calls = []

    @dataclass(frozen=True)
    class Mark:
        name: str
        phase: str
        order: int
        reads: tuple = ()
        writes: tuple = ()

        def __call__(self, batch, rewards, io):
            calls.append(self.name)
            return batch, rewards

    built = (Mark("b", "rewards", 2), Mark("a", "rewards", 1), Mark("c", "policy", 0))
    BATCH_TRANSFORMS.add("test_marks", lambda ctx: None)
    try:
        ordered = tuple(sorted(built, key=lambda t: (("rewards", "advantages", "policy").index(t.phase), t.order)))
        run_phase(ordered, "rewards", _batch(), None, io())
        assert calls == ["a", "b"]
        BATCH_TRANSFORMS.remove("test_marks")
        BATCH_TRANSFORMS.add("test_bad", lambda ctx: Mark("bad", "later", 0))
        with pytest.raises(ValueError, match="phase 'later'"):
            build_transforms(BuildContext(load_config(), None, None, tmp_path))
    finally:
        BATCH_TRANSFORMS.remove("test_marks")
        BATCH_TRANSFORMS.remove("test_bad")
