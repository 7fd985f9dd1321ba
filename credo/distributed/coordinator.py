"""The rollout side of a run's distributed mode, behind one object the recipe's step calls the same way in every
mode (:class:`RolloutCoordinator`):

- leader / follower collection (``distributed.backend=ray`` with several ranks): rank 0 alone talks to the rollout
  and reward pools and broadcasts what it got (:func:`credo.distributed.rollout.from_leader`);
- sharded rollouts (``distributed.rollout=shard``): each rank generates its share of the prompts, then all gather;
- engine weight sync: the engine serves the trainer's weights as policy ``version`` (``served_version``);
- one-step-off mode (``rollout.one_step_off``): the next step's rollouts are generated in the background while
  this step updates (:class:`credo.collect.group.Prefetch`), saved with checkpoints when in flight;
- bounded staleness (``rollout.max_staleness`` K >= 2, or ``rollout.partial``): up to K batches generated ahead
  by a background pipeline (:class:`credo.distributed.staleness.AsyncPipeline`); every async step logs the
  staleness of its tokens (``rollout/staleness_*``);
- FSDP2 (``distributed.strategy=fsdp2``): the sharded policy and its whole-weights replica for saving.

Collective order: every rank calls :meth:`collect`, :meth:`evaluate`, :meth:`leader`, :meth:`sync` and
:meth:`plain_model` at the same points of the recipe, and each makes its collectives in the order the recipe
made them before (weight gather for the sync, then the leader's broadcast, then the shard gather).
"""
from __future__ import annotations

import contextlib

import copy
from typing import Any, Callable, TypeVar

from credo.collect.group import Prefetch
from credo.types import Rollouts
from credo.train.data_parallel import DataParallel
from credo.models.lora import is_lora, load_adapter_state
from credo.train.fsdp import full_adapter_state, full_state_dict, is_sharded, shard_policy
from credo.distributed.rollout import ShardedSampler, from_leader, gather_rollouts
from credo.distributed.staleness import AsyncPipeline, StalenessSchedule, snapshot, staleness_metrics
from credo.guards.weights import check_weight_sync

T = TypeVar("T")


