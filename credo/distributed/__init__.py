"""Distributed execution: data-parallel updates and sharded rollouts over torch.distributed (torchrun)."""
from credo.distributed.data_parallel import LOCAL, DataParallel

__all__ = ["LOCAL", "DataParallel"]
