"""Distributed execution: data-parallel training over torch.distributed (this module), more to come (issue 7)."""
from credo.distributed.data_parallel import LOCAL, DataParallel

__all__ = ["LOCAL", "DataParallel"]
