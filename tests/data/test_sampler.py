"""PromptSampler: epoch coverage, reshuffling, and exact resume from a state dict."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from credo.data import PromptSampler
from credo.types import Example


def _examples(n: int) -> list[Example]:
    return [Example(prompt=f"p{i}", answer=str(i), uid=f"u{i}") for i in range(n)]


def _uids(batches: list[list[Example]]) -> list[list[str]]:
    return [[e.uid for e in b] for b in batches]


def test_each_epoch_covers_every_example_once():
    n = 23
    sampler = PromptSampler(_examples(n), seed=0)
    stream = [e.uid for _ in range(n) for e in sampler.next_batch(5)]  # n batches of 5 = 5 epochs
    epochs = [stream[i * n : (i + 1) * n] for i in range(5)]
    for epoch in epochs:
        assert Counter(epoch) == Counter(f"u{i}" for i in range(n))
    assert len({tuple(e) for e in epochs}) == 5  # reshuffled every epoch
    assert sampler.epoch == 5 and sampler.position == 0


def test_epoch_property_and_batches_cross_boundaries():
    sampler = PromptSampler(_examples(10), seed=1)
    assert sampler.epoch == 0
    assert len(sampler.next_batch(7)) == 7
    assert sampler.epoch == 0 and sampler.position == 7
    batch = sampler.next_batch(7)  # 3 from epoch 0, 4 from epoch 1
    assert len(batch) == 7 and sampler.epoch == 1 and sampler.position == 4
    big = sampler.next_batch(25)  # larger than the dataset
    assert len(big) == 25 and sampler.epoch == 3


def test_no_shuffle_keeps_order():
    sampler = PromptSampler(_examples(4), seed=0, shuffle=False)
    assert [e.uid for e in sampler.next_batch(6)] == ["u0", "u1", "u2", "u3", "u0", "u1"]


def test_seed_determines_order():
    a = _uids([PromptSampler(_examples(50), seed=7).next_batch(50)])
    b = _uids([PromptSampler(_examples(50), seed=7).next_batch(50)])
    c = _uids([PromptSampler(_examples(50), seed=8).next_batch(50)])
    assert a == b and a != c


@pytest.mark.parametrize("via_json", [False, True])
@pytest.mark.parametrize("consumed", [0, 3, 11, 37])
def test_state_round_trip_continues_identically(via_json, consumed):
    examples = _examples(13)
    original = PromptSampler(examples, seed=123)
    for _ in range(consumed):
        original.next_batch(3)
    state = original.state_dict()
    if via_json:
        state = json.loads(json.dumps(state))
    restored = PromptSampler(examples, seed=999)  # seed comes from the state
    restored.load_state_dict(state)
    assert restored.epoch == original.epoch and restored.position == original.position
    expected = _uids([original.next_batch(3) for _ in range(50)])
    assert _uids([restored.next_batch(3) for _ in range(50)]) == expected
    assert restored.state_dict() == original.state_dict()


def test_state_is_json_serialisable():
    sampler = PromptSampler(_examples(5), seed=0)
    sampler.next_batch(3)
    json.dumps(sampler.state_dict())


def test_load_state_rejects_other_dataset():
    state = PromptSampler(_examples(5), seed=0).state_dict()
    with pytest.raises(ValueError, match="5 examples"):
        PromptSampler(_examples(6), seed=0).load_state_dict(state)


def test_bad_arguments():
    with pytest.raises(ValueError):
        PromptSampler([], seed=0)
    with pytest.raises(ValueError):
        PromptSampler(_examples(3), seed=0).next_batch(0)


def test_batches_iterator():
    it = PromptSampler(_examples(4), seed=0).batches(3)
    got = [next(it) for _ in range(4)]
    assert all(len(b) == 3 for b in got)
