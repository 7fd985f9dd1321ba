"""RL with verifiable rewards: the training recipe, top to bottom.

    train(cfg)                                   # set up: data, policy (+ LoRA), the run's pieces (build_parts)
      start(...) | restore(...)                  # a new run's warm start and step-0 evaluation, or a checkpoint
      rl_loop(...)                               # for each step:
        metrics = rl_step(cfg, parts, state)     #   credo/recipes/step.py: sync, collect, collate, passes,
                                                 #   rewards, advantages, critic and policy updates, metrics
        eval when due; metrics.jsonl row; checkpoint when due (or on a preemption signal)
      final/ and summary.json

Which collector, estimator, loss, loss terms and batch transforms run is configuration, built once
(credo/recipes/stages.py) from what the packages that own them registered; the recipe never branches on a method.
The distributed mode (leader-only collection, sharded rollouts, weight sync, one-step-off prefetch, the FSDP2
replica) sits behind :class:`credo.distributed.coordinator.RolloutCoordinator`.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from credo.config import RunConfig
from credo.data.sampler import prompt_sampler
from credo.data.source import TaskData, drop_overlong, format_prompts, model_context
from credo.train.data_parallel import DataParallel
from credo.train.activation_checkpointing import enable_activation_checkpointing
from credo.distributed.coordinator import RolloutCoordinator
from credo.distributed.launch import agree_on_checkpoint, init_data_parallel, rank_run_dir, shutdown
from credo.guards import Guards
from credo.guards.weights import weights_digest
from credo.models import ValueModel, load_model, load_or_build, num_parameters
from credo.models.vision import expand_image_prompts
from credo.recipes.common import (load_data, metrics_logger, prepare_run_dir, reward_runner, rollout_engine, run_eval,
                                  save_final, process_setup, warm_start, warm_start_enabled, write_summary)
from credo.recipes.budget import add_spend, finished
from credo.recipes.lora_stage import lora_policy
from credo.recipes.preemption import Preempted, StopSignals
from credo.recipes.stages import (COLLECTOR_KEY, build_collector, build_plan, load_reference,
                                  needs_critic, new_critic, save_reference, shardable)
from credo.recipes.step import rl_step
from credo.tracking.metrics import MetricsLogger
from credo.tracking.progress import StepProgress
from credo.train.checkpoint import load_trainer_state, resume_checkpoint, rng_state, save_checkpoint, set_rng_state
from credo.train.dcp_checkpoint import DCP_DIR, load_sharded, saved_world_size, sharded_writer
from credo.train.fsdp import is_sharded
from credo.train.migrate import FORMAT_VERSION, migrate_trainer_state
from credo.train.mixed_precision import load_scaler_state, scaler_state
from credo.train.optim import build_optimizer, build_scheduler
from credo.train.plan import StepPlan
from credo.tracking.timer import Timer
from credo.rollout.counting import SampledTokens
from credo.train.transforms import BuildContext, build_transforms
from credo.types import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """What a checkpoint restores besides models, optimizers and the collector's state."""

    step: int = 0
    start_eval: dict[str, float] = field(default_factory=dict)  # held-out metrics before RL
    last_eval: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0  # training wall time summed over (resumed) segments
    bad_rows: int = 0  # malformed dataset rows skipped
    entropy_history: list[float] = field(default_factory=list)  # batch-mean entropy per step
    sampled_tokens: int = 0  # response tokens the engine sampled for training (credo.recipes.budget)
    trained_tokens: float = 0.0  # response tokens in the update batches
    start_weights: str = ""  # digest of the policy's weights when RL starts (credo compare: same start across arms)