class RolloutCoordinator:
    """Collection, weight sync, prefetch and the FSDP2 replica of one rank (module docstring). Built with
    :meth:`of`; :meth:`attach` gives it the run's policy, engine, runner and collector."""

    def __init__(self, dp: DataParallel, *, ray: bool = False, shard: bool = False, one_step_off: bool = False,
                 steps: int = 0, schedule: StalenessSchedule | None = None,
                 recompute_kv: bool = False) -> None:
        self.dp, self.ray, self.shard, self.one_step_off, self.steps = dp, ray, shard, one_step_off, steps
        # K >= 2 or partial rollouts: the pipeline (created at the first use); K = 1 alone keeps the Prefetch
        self.schedule = schedule if schedule is not None and (schedule.k >= 2 or schedule.partial) else None
        self.max_staleness = schedule.k if schedule is not None else int(one_step_off)
        self.recompute_kv, self.pipe = recompute_kv, None
        self.leader_only = ray and dp.enabled  # Ray mode with several ranks: rank 0 collects and broadcasts
        self.model = self.engine = self.runner = self.collector = None
        self.pending: Prefetch | None = None  # one-step-off mode: the next step's rollouts, being generated
        self.ready: Rollouts | None = None  # one-step-off mode: the batch sync_weights finished, for collect
        self.served_version = -1  # the policy version the rollout engine serves
        self.guards = None  # credo.guards.Guards (attach)
        self.sampled = None  # credo.rollout.counting.SampledTokens (attach)
        self.replica = None  # FSDP2: an unsharded copy of the policy, loaded with the whole weights to save them

    @classmethod
    def of(cls, cfg, dp: DataParallel, *, shardable: bool) -> "RolloutCoordinator":
        """The mode of ``cfg.distributed`` / ``cfg.rollout``; ``shardable``: the collector's rollouts may be split
        over the ranks (not agent episodes, not filtered groups). The modes credo does not implement were refused
        when the config was loaded (:func:`credo.distributed.validate.check_async`)."""
        ray = cfg.distributed.backend == "ray"
        r = cfg.rollout
        schedule = StalenessSchedule(r.max_staleness, r.partial, r.max_new_tokens) if r.max_staleness else None
        return cls(dp, ray=ray, shard=dp.enabled and not ray and cfg.distributed.rollout == "shard" and shardable,
                   one_step_off=r.one_step_off, steps=cfg.train.steps, schedule=schedule,
                   recompute_kv=r.partial_kv == "recompute")

    @property
    def follower(self) -> bool:
        """Ray mode, rank > 0: no engine and no runner here (rank 0 drives the pools)."""
        return self.ray and self.dp.rank > 0

    def engine_seed(self, seed: int) -> int:
        """Sharded ranks sample different prompts with their own random streams."""
        return seed + (1_000_003 * self.dp.rank if self.shard else 0)

    def sampler(self, sampler):
        """This rank's view of the prompt sampler: its share of each batch when sharded."""
        return ShardedSampler(sampler, self.dp) if self.shard else sampler

    def attach(self, *, model, engine, runner, collector, guards=None, sampled=None) -> None:
        self.model, self.engine, self.runner, self.collector = model, engine, runner, collector
        self.guards = guards  # credo.guards.Guards: the weight_sync guard runs after every sync
        self.sampled = sampled  # credo.rollout.counting.SampledTokens: each collection's count travels with it

    # ------------------------------------------------------------------ the step

    def sync_weights(self, step: int, timer) -> None:
        """Step ``step``'s weight sync: the rollout engine serves the policy the previous steps trained, as version
        ``step`` (the RL step's first line, credo/recipes/step.py). One-step-off mode: the batch in flight (generated
        by the previous policy while the previous step updated) is finished first. Bounded staleness: version
        ``step`` is published to the pipeline (every rank: an FSDP2 gather), which loads it where its schedule
        says. A collective: every rank calls it at the same point."""
        if self.schedule is not None:
            self.pipeline().publish(step, snapshot(self.model))
            return
        if self.pending is not None:  # the engine is idle after this
            self.ready, self.pending = self.pending.wait(timer), None
        self.sync(step)

    def collect(self, step: int, timer) -> Rollouts:
        """This step's rollouts (after :meth:`sync_weights`). One-step-off mode: the batch finished by the sync, and
        the next batch starts generating now, overlapping this step's update. Bounded staleness: this step's batch
        (sampled by policy max(0, step - K), or under partial rollouts by the versions of its decode steps) is taken
        from the pipeline, batches up to step + K queued. Ray mode: rank 0 collects, the other ranks receive."""
        if self.schedule is not None:
            return self._collect_pipelined(step, timer)
        if self.pending is not None or self.served_version != step:
            raise RuntimeError(f"collect({step}) before sync_weights({step}): the engine would sample with weights "
                               f"of another policy version")
        ready, self.ready = self.ready, None

        def leader() -> Rollouts:
            rollouts = ready if ready is not None else self._collect(step, timer)
            if self.one_step_off and step + 1 < self.steps:
                self.pending = Prefetch(lambda t: self._collect(step + 1, t))
            return rollouts

        return self._finish(self.leader(leader), step, timer)

    def _collect_pipelined(self, step: int, timer) -> Rollouts:
        pipe = self.pipeline()

        def leader() -> Rollouts:
            pipe.fill(step)
            with timer("rollout_wait"):  # the trainer waiting for its batch
                return pipe.take(step, timer)

        return self._finish(self.leader(leader), step, timer)

    def _finish(self, rollouts: Rollouts, step: int, timer) -> Rollouts:
        """The shards gathered; an async step's staleness metrics."""
        if self.shard:
            with timer("gather"):
                rollouts = gather_rollouts(rollouts, self.dp)
        if self.max_staleness:
            rollouts.metrics.update(staleness_metrics(rollouts.trajs, step, self.max_staleness))
        return rollouts

    def pipeline(self) -> AsyncPipeline:
        """The bounded-staleness pipeline (after :meth:`attach`)."""
        if self.pipe is None:
            self.pipe = AsyncPipeline(
                self.schedule, engine=self.engine, collector=self.collector, collect=self._collect, steps=self.steps,
                recompute_kv=self.recompute_kv,
                on_load=lambda weights, version: check_weight_sync(self.guards, weights, self.engine, version))
        return self.pipe

    def close(self) -> None:
        """Stop the pipeline's thread (it may wait for a policy version that will not come)."""
        if self.pipe is not None:
            self.pipe.close()

    def _collect(self, step: int, timer) -> Rollouts:
        with self.sampled.scope() if self.sampled is not None else contextlib.nullcontext() as tally:
            rollouts = self.collector.collect(step, timer)
        if tally is not None:  # on whichever thread sampled it (one-step-off, the async pipeline)
            rollouts.metrics["perf/sampled_tokens_collect"] = float(tally.tokens)
        if self.ray:  # workers replaced so far (their shares were re-queued)
            rollouts.metrics["dist/rollout_restarts"] = self.engine.restarts
            if self.runner is not None:
                rollouts.metrics["dist/reward_restarts"] = self.runner.restarts
        return rollouts

    def leader(self, fn: Callable[[], T]) -> T:
        """``fn()`` on every rank, or in Ray mode on rank 0 only, its result broadcast."""
        return from_leader(self.dp, self.leader_only, fn)

    def idle(self) -> None:
        """Wait for the batch in flight (one engine call at a time); the pipeline: until its engine is free."""
        if self.pending is not None:
            self.pending.wait()
        if self.pipe is not None:
            self.pipe.idle()

    def evaluate(self, fn: Callable[[], T], step: int, *, force_sync: bool = False) -> T:
        """``fn()`` (an evaluation through the engine) of policy ``step``: the engine first finishes the batch in
        flight and serves the current weights; rank 0's result in Ray mode."""
        self.idle()
        # the pipeline's thread loads its versions without sync(): served_version may be out of date
        self.sync(step, force=force_sync or self.pipe is not None)
        return self.leader(fn)

    def sync(self, version: int, *, force: bool = False) -> None:
        """The rollout engine serves the trainer's current weights as policy ``version`` (shipped to Ray rollout
        workers; an in-process engine on the trainer's own module only takes the version). Every rank calls it at
        the same points: a sharded (FSDP2) policy's whole weights are gathered by all of them."""
        if not force and self.served_version == version:
            return
        weights = self.model
        if is_sharded(self.model):  # a LoRA policy: its replica with the gathered adapters (only they travel)
            weights = self.plain_model() if is_lora(self.model) else full_state_dict(self.model)
        if self.engine is not None:
            self.engine.update_weights(weights, version=version)
            check_weight_sync(self.guards, weights, self.engine, version)  # the engine serves what was trained
        self.served_version = version

    # ------------------------------------------------------------------ FSDP2

    def shard_policy(self, mixed_precision: str = "none", offload: bool = False) -> None:
        """Shard the policy in place over the ranks, keeping a whole replica to save it from (``mixed_precision``:
        train.mixed_precision, FSDP2's MixedPrecisionPolicy; ``offload``: train.optimizer_offload, its
        CPUOffloadPolicy)."""
        self.replica = copy.deepcopy(self.model)
        shard_policy(self.model, self.dp.world_size, mixed_precision, offload=offload)

    def plain_model(self):
        """The policy as one module with whole weights, for saving: the model itself, or for a sharded (FSDP2)
        policy its replica loaded with the gathered weights (a collective: every rank calls it at the same
        point). A LoRA policy's replica receives the gathered adapters only."""
        if not is_sharded(self.model):
            return self.model
        if is_lora(self.model):  # the base is frozen: the replica's copy of it is current, the adapters alone move
            load_adapter_state(self.replica, full_adapter_state(self.model))
        else:
            self.replica.load_state_dict(full_state_dict(self.model))
        return self.replica

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The engine's state and, in one-step-off mode, the batch in flight, finished (its prompts are drawn, the
        sampler's state advanced), so that a resumed run trains on it as the uninterrupted run would. Call it
        before saving the collector's state."""
        pending = self.pending.wait() if self.pending is not None else None
        pipeline = self.pipeline().state_dict() if self.schedule is not None and not self.follower else None
        return {"engine": self.engine.state_dict() if self.engine is not None else None, "pending_rollouts": pending,
                "async_pipeline": pipeline}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` from a trainer state in the current layout (credo.train.migrate)."""
        if self.engine is not None:
            self.engine.load_state_dict(saved["engine"])
        if saved["pending_rollouts"] is not None:
            self.pending = Prefetch(done=saved["pending_rollouts"])
        if saved["async_pipeline"] is not None and self.schedule is not None:
            self.pipeline().load_state_dict(saved["async_pipeline"])

