"""Data-parallel policy / critic updates over torch.distributed, exact across ranks.

Every rank holds the whole mini-batch (replicated or gathered rollouts, :mod:`credo.distributed.rollout`),
computes the aggregation normalisers from all of it (:class:`credo.algo.AggNorm`: global token and sequence
counts, so no all-reduce is needed for them), and runs the forward / backward of its own rows
``rank::world_size`` only. Each rank's loss is then its share of the global loss, so the global gradient is the
**sum** of the ranks' gradients, which :meth:`DataParallel.reduce_grads` forms with one all-reduce per optimizer
step (after all micro-batches). Every rank then clips and steps the same summed gradient and stays identical to
the others.

This is DDP's arithmetic (gradient all-reduce) without DDP's module wrapper: credo's forward calls the backbone
and the output head separately (chunked log-probs), which DDP's reducer does not see, and a rank may have no
rows to run (all its rows skipped, or fewer micro-batches than another), which DDP's per-backward hooks would
turn into a hang. There is no compute / communication overlap. The sharded variant (``distributed.strategy=fsdp2``)
is :mod:`credo.train.fsdp`; the same loop drives it through :meth:`DataParallel.lockstep` and
:meth:`DataParallel.backward_factor`.

``LOCAL`` (one process) makes every method a no-op, so the update loops have one code path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from credo.train.fsdp import is_sharded
from credo.types import TrainBatch


# per-optimizer-step losses of the policy update (each rank reports its share; shares sum to the loss)
LOSS_KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/sft_loss")


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    world_size: int = 1
    group: Any = None  # a torch.distributed process group; None = the default group

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def shard(self, batch: TrainBatch) -> TrainBatch:
        """This rank's rows of a mini-batch: rows ``rank``, ``rank + world_size``, ..."""
        if not self.enabled:
            return batch
        return batch.select(torch.arange(self.rank, batch.batch_size, self.world_size))

    def lockstep(self, model: torch.nn.Module) -> bool:
        """Whether every backward through ``model`` is a collective (sharded with FSDP2,
        :mod:`credo.train.fsdp`): the ranks must then run the same number of backwards."""
        return self.enabled and is_sharded(model)

    def backward_factor(self, model: torch.nn.Module) -> float:
        """What a rank's loss is multiplied by before the backward: FSDP2 averages gradients over the ranks, the
        sum is wanted (each rank's loss is its share of the global loss)."""
        return float(self.world_size) if self.lockstep(model) else 1.0

    def max_over_ranks(self, n: int) -> int:
        if not self.enabled:
            return n
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t)

    def reduce_grads(self, model: torch.nn.Module) -> None:
        """Sum every trainable parameter's gradient over the ranks (missing gradients count as zeros). A sharded
        (FSDP2) model's gradients were reduce-scattered by its backward already."""
        if not self.enabled or is_sharded(model):
            return
        import torch.distributed as dist

        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def sum_scalars(self, values: dict[str, float], keys: tuple[str, ...] = LOSS_KEYS) -> dict[str, float]:
        """Sum per-rank scalars (each rank's share of a loss) over the ranks. Every rank passes the same ``keys``;
        a key no rank reported is left out (a rank whose rows were all skipped reports none)."""
        if not self.enabled:
            return values
        import torch.distributed as dist

        extra = set(values) - set(keys)
        if extra:
            raise KeyError(f"sum_scalars: {sorted(extra)} not among the keys every rank sums: {keys}")
        t = torch.tensor([[float(values.get(k, 0.0)), float(k in values)] for k in keys], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return {k: float(t[i, 0]) for i, k in enumerate(keys) if t[i, 1] > 0}


LOCAL = DataParallel()