@dataclass
class Parts:
    """The live objects of a run (built once, shared by the loop's steps)."""

    model: Any
    tokenizer: Any
    engine: Any  # a RolloutEngine (HFRolloutEngine, or credo.distributed's RolloutPool); None on Ray follower ranks
    runner: Any  # RewardRunner / RewardPool; None for agent RL and on Ray follower ranks
    optimizer: torch.optim.Optimizer
    scheduler: Any
    data: TaskData
    logger: MetricsLogger
    collector: Any  # credo.collect.base.Collector (credo.recipes.stages.build_collector)
    transforms: tuple  # the enabled batch transforms (credo.train.transforms), in phase order
    plan: StepPlan  # which passes the steps run (credo.train.plan)
    rollout: RolloutCoordinator  # collection, weight sync and the policy replica in the distributed mode
    dp: DataParallel  # data-parallel split of the updates (credo.distributed)
    ref_model: Any = None  # frozen reference policy when a KL term needs one
    critic: ValueModel | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    critic_scheduler: Any = None
    guards: Guards = field(default_factory=Guards)  # the runtime guards (credo.guards), their counters in every step
    sampled: SampledTokens = field(default_factory=SampledTokens)  # the engine's sampled tokens (credo.recipes.budget)


# ============================================================================ entry point

def train(cfg: RunConfig, *, run_dir: Path | None = None, resume: bool = False, overwrite: bool = False) -> Path:
    """Run (or resume) RL training; returns the run directory. A new run refuses a run directory that holds files
    unless ``overwrite`` (credo.recipes.common.prepare_run_dir)."""
    if cfg.distributed.backend == "ray":  # Ray places the ranks; each runs _train (credo.distributed.ray_launch)
        from credo.distributed.ray_launch import train_on_ray

        return train_on_ray(cfg, prepare_run_dir(cfg, run_dir, resume, overwrite), resume,
                            functools.partial(_train, prepared=True))
    dp = init_data_parallel(cfg)
    try:
        return _train(cfg, run_dir, resume, dp, overwrite=overwrite)
    finally:
        shutdown(dp)


def _train(cfg: RunConfig, run_dir: Path | None, resume: bool, dp: DataParallel, *, overwrite: bool = False,
           prepared: bool = False) -> Path:
    """One process's run. With data parallelism every rank runs this whole recipe on the same seed (the same prompt
    batches; rollouts sharded over the ranks or replicated, ``distributed.rollout``) and the updates split the
    rows over the ranks (``parts.dp``)."""
    if dp.rank == 0 and not prepared:  # prepared: by train() before the Ray ranks started
        run_dir = prepare_run_dir(cfg, run_dir, resume, overwrite)
    run_dir = rank_run_dir(dp, run_dir if dp.rank == 0 else None)
    if dp.rank > 0:  # rank r's own logs and checkpoints, under rank 0's run directory
        run_dir = prepare_run_dir(cfg, run_dir, resume)
    process_setup(cfg)
    data = load_data(cfg, cfg.seed)
    ckpt = resume_checkpoint(run_dir) if resume else None  # the newest intact one (damaged ones are skipped)
    # data parallel: the same step on every rank, and rank 0's weights (rank r > 0 saves none)
    sharded = cfg.distributed.strategy == "fsdp2"  # its model and optimizer state are sharded (dcp/, resharded)
    ckpt, weights = agree_on_checkpoint(dp, run_dir, ckpt, sharded=sharded) if resume else (None, None)
    if resume and ckpt is None:
        raise FileNotFoundError(f"no complete, intact checkpoint in {run_dir}/checkpoints (the run stopped before "
                                f"its first checkpoint?); start it again in the same folder with: credo train "
                                f"--config {run_dir}/config.yaml --run-dir {run_dir} --overwrite")
    model, tokenizer, fresh = (load_model(weights / "model", cfg.model) + (False,)) if ckpt else \
        load_or_build(cfg.model, seed=cfg.seed)
    if cfg.rollout.collector.type != "agent":  # single-turn prompts (agent episodes build theirs from the envs)
        data = format_prompts(data, tokenizer, template=cfg.task.prompt_template, chat=cfg.task.chat_template)
        data = expand_image_prompts(data, model)  # image examples: <image> widened to the model's image tokens
        data = drop_overlong(data, tokenizer, cfg.task, context=model_context(model),
                             max_new_tokens=cfg.rollout.max_new_tokens)
    model, fresh = lora_policy(cfg, model, tokenizer, data, run_dir, fresh=fresh, resumed=ckpt is not None)
    if cfg.train.activation_checkpointing:  # per decoder layer (credo.train.activation_checkpointing)
        enable_activation_checkpointing(model)
    log.info("policy: %s parameters, run dir %s", f"{num_parameters(model):,}", run_dir)
    with contextlib.ExitStack() as stack:
        parts = build_parts(cfg, run_dir, dp, stack, model, tokenizer, data, ckpt)  # a piece that cannot be built fails here
        state = restore(cfg, ckpt, parts, weights) if ckpt else start(cfg, run_dir, parts, fresh)
        parts.ref_model = load_reference(cfg, parts.plan, run_dir, parts.model)
        if sharded:
            shard_policy_of(cfg, parts)
            if ckpt is not None:  # the sharded model and optimizer state, after sharding (resharded if need be)
                restore_sharded(cfg, ckpt, weights, parts)
        rl_loop(cfg, run_dir, state, parts)
        whole = parts.rollout.plain_model()
    save_final(cfg, run_dir, whole, tokenizer)
    write_summary(cfg, run_dir, whole, start_eval=state.start_eval, last_eval=state.last_eval,
                  extra={"steps": state.step, "train_wall_s": round(state.wall_s, 2), "data/bad_rows": state.bad_rows,
                         "sampled_tokens": state.sampled_tokens, "trained_tokens": state.trained_tokens,
                         "start_weights": state.start_weights})
    return run_dir


