"""Starting and stopping the data-parallel process group from a run's config (``distributed.*``)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from credo.train.data_parallel import LOCAL, DataParallel

log = logging.getLogger(__name__)


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

    pin_local_gpu()
    comm = d.comm if d.comm != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if not dist.is_initialized():
        dist.init_process_group(comm, init_method="env://")
    return DataParallel(dist.get_rank(), dist.get_world_size())


def pin_local_gpu() -> int | None:
    """Under torchrun on a machine with GPUs: make this rank's GPU, ``cuda:LOCAL_RANK``, the current CUDA device,
    so ``model.device=cuda`` (which means the current device) and NCCL put each rank of a node on its own GPU
    rather than every rank on ``cuda:0``; a rank that sees one GPU (the sbatch template's CUDA_VISIBLE_DEVICES=$LOCAL_RANK)
    uses it. Returns the device index (None without CUDA or LOCAL_RANK). Written to
    torch's documented API and never run on a GPU here (docs/distributed.md)."""
    local = os.environ.get("LOCAL_RANK")
    if local is None or not local.isdigit() or not torch.cuda.is_available():
        return None
    index = int(local)
    if torch.cuda.device_count() == 1:  # each rank given its own GPU (CUDA_VISIBLE_DEVICES=$LOCAL_RANK): that one
        index = 0
    elif index >= torch.cuda.device_count():
        raise ValueError(f"LOCAL_RANK={index} but this process sees {torch.cuda.device_count()} GPU(s): start at "
                         "most one rank per visible GPU (torchrun --nproc-per-node), or leave CUDA_VISIBLE_DEVICES "
                         "unset")
    torch.cuda.set_device(index)
    return index


def rank_run_dir(dp: DataParallel, run_dir: Path | None) -> Path:
    """This rank's run directory: rank 0's ``run_dir`` (the only one read), or ``RUN_DIR/rank{r}`` for rank r > 0."""
    if not dp.enabled:
        assert run_dir is not None
        return run_dir
    import torch.distributed as dist

    shared = [str(run_dir) if dp.rank == 0 else None]
    dist.broadcast_object_list(shared, src=0, group=dp.group)
    return Path(shared[0]) if dp.rank == 0 else Path(shared[0]) / f"rank{dp.rank}"


def agree_on_checkpoint(dp: DataParallel, run_dir: Path, ckpt: Path | None, *,
                        sharded: bool = False) -> tuple[Path | None, Path | None]:
    """A data-parallel resume: ``(this rank's checkpoint, the checkpoint whose model/ and critic/ it loads)``.
    Every rank resumes the same step (the oldest of the ranks' newest intact checkpoints: a kill can leave rank 0
    one checkpoint ahead) and loads rank 0's weights (DDP replicas are identical; rank r > 0 saves none, since
    transformers' ``save_pretrained`` writes weights on rank 0 only), checked against rank 0's manifest, so rank 0's
    run directory must be readable by every rank. ``sharded`` (``distributed.strategy=fsdp2``): rank 0's checkpoint
    records how many ranks wrote it (``dcp/sharded.json``, credo.train.dcp_checkpoint); on another number of ranks
    every rank resumes rank 0's newest intact checkpoint, trainer state included (:func:`_reshard_agreement`). A
    collective: every rank calls it; a problem on any rank is raised on all of them (docs/distributed.md,
    "Resuming a torchrun run" and "Resuming an FSDP2 run")."""
    if not dp.enabled:
        if ckpt is not None and (problem := _more_ranks(dp, Path(run_dir), ckpt.name)):
            raise ValueError(problem)
        return ckpt, ckpt
    import torch.distributed as dist

    from credo.train.checkpoint import CKPT_DIR, checkpoint_problem

    mine = (None if ckpt is None else ckpt.name, _written_by(ckpt) if sharded and dp.rank == 0 else None)
    gathered: list = [None] * dp.world_size
    dist.all_gather_object(gathered, mine, group=dp.group)
    names, written = [n for n, _ in gathered], gathered[0][1]
    if all(n is None for n in names):
        return None, None
    leader_dir = Path(run_dir) if dp.rank == 0 else Path(run_dir).parent
    missing = [r for r, n in enumerate(names) if n is None]
    name = problem = None
    if sharded and names[0] is not None and isinstance(written, int) and written != dp.world_size:
        name, problem = _reshard_agreement(dp, leader_dir, names[0], written)
        own = leader = leader_dir / CKPT_DIR / name
    elif sharded and names[0] is not None and not isinstance(written, int):
        problem = f"cannot resume {leader_dir / CKPT_DIR / names[0]}: {written}"
    elif missing:
        problem = (f"cannot resume: rank(s) {missing} have no intact checkpoint, the others have "
                   f"{sorted(set(n for n in names if n))} (was the run started on fewer ranks? resume it with the "
                   f"same torchrun --nproc-per-node)")
    else:
        name = min(names, key=lambda n: int(n.split("_")[-1]))
        own = Path(run_dir) / CKPT_DIR / name
        leader = leader_dir / CKPT_DIR / name
        problem = checkpoint_problem(own) if own != ckpt else None
        if problem is None and dp.rank == 0 and not sharded:  # FSDP2 checkpoints record their world size
            problem = _more_ranks(dp, Path(run_dir), name)
        if problem is None and dp.rank > 0:
            problem = _leader_problem(dp, leader, leader_dir)
    problems: list = [None] * dp.world_size
    dist.all_gather_object(problems, problem, group=dp.group)
    first = next((p for p in problems if p is not None), None)
    if first is not None:
        raise FileNotFoundError(first)
    if name != names[dp.rank]:
        log.warning("resuming from %s: the newer checkpoint of rank(s) %s, which the others did not write, is "
                    "not used", name, [r for r, n in enumerate(names) if n != name])
    return own, leader


def _leader_problem(dp: DataParallel, leader: Path, leader_dir: Path) -> str | None:
    """Why rank ``dp.rank`` cannot use rank 0's checkpoint ``leader``, or None."""
    from credo.train.checkpoint import checkpoint_problem

    problem = checkpoint_problem(leader)
    if problem is None:
        return None
    return (f"rank {dp.rank} cannot load rank 0's weights ({problem}); every rank loads rank 0's checkpoint: "
            f"{leader_dir} must be on a filesystem that every rank reads")


def _written_by(ckpt: Path | None) -> int | str | None:
    """How many ranks wrote the sharded state of rank 0's checkpoint ``ckpt``, or why it has none."""
    from credo.train.dcp_checkpoint import DCP_DIR, ShardedStateError, saved_world_size

    if ckpt is None:
        return None
    try:
        return saved_world_size(ckpt / DCP_DIR)
    except ShardedStateError:
        return (f"it holds no sharded model and optimizer state ({DCP_DIR}/, written by a credo before FSDP2 "
                f"checkpoints were resumable); `credo export` it and start a new run from its weights")


def _reshard_agreement(dp: DataParallel, leader_dir: Path, name: str, written: int) -> tuple[str, str | None]:
    """An FSDP2 checkpoint written by ``written`` ranks, resumed on ``dp.world_size``: every rank takes rank 0's
    newest intact checkpoint ``name`` (its trainer state included: the prompt sampler, scheduler, RNG and counters
    are the run's global position; the sharded state is resharded when loaded). Returns ``(name, problem)``."""
    from credo.train.checkpoint import CKPT_DIR

    if dp.rank == 0:
        log.warning("resuming %s, written by %d ranks, on %d: the model and optimizer state are resharded and every "
                    "rank continues from rank 0's trainer state (docs/distributed.md, \"Resuming an FSDP2 run\")",
                    name, written, dp.world_size)
    return name, (_leader_problem(dp, leader_dir / CKPT_DIR / name, leader_dir) if dp.rank > 0 else None)


def _more_ranks(dp: DataParallel, run_dir: Path, name: str) -> str | None:
    """Why rank 0's checkpoint ``name`` cannot be resumed on ``dp.world_size`` ranks: a rank at or past that
    number (``RUN_DIR/rank{r}``) wrote the same checkpoint, so the run had more ranks (each rank's sampler, RNG
    and rollout streams are its own: resharding them is not implemented)."""
    from credo.train.checkpoint import CKPT_DIR

    written = dp.world_size
    while (run_dir / f"rank{written}" / CKPT_DIR / name).is_dir():
        written += 1
    if written == dp.world_size:
        return None
    return (f"{run_dir / CKPT_DIR / name} was written by a run on {written} ranks; resuming it on {dp.world_size} "
            f"is not supported: relaunch with torchrun --nproc-per-node {written} (or `credo export` it and start "
            f"a new run from its weights)")


def shutdown(dp: DataParallel) -> None:
    if dp.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
