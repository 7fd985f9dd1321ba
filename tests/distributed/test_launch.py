"""credo.distributed.launch's GPU pinning under torchrun (the CUDA calls are stood in for: no GPU here)."""
from __future__ import annotations

import pytest
import torch

from credo.distributed import launch


@pytest.fixture
def gpus(monkeypatch):
    """A machine with ``n`` GPUs: the set_device calls are recorded."""
    calls: list[int] = []

    def have(n: int) -> list[int]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "set_device", calls.append)
        return calls

    return have


def test_each_rank_of_a_node_gets_the_gpu_of_its_local_rank(gpus, monkeypatch):
    """Regression: credo never read LOCAL_RANK, so with model.device=cuda every rank of a node used cuda:0."""
    calls = gpus(4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert launch.pin_local_gpu() == 3
    assert calls == [3]


def test_no_pinning_without_cuda_or_outside_torchrun(gpus, monkeypatch):
    calls = gpus(0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launch.pin_local_gpu() is None
    calls = gpus(2)
    monkeypatch.delenv("LOCAL_RANK")
    assert launch.pin_local_gpu() is None
    assert calls == []


def test_more_local_ranks_than_visible_gpus_is_one_clear_error(gpus, monkeypatch):
    gpus(2)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match="LOCAL_RANK=2 but this process sees 2 GPU"):
        launch.pin_local_gpu()


def test_a_rank_restricted_to_its_own_gpu_uses_it(gpus, monkeypatch):
    """CUDA_VISIBLE_DEVICES=$LOCAL_RANK (examples/slurm/credo_ddp.sbatch): the one visible GPU is device 0."""
    calls = gpus(1)
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert launch.pin_local_gpu() == 0
    assert calls == [0]
