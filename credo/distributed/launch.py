"""Starting and stopping the data-parallel process group from a run's config (``distributed.*``)."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from credo.train.data_parallel import LOCAL, DataParallel


def init_data_parallel(cfg) -> DataParallel:
    """``LOCAL`` for ``distributed.backend=none``; under ``torchrun``, join the process group it describes."""
    d = cfg.distributed
    if d.backend == "none":
        return LOCAL
    if d.backend == "ray":
        raise ValueError("distributed.backend=ray: the ranks are Ray actors whose process group "
                         "credo.distributed.ray_launch sets up (credo train does it); not joined from here")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError("distributed.backend=torchrun needs the torchrun environment (RANK, WORLD_SIZE, ...): "
                         "launch with `torchrun --nproc-per-node N --no-python credo train ...`")
    import torch.distributed as dist

    comm = d.comm if d.comm != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if not dist.is_initialized():
        dist.init_process_group(comm, init_method="env://")
    return DataParallel(dist.get_rank(), dist.get_world_size())


def rank_run_dir(dp: DataParallel, run_dir: Path | None) -> Path:
    """This rank's run directory: rank 0's ``run_dir`` (the only one read), or ``RUN_DIR/rank{r}`` for rank r > 0."""
    if not dp.enabled:
        assert run_dir is not None
        return run_dir
    import torch.distributed as dist

    shared = [str(run_dir) if dp.rank == 0 else None]
    dist.broadcast_object_list(shared, src=0, group=dp.group)
    return Path(shared[0]) if dp.rank == 0 else Path(shared[0]) / f"rank{dp.rank}"


def shutdown(dp: DataParallel) -> None:
    if dp.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