def build_parts(cfg: RunConfig, run_dir: Path, dp: DataParallel, stack: contextlib.ExitStack, model, tokenizer,
                data: TaskData, ckpt: Path | None) -> Parts:
    """The run's live objects: runner, logger, optimizer, engine, the collector and the batch transforms chosen by
    the config, the step's plan, and the coordinator of the distributed mode (closed by ``stack``)."""
    rollout = RolloutCoordinator.of(cfg, dp, shardable=shardable(cfg))
    runner = None if rollout.follower else stack.enter_context(reward_runner(cfg, data))
    logger = stack.enter_context(metrics_logger(cfg, run_dir, resume_step=_step_of(ckpt) if ckpt else None,
                                                trackers=dp.rank == 0))
    optimizer = build_optimizer(model, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, betas=cfg.train.betas,
                                offload=cfg.train.optimizer_offload and cfg.distributed.strategy != "fsdp2")
    engine, sampled = None, SampledTokens()
    if not rollout.follower:  # Ray mode: rank 0 alone drives the rollout and reward pools
        engine = rollout_engine(cfg, model, tokenizer, seed=rollout.engine_seed(cfg.seed), log_dir=run_dir)
        stack.callback(engine.close)
        sampled.attach(engine)  # train.budget=sampled_tokens counts every call the collectors make
    sampler = rollout.sampler(prompt_sampler(data.train, seed=cfg.seed, curriculum=cfg.task.curriculum))
    guards = Guards(cfg.guards)
    collector = build_collector(cfg, engine=engine, runner=runner, model=model, tokenizer=tokenizer, data=data,
                                sampler=sampler, run_dir=run_dir, guards=guards)
    rollout.attach(model=model, engine=engine, runner=runner, collector=collector, guards=guards, sampled=sampled)
    stack.callback(rollout.close)  # the async pipeline's thread (rollout.max_staleness)
    transforms = build_transforms(BuildContext(cfg, model, tokenizer, run_dir))
    return Parts(model=model, tokenizer=tokenizer, engine=engine, runner=runner, optimizer=optimizer,
                 scheduler=_scheduler(cfg, optimizer), data=data, logger=logger, collector=collector,
                 transforms=transforms, plan=build_plan(cfg, transforms), rollout=rollout, dp=dp,
                 guards=guards, sampled=sampled)


