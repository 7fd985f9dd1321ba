"""Sharded single-turn rollouts for the torchrun data-parallel mode (``distributed.rollout=shard``).

Every rank draws the same global prompt batch from an identically seeded sampler and generates and scores only
its prompts (``rank``, ``rank + world_size``, ...); the ranks then exchange their trajectories and rewards, so
every rank trains on the same whole batch (groups in rank order, ids renumbered). Generation and reward work
divide by the number of ranks; the sampled tokens differ from a one-process run's (each rank's sampler stream
covers only its prompts), so this mode is compared with the single process statistically, not token by token.
Group filtering (``rollout.collector.filter_groups``) and agent episodes keep replicated rollouts.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, TypeVar

from credo.train.data_parallel import DataParallel
from credo.train.stats import rollout_metrics
from credo.types import Rollouts

T = TypeVar("T")


class ShardedSampler:
    """This rank's share of each global prompt batch; checkpoints hold the shared sampler's state."""

    def __init__(self, inner: Any, dp: DataParallel) -> None:
        self.inner = inner
        self.dp = dp

    def next_batch(self, n: int):
        return self.inner.next_batch(n)[self.dp.rank :: self.dp.world_size]

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def gather_rollouts(rollouts: Rollouts, dp: DataParallel) -> Rollouts:
    """Every rank's trajectories and rewards, on every rank, in rank order, group ids made unique."""
    import torch.distributed as dist

    parts: list[Any] = [None] * dp.world_size
    dist.all_gather_object(parts, (rollouts.trajs, rollouts.results), group=dp.group)
    trajs, results, offset = [], [], 0
    for ts, rs in parts:
        trajs += [dataclasses.replace(t, group_id=t.group_id + offset) for t in ts]
        results += rs
        offset += max((t.group_id for t in ts), default=-1) + 1
    metrics = {**rollouts.metrics, **rollout_metrics(trajs, results), "dist/local_sequences": len(rollouts.trajs)}
    return Rollouts(trajs, results, metrics, sampling=rollouts.sampling)


def from_leader(dp: DataParallel, leader_only: bool, fn: Callable[[], T]) -> T:
    """``fn()`` on every rank, or (``leader_only``: Ray mode, where rank 0 alone talks to the rollout and reward
    pools) on rank 0 only, its result broadcast to the other ranks. Every rank calls this at the same point of
    the recipe, so the broadcasts pair up."""
    if not (leader_only and dp.enabled):
        return fn()
    import torch.distributed as dist

    box: list[Any] = [fn() if dp.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=dp.group)
    return box[0]
