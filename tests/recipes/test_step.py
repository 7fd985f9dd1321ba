"""credo.recipes.step.step_metrics: the method-blind advantage metrics (docs/algorithms/README.md)."""
from types import SimpleNamespace

import torch

from credo.recipes.step import step_metrics
from credo.tracking.timer import Timer


def _batch(advantages, mask):
    return SimpleNamespace(advantages=torch.tensor(advantages), response_mask=torch.tensor(mask),
                           old_logprobs=None, values=None)


def _metrics(batch):
    timer = Timer()
    timer.seconds["step"], timer.seconds["gen"] = 1.0, 0.5
    trajs = [SimpleNamespace(prompt_ids=[1, 2], policy_version=3)]
    return step_metrics(batch, trajs, timer, step=3)


def test_advantage_std_is_the_unbiased_std_over_loss_tokens_only():
    # loss tokens hold 1, 3, -2, 2 (mean 1, squared deviations 0 + 4 + 9 + 1 = 14, unbiased var 14 / 3);
    # the masked-out 100s must not count
    batch = _batch([[1.0, 3.0, 100.0], [-2.0, 2.0, 100.0]], [[1, 1, 0], [1, 1, 0]])
    m = _metrics(batch)
    assert abs(m["advantages/std"] - (14 / 3) ** 0.5) < 1e-6
    assert abs(m["advantages/abs_mean"] - 2.0) < 1e-6


def test_advantage_std_is_zero_for_constant_advantages_and_tracks_scale():
    mask = [[1, 1, 1, 1]]
    assert _metrics(_batch([[0.5, 0.5, 0.5, 0.5]], mask))["advantages/std"] < 1e-6
    a = [[1.0, -1.0, 2.0, 0.0]]
    s1 = _metrics(_batch(a, mask))["advantages/std"]
    s3 = _metrics(_batch([[3 * x for x in a[0]]], mask))["advantages/std"]
    assert s1 > 0 and abs(s3 - 3 * s1) < 1e-5