def start(cfg: RunConfig, run_dir: Path, parts: Parts, fresh: bool) -> RunState:
    """A new run: optional SFT warm start, the step-0 evaluation, the collector's start (e.g. a pool collected from
    the warm-started policy), the frozen reference and critic."""
    state = RunState(bad_rows=len(parts.data.bad_rows))
    if warm_start_enabled(cfg, fresh):
        warm_start(cfg, parts.model, parts.tokenizer, parts.data, parts.logger)
    state.start_weights = weights_digest(parts.model)
    state.start_eval = state.last_eval = evaluate_now(cfg, parts, run_dir, 0, force_sync=True)
    parts.logger.log(0, state.start_eval)
    parts.collector.start(run_dir)
    save_reference(cfg, parts.plan, parts.model, parts.tokenizer, run_dir)
    if needs_critic(cfg):
        attach_critic(cfg, parts, new_critic(cfg, parts.model))
    return state


# ============================================================================ the RL loop

def rl_loop(cfg: RunConfig, run_dir: Path, state: RunState, parts: Parts) -> None:
    """The steps, each followed by its metrics row, its evaluation and checkpoint when due, and a check for a
    preemption signal (credo.recipes.preemption: finish the step, checkpoint, stop with exit code 75)."""
    on_signal = cfg.checkpoint.on_signal and cfg.distributed.backend != "ray"
    with StepProgress("rl", cfg.train.steps, state.step, enabled=cfg.log.progress,
                      print_every=cfg.log.print_every) as bar, StopSignals(on_signal) as signals:
        bar.update(state.step, state.last_eval)
        last = finished(cfg, state)  # a resumed run that had already ended
        while not last:  # train.steps, or train.budget reached (credo.recipes.budget): `last` is the only exit
            t0 = time.perf_counter()
            with parts.sampled.scope() as sampled:  # what the step sampled besides its batch (credo.rollout.counting)
                metrics = rl_step(cfg, parts, state, step=state.step)
            state.step += 1
            add_spend(state, metrics, sampled=sampled.tokens + parts.sampled.take_loose(),
                      wall_s=time.perf_counter() - t0)
            last = finished(cfg, state) if cfg.train.budget != "wall_s" else finished_after(cfg, state, t0)
            if eval_due(cfg, state.step, last=last):
                timer = Timer()
                with timer("eval"):
                    state.last_eval = evaluate_now(cfg, parts, run_dir, state.step)
                metrics.update(state.last_eval | timer.metrics())
            state.wall_s += time.perf_counter() - t0
            # the step's row is on disk before its checkpoint exists: a kill in between resumes from the older
            # checkpoint (whose later rows are truncated), never from one whose step has no row
            parts.logger.log(state.step, metrics)
            stop = signals.requested(parts.dp)
            if checkpoint_due(cfg, state.step, last=last) or (stop and not last):
                checkpoint(cfg, run_dir, state, parts)
            bar.update(state.step, metrics)
            if stop and not last:  # the last step goes on to write final/ and the summary
                raise Preempted(f"{stop} after RL step {state.step}: checkpoint step_{state.step:06d} written in "
                                f"{run_dir}; continue with: credo train --resume {run_dir}")


def checkpoint(cfg: RunConfig, run_dir: Path, state: RunState, parts: Parts) -> None:
    """Checkpoint step ``state.step`` (credo.train.checkpoint) and log its duration to checkpoints.jsonl."""
    t_ck = time.perf_counter()
    sharded = None
    if is_sharded(parts.model):  # FSDP2: every rank's shards of the policy and its AdamW state into rank 0's dcp/
        sharded = sharded_writer(parts.model, parts.optimizer, parts.dp.rank, parts.dp.world_size, parts.dp.group)
    save_checkpoint(run_dir, state.step, model=parts.rollout.plain_model(), tokenizer=parts.tokenizer,
                    keep=cfg.checkpoint.keep, trainer_state=trainer_state(state, parts), critic=parts.critic,
                    sharded=sharded)
    parts.logger.log(state.step, {"timing_s/checkpoint": time.perf_counter() - t_ck}, file="checkpoints.jsonl")


