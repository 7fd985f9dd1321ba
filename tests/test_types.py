"""TrainBatch's extras: core fields plus the tensors some runs add, under names their writers declare."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from credo.models.batch import collate
from credo.registry import UnknownName
from credo.types import BATCH_EXTRAS, Example, RewardResult, TrainBatch, Trajectory


def _batch() -> TrainBatch:
    trajs = [Trajectory(example=Example(str(i), "", str(i)), group_id=0, prompt_ids=[5] * (i + 1),
                        response_ids=[6] * (3 - i), rollout_logprobs=[-0.5] * (3 - i), response_mask=[1] * (3 - i),
                        finish_reason="eos", info={"replay": "positive"} if i == 2 else {}) for i in range(3)]
    return collate(trajs, [RewardResult(float(i)) for i in range(3)], pad_id=0)


def test_the_method_specific_tensors_are_declared_extras_not_fields():
    fields = {f.name for f in dataclasses.fields(TrainBatch)}
    moved = {"value_quantiles", "return_quantiles", "ref_entropy", "flow_targets", "flow_weights", "token_rewards",
             "sampled", "pixel_values", "teacher_logprobs"}
    assert not moved & fields
    assert moved <= set(BATCH_EXTRAS.names())  # the built-in writers declare them (found by module name)
    per_row = {name for name, spec in BATCH_EXTRAS.items() if not spec.per_token}
    assert {"sampled", "pixel_values"} <= per_row and not per_row & {"token_rewards", "flow_targets"}


def test_extra_names_its_writer_when_absent_and_suggests_a_declared_name():
    batch = _batch()
    assert batch.extra("sampled").tolist() == [True, True, False]  # collate's: row 2 was replayed
    assert "pixel_values" not in batch.extras  # a text batch has no images
    with pytest.raises(KeyError, match="'token_rewards' is absent: its writer did not run.*credo.recipes.step"):
        batch.extra("token_rewards")
    with pytest.raises(UnknownName, match="did you mean 'token_rewards'"):
        batch.extra("token_reward")
    with pytest.raises(UnknownName, match="did you mean 'ref_entropy'"):
        batch.set_extra("ref_entropi", torch.zeros(3, 3))
    batch.set_extra("ref_entropy", torch.ones(3, 3))
    assert torch.equal(batch.extra("ref_entropy"), torch.ones(3, 3))


def test_select_slices_every_tensor_extra_by_rows():
    batch = _batch()
    batch.set_extra("token_rewards", torch.arange(9.0).view(3, 3))
    sub = batch.select(torch.tensor([2, 0]))
    assert sub.extra("sampled").tolist() == [False, True]
    assert torch.equal(sub.extra("token_rewards"), torch.tensor([[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]))
    assert sub.extras is not batch.extras and batch.extra("token_rewards").shape == (3, 3)
