"""``distributed.backend=ray``: Ray places the trainer ranks; the ranks run the recipe (SPMD, as under torchrun).

The driver (the ``credo train`` process) joins or starts a Ray cluster, prepares the run directory, and starts
``distributed.world_size`` :class:`TrainerRank` actors. The ranks join one torch.distributed process group (gloo on
CPU, nccl on GPU; rank 0's node address and a free port as the rendezvous) and each runs the same recipe function
the single-process path runs, with its :class:`DataParallel`. Rank 0 is the leader: it builds the Ray rollout and
reward pools (:mod:`credo.distributed.ray_pools`), collects each step's rollouts and evaluations through them,
and broadcasts them to the other ranks (:func:`credo.distributed.rollout.from_leader`); every rank then computes
the update on its share of the rows and the gradients are summed (:mod:`credo.distributed.data_parallel`).
After each update the leader ships the new weights to the rollout workers with the policy version.

Paths are resolved on the driver and the ranks work in the driver's directory, so relative paths in the config
mean what they mean on the command line (on several nodes they must name a shared file system).
"""
from __future__ import annotations

import logging
import math
import os
import socket
from pathlib import Path
from typing import Any, Callable

from credo.distributed.data_parallel import DataParallel

log = logging.getLogger(__name__)

Entry = Callable[[Any, Path, bool, DataParallel], Path]


def connect(cfg) -> bool:
    """Join ``distributed.ray_address`` or start a private local instance; True if this call connected (and
    the caller disconnects at the end)."""
    from credo.distributed.ray_pools import _ray

    ray = _ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    d = cfg.distributed
    if d.ray_address is None:
        needed = d.worker_cpus * (d.world_size + d.rollout_workers + d.reward_workers)
        ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(needed)), include_dashboard=False,
                 log_to_driver=True)
    else:
        ray.init(address=d.ray_address, log_to_driver=True)
    return True


def train_on_ray(cfg, run_dir: Path, resume: bool, entry: Entry) -> Path:
    """Run ``entry(cfg, run_dir, resume, dp)`` on every trainer rank; returns rank 0's run directory."""
    from credo.distributed.ray_pools import _ray

    ray = _ray()
    d = cfg.distributed
    connected = connect(cfg)
    ranks: list[Any] = []
    try:
        actor = ray.remote(num_cpus=d.worker_cpus, num_gpus=d.trainer_gpus, max_restarts=0)(TrainerRank)
        ranks = [actor.remote(r, d.world_size) for r in range(d.world_size)]
        addr, port = ray.get(ranks[0].rendezvous.remote())
        log.info("ray: %d trainer ranks (rendezvous %s:%d), %d rollout workers, %d reward workers",
                 d.world_size, addr, port, d.rollout_workers, d.reward_workers)
        runs = [a.run.remote(entry, cfg, str(Path(run_dir).resolve()), resume, addr, port, os.getcwd())
                for a in ranks]
        return Path(_first_failure_or_all(ray, runs)[0])
    finally:
        for a in ranks:
            ray.kill(a, no_restart=True)
        if connected:
            ray.shutdown()


def _first_failure_or_all(ray, refs: list[Any]) -> list[Any]:
    """Every result; the first rank that raised fails the run at once (its peers would wait on it forever)."""
    pending, results = list(refs), {}
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        results[done[0]] = ray.get(done[0])  # raises the rank's exception (a RayTaskError wrapping it)
    return [results[r] for r in refs]


class TrainerRank:
    """One data-parallel trainer rank in a Ray actor."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port for the process group's TCP store (called on rank 0)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def run(self, entry: Entry, cfg, run_dir: str, resume: bool, addr: str, port: int, cwd: str) -> str:
        import torch
        import torch.distributed as dist

        os.chdir(cwd)
        logging.basicConfig(level=logging.INFO if self.rank == 0 else logging.WARNING,
                            format=f"%(levelname)s [rank {self.rank}] %(name)s: %(message)s")
        comm = cfg.distributed.comm
        comm = comm if comm != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(comm, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                world_size=self.world_size)
        try:
            return str(entry(cfg, Path(run_dir), resume, DataParallel(self.rank, self.world_size)))
        finally:
            dist.destroy_process_group()