def evaluate_now(cfg: RunConfig, parts: Parts, run_dir: Path, step: int, *, force_sync: bool = False) -> dict:
    """Held-out evaluation of the current policy (rank 0's, broadcast, in Ray mode); its tokens are not counted as
    sampled for training."""
    def run() -> dict:
        with parts.sampled.paused():
            return run_eval(cfg, parts.engine, parts.runner, parts.data, run_dir, step=step)
    return parts.rollout.evaluate(run, step, force_sync=force_sync)


def shard_policy_of(cfg: RunConfig, parts: Parts) -> None:
    """distributed.strategy=fsdp2: shard the policy over the ranks (after the warm start, the reference and the
    critic were made from it whole); its optimizer is rebuilt on the shards."""
    parts.rollout.shard_policy(cfg.train.mixed_precision, offload=cfg.train.optimizer_offload)
    parts.optimizer = build_optimizer(parts.model, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                                      betas=cfg.train.betas)
    parts.scheduler = _scheduler(cfg, parts.optimizer)






def attach_critic(cfg: RunConfig, parts: Parts, critic: ValueModel) -> None:
    c = cfg.critic
    parts.critic = critic
    if cfg.train.activation_checkpointing:
        enable_activation_checkpointing(critic)
    parts.critic_optimizer = build_optimizer(critic, lr=c.lr, weight_decay=c.weight_decay, betas=cfg.train.betas)
    parts.critic_scheduler = _scheduler(cfg, parts.critic_optimizer)


def _scheduler(cfg: RunConfig, optimizer):
    return build_scheduler(optimizer, warmup_steps=cfg.train.warmup_steps, total_steps=total_optimizer_steps(cfg),
                           schedule=cfg.train.lr_schedule, min_lr_ratio=cfg.train.min_lr_ratio)


