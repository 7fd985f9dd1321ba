"""Distributed execution: the coordinator, torchrun and Ray launchers, Ray pools, sharded rollouts and bounded
staleness. The update-side pieces the trainer itself uses (:class:`DataParallel`, FSDP2) sit below, in
:mod:`credo.train.data_parallel` and :mod:`credo.train.fsdp`; the names here are re-exported."""
from credo.train.data_parallel import LOCAL, DataParallel

__all__ = ["LOCAL", "DataParallel"]