def total_optimizer_steps(cfg: RunConfig) -> int:
    batch = cfg.train.prompts_per_step * cfg.rollout.group_size
    return cfg.train.steps * cfg.train.ppo_epochs * max(batch // (cfg.train.mini_batch_size or batch), 1)


def eval_due(cfg: RunConfig, step: int, *, last: bool = False) -> bool:
    return last or step == cfg.train.steps or (cfg.eval.every > 0 and step % cfg.eval.every == 0)


def checkpoint_due(cfg: RunConfig, step: int, *, last: bool = False) -> bool:
    return last or step == cfg.train.steps or (cfg.checkpoint.every > 0 and step % cfg.checkpoint.every == 0)


def finished_after(cfg: RunConfig, state: RunState, t0: float) -> bool:
    """train.budget=wall_s: whether the step that started at ``t0`` ends the run (its wall time is added to
    ``state.wall_s`` after the evaluation; the decision is taken before it, so the last step is evaluated)."""
    return state.step >= cfg.train.steps or state.wall_s + (time.perf_counter() - t0) >= cfg.train.budget_value


def trainer_state(state: RunState, parts: Parts) -> dict[str, Any]:
    """What :func:`restore` reads back. The coordinator's state first: it finishes a batch in flight, which
    advances the collector's state."""
    saved = parts.rollout.state_dict()
    # FSDP2: the policy's optimizer state is in the checkpoint's dcp/ (credo.train.dcp_checkpoint)
    optimizer = {"sharded": DCP_DIR} if is_sharded(parts.model) else parts.optimizer.state_dict()
    saved |= {"format_version": FORMAT_VERSION, "run": copy.deepcopy(state.__dict__), "optimizer": optimizer, "scheduler": parts.scheduler.state_dict(), "rng": rng_state(),
              COLLECTOR_KEY: parts.collector.state_dict(), "guards": parts.guards.state_dict()}
    scaler = scaler_state(parts.optimizer)  # fp16's loss scale: a resume goes on at the same scale
    if scaler is not None:
        saved["loss_scaler"] = scaler
    if parts.critic is not None:
        saved["critic_optimizer"] = parts.critic_optimizer.state_dict()
        saved["critic_scheduler"] = parts.critic_scheduler.state_dict()
    return saved


def restore(cfg: RunConfig, ckpt: Path, parts: Parts, weights: Path | None = None) -> RunState:
    """Resume from ``ckpt`` (its critic from ``weights``: rank 0's checkpoint of the step in a data-parallel
    run); a trainer state of an older credo is upgraded first (credo.train.migrate)."""
    weights = weights or ckpt
    saved = migrate_trainer_state(load_trainer_state(ckpt), sampling=SamplingParams.of(cfg.rollout))
    sharded = _sharded_optimizer(cfg, ckpt, saved)
    if sharded is None:  # FSDP2: loaded after sharding (restore_sharded)
        parts.optimizer.load_state_dict(saved["optimizer"])
        parts.scheduler.load_state_dict(saved["scheduler"])
    if "loss_scaler" in saved and cfg.train.mixed_precision == "fp16":  # absent before fp16 scalers were saved
        load_scaler_state(parts.optimizer, saved["loss_scaler"], next(parts.model.parameters()).device.type)
    parts.rollout.load_state_dict(saved)
    if sharded is not None:
        _reseed_resharded_engine(cfg, saved_world_size(weights / sharded), saved["run"]["step"], parts)
    parts.collector.load_state_dict(saved[COLLECTOR_KEY])
    if (weights / "critic").is_dir():
        attach_critic(cfg, parts, ValueModel.load(weights / "critic", cfg.model.device))
        parts.critic_optimizer.load_state_dict(saved["critic_optimizer"])
        parts.critic_scheduler.load_state_dict(saved["critic_scheduler"])
    set_rng_state(saved["rng"])
    parts.guards.load_state_dict(saved["guards"])
    log.info("resumed from %s (step %d)", ckpt, saved["run"]["step"])
    state = RunState(**saved["run"])
    parts.rollout.sync(state.step, force=True)  # remote rollout workers start from the checkpoint's weights
    return state


def _sharded_optimizer(cfg: RunConfig, ckpt: Path, saved: dict[str, Any]) -> str | None:
    """The folder of the checkpoint's sharded optimizer state (FSDP2), or None when the trainer state holds it
    whole; a checkpoint of the other strategy is refused in one line."""
    folder = saved["optimizer"].get("sharded") if isinstance(saved["optimizer"], dict) else None
    if (folder is not None) != (cfg.distributed.strategy == "fsdp2"):
        kind = "an FSDP2 (sharded)" if folder is not None else "a whole-model"
        raise ValueError(f"{ckpt} is {kind} checkpoint; resume it with the distributed.strategy that wrote it "
                         f"(now {cfg.distributed.strategy}), or `credo export` it and start a new run")
    return folder


def restore_sharded(cfg: RunConfig, ckpt: Path, weights: Path, parts: Parts) -> None:
    """FSDP2 resume, after :func:`shard_policy_of` rebuilt the optimizer on the shards: the sharded weights and
    optimizer state from rank 0's checkpoint ``weights`` (``dcp/``, resharded when the number of ranks changed,
    credo.train.dcp_checkpoint; the checkpoint passed its manifest check in agree_on_checkpoint), then the
    scheduler of this rank's ``ckpt``."""
    saved = migrate_trainer_state(load_trainer_state(ckpt), sampling=SamplingParams.of(cfg.rollout))
    load_sharded(weights / _sharded_optimizer(cfg, ckpt, saved), parts.model, parts.optimizer)
    parts.scheduler.load_state_dict(saved["scheduler"])


def _reseed_resharded_engine(cfg: RunConfig, written: int, step: int, parts: Parts) -> None:
    """A resume on another number of ranks than the ``written`` that saved the checkpoint restores rank 0's
    trainer state on every rank; with sharded rollouts (each rank samples its share with its own stream) rank
    r > 0 then draws from a stream of its own, seeded by its rank and the ``step``, rather than repeating rank 0's
    (docs/distributed.md, "Resuming an FSDP2 run")."""
    if written == parts.dp.world_size or not parts.rollout.shard or parts.engine is None or parts.dp.rank == 0 \
            or set(parts.engine.state_dict()) != {"generator"}:
        return
    seed = parts.rollout.engine_seed(cfg.seed) + 7_919 * step
    parts.engine.load_state_dict({"generator": torch.Generator().manual_seed(seed).get_state()})


def _step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[-1])
