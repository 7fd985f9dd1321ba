"""RL with verifiable rewards: the training recipe, top to bottom.

    for each step:
        rollouts     = collect_rollouts(engine, runner, sampler, ...)   # credo.rollout + credo.rewards
        old_logprobs = batched_logprobs(model, batch, stats=...)        # credo.train.forward
        values       = batched_values(critic, batch)                    # if a critic is trained
        advantages   = compute_advantages(estimator, ...)               # credo.algo
        update_critic(...); update_policy(...)                          # credo.train.update
        metrics -> metrics.jsonl / TensorBoard; periodic eval; atomic checkpoint

Which estimator, loss, aggregation and recipe pieces run is configuration (``algo.*``,
``critic.*``); the recipe asks the registries what inputs a method needs and never branches on
method names.
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

from credo.algo import advantage_requirements, compute_advantages, kl_penalty, masked_mean, policy_loss_requirements
from credo.algo.advantages import discounted_returns, explained_variance, token_rewards
from credo.algo.critic import critic_loss_requirements
from credo.config import RunConfig
from credo.data import PromptSampler
from credo.data.source import TaskData
from credo.models import ValueModel, load_model, load_or_build, num_parameters, save_model
from credo.recipes.common import (
    is_agent_run,
    load_data,
    prepare_run_dir,
    reward_runner,
    rollout_engine,
    run_eval,
    sampling_params,
    save_final,
    seed_everything,
    training_runner,
    warm_start,
    warm_start_enabled,
    write_summary,
)
from credo.methods.rlep.recipe import collect_at_start, open_replay, replay_step
from credo.train.token_select import select_tokens, vepo_select
from credo.collect.agent import collect_agent_rollouts, reward_tensor, stage_of
from credo.train.batch import collate
from credo.train.checkpoint import load_trainer_state, resume_checkpoint, rng_state, save_checkpoint, set_rng_state
from credo.tracking.dump import rollout_records
from credo.data.source import drop_overlong, format_prompts, model_context
from credo.train.forward import ForwardOptions, batched_logprobs, batched_values
from credo.tracking.metrics import MetricsLogger
from credo.train.optim import build_optimizer, build_scheduler
from credo.tracking.progress import StepProgress
from credo.methods.rlep.pool import replay_rows
from credo.collect.group import Prefetch, Rollouts, collect_rollouts
from credo.train.stats import Timer
from credo.methods.attnrl.collector import collect_tree_rollouts, fci_model
from credo.train.update import update_critic, update_policy
from credo.distributed import LOCAL, DataParallel
from credo.distributed.fsdp import full_state_dict, is_sharded, shard_policy
from credo.distributed.launch import init_data_parallel, rank_run_dir, shutdown
from credo.distributed.rollout import ShardedSampler, from_leader, gather_rollouts
from credo.types import SamplingParams, TrainBatch

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """What a checkpoint restores besides models and optimizers."""

    step: int = 0
    start_eval: dict[str, float] = field(default_factory=dict)  # held-out metrics before RL
    last_eval: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0  # training wall time summed over (resumed) segments
    bad_rows: int = 0  # malformed dataset rows skipped
    entropy_history: list[float] = field(default_factory=list)  # batch-mean entropy per step
    attnrl: dict[str, Any] = field(default_factory=dict)  # AttnRL: dynamic batch size, running FCI mean (train.tree)


@dataclass
class Parts:
    """The live objects of a run (built once, shared by the loop's steps)."""

    model: Any
    tokenizer: Any
    engine: Any  # a RolloutEngine (HFRolloutEngine, or credo.distributed's RolloutPool); None on Ray follower ranks
    runner: Any  # RewardRunner / RewardPool; None for agent RL and on Ray follower ranks
    sampler: PromptSampler | ShardedSampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    data: TaskData
    logger: MetricsLogger
    ref_model: Any = None  # frozen reference policy when a KL term needs one
    critic: ValueModel | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    critic_scheduler: Any = None
    stage_samplers: list[PromptSampler] = field(default_factory=list)  # sequential agent training stages
    dp: DataParallel = LOCAL  # data-parallel split of the updates (credo.distributed)
    shard_rollouts: bool = False  # each rank generates its share of the prompts (credo.distributed.rollout)
    agent: bool = False  # multi-turn agent RL: rewards from the environments
    ray: bool = False  # distributed.backend=ray: engine and runner are Ray worker pools
    leader_only: bool = False  # Ray mode with several ranks: rank 0 collects and broadcasts rollouts and evals
    pending: Prefetch | None = None  # one-step-off mode: the next step's rollouts, being generated
    served_version: int = -1  # the policy version the rollout engine serves (sync_engine)
    replica: Any = None  # FSDP2: an unsharded copy of the policy, loaded with the whole weights to save them
    replay: Any = None  # RLEP: the ReplayPool mixed into every group (credo.methods.rlep.pool)
    tree_state: dict[str, Any] = field(default_factory=dict)  # AttnRL: the run state's ``attnrl`` (rl_loop links it)


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
    seed_everything(cfg.seed, cfg.train.threads)
    data = load_data(cfg, cfg.seed)
    ckpt = resume_checkpoint(run_dir) if resume else None  # the newest intact one (damaged ones are skipped)
    if resume and ckpt is None:
        raise FileNotFoundError(f"no complete, intact checkpoint in {run_dir}/checkpoints; start a new run instead")
    if ckpt is not None and cfg.distributed.strategy == "fsdp2":
        raise NotImplementedError("resuming a distributed.strategy=fsdp2 run is not implemented: its checkpoints "
                                  "hold the whole weights but each rank's optimizer state is sharded")
    model, tokenizer, fresh = (load_model(ckpt / "model", cfg.model) + (False,)) if ckpt else \
        load_or_build(cfg.model, seed=cfg.seed)
    if not (cfg.agent.envs or cfg.agent.stages):
        data = format_prompts(data, tokenizer, template=cfg.task.prompt_template, chat=cfg.task.chat_template)
        data = drop_overlong(data, tokenizer, cfg.task, context=model_context(model),
                             max_new_tokens=cfg.rollout.max_new_tokens)
    log.info("policy: %s parameters, run dir %s", f"{num_parameters(model):,}", run_dir)
    ray_mode = cfg.distributed.backend == "ray"
    follower = ray_mode and dp.rank > 0  # Ray mode: rank 0 alone drives the rollout and reward pools
    agent = is_agent_run(cfg, data)
    with contextlib.ExitStack() as stack:
        runner = None if follower else stack.enter_context(reward_runner(cfg, data))
        logger = stack.enter_context(MetricsLogger(run_dir, tensorboard=cfg.log.tensorboard,
                                                   resume_step=_step_of(ckpt) if ckpt else None))
        optimizer = build_optimizer(model, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, betas=cfg.train.betas)
        shard = dp.enabled and not ray_mode and cfg.distributed.rollout == "shard" and not agent \
            and not cfg.algo.filter_groups
        engine = None
        if not follower:  # sharded ranks sample different prompts with their own random streams
            engine = rollout_engine(cfg, model, tokenizer, seed=cfg.seed + (1_000_003 * dp.rank if shard else 0))
            stack.callback(engine.close)
        parts = Parts(
            model=model, tokenizer=tokenizer, runner=runner, data=data, logger=logger, optimizer=optimizer,
            engine=engine, sampler=PromptSampler(data.train, seed=cfg.seed), scheduler=_scheduler(cfg, optimizer),
            shard_rollouts=shard,
            stage_samplers=[PromptSampler(exs, seed=cfg.seed + i) for i, exs in enumerate(data.stage_train)],
            dp=dp, agent=agent, ray=ray_mode, leader_only=ray_mode and dp.enabled,
        )
        if parts.shard_rollouts:
            parts.sampler = ShardedSampler(parts.sampler, dp)
        parts.replay = open_replay(cfg, run_dir)
        state = restore(cfg, ckpt, parts) if ckpt else start(cfg, run_dir, parts, fresh)
        parts.ref_model = load_reference(cfg, run_dir)
        if cfg.distributed.strategy == "fsdp2":
            shard_policy_of(cfg, parts)
        rl_loop(cfg, run_dir, state, parts)
        whole = plain_model(parts)
    save_final(cfg, run_dir, whole, tokenizer)
    write_summary(cfg, run_dir, whole, start_eval=state.start_eval, last_eval=state.last_eval,
                  extra={"steps": state.step, "train_wall_s": round(state.wall_s, 2), "data/bad_rows": state.bad_rows})
    return run_dir


def start(cfg: RunConfig, run_dir: Path, parts: Parts, fresh: bool) -> RunState:
    """A new run: optional SFT warm start, the step-0 evaluation, the frozen reference and critic."""
    state = RunState(bad_rows=len(parts.data.bad_rows))
    if warm_start_enabled(cfg, fresh):
        warm_start(cfg, parts.model, parts.tokenizer, parts.data, parts.logger)
    state.start_eval = state.last_eval = evaluate_now(cfg, parts, run_dir, 0, force_sync=True)
    parts.logger.log(0, state.start_eval)
    if cfg.replay.pool == "warm_start":  # RLEP's pool, from the warm-started policy
        parts.replay = collect_at_start(cfg, parts.engine, parts.runner, parts.data, run_dir)
    if needs_reference(cfg):
        save_model(parts.model, parts.tokenizer, run_dir / "reference")
    if needs_critic(cfg):
        critic = ValueModel.load(cfg.critic.path, cfg.model.device) if cfg.critic.path else \
            ValueModel.from_policy(parts.model, cfg.critic.head, **cfg.critic.head_args)
        if not isinstance(critic, ValueModel):  # ValueModel.load also loads implicit (LM-only) reward models
            raise ValueError(f"critic.path={cfg.critic.path}: a {type(critic).__name__} has no value head and cannot "
                             "be a critic")
        attach_critic(cfg, parts, critic)
    return state


# ============================================================================ the RL loop

def rl_loop(cfg: RunConfig, run_dir: Path, state: RunState, parts: Parts) -> None:
    parts.tree_state = state.attnrl  # collect() updates it in place; checkpoints save it with the run state
    with StepProgress("rl", cfg.train.steps, state.step, enabled=cfg.log.progress,
                      print_every=cfg.log.print_every) as bar:
        bar.update(state.step, state.last_eval)
        while state.step < cfg.train.steps:
            t0 = time.perf_counter()
            metrics = rl_step(cfg, parts, state, step=state.step)
            state.step += 1
            if eval_due(cfg, state.step):
                timer = Timer()
                with timer("eval"):
                    state.last_eval = evaluate_now(cfg, parts, run_dir, state.step)
                metrics.update(state.last_eval | timer.metrics())
            state.wall_s += time.perf_counter() - t0
            # the step's row is on disk before its checkpoint exists: a kill in between resumes from the older
            # checkpoint (whose later rows are truncated), never from one whose step has no row
            parts.logger.log(state.step, metrics)
            if checkpoint_due(cfg, state.step):
                t_ck = time.perf_counter()
                save_checkpoint(run_dir, state.step, model=plain_model(parts), tokenizer=parts.tokenizer,
                                keep=cfg.checkpoint.keep, trainer_state=trainer_state(state, parts),
                                critic=parts.critic)
                parts.logger.log(state.step, {"timing_s/checkpoint": time.perf_counter() - t_ck},
                                 file="checkpoints.jsonl")
            bar.update(state.step, metrics)


def rl_step(cfg: RunConfig, parts: Parts, state: RunState, *, step: int) -> dict[str, float]:
    """One RL step: rollout -> reward -> old log-probs (+ values) -> advantages -> critic and policy updates."""
    timer = Timer()
    a, micro, temperature = cfg.algo, cfg.train.micro_batch_size, cfg.rollout.temperature
    with timer("step"):
        rollouts = step_rollouts(cfg, parts, step, timer)
        metrics = rollouts.metrics
        if not rollouts.trajs:  # every group was filtered out: nothing to learn from this step
            return metrics | timer.metrics() | {"train/skipped_step": 1}
        batch = collate(rollouts.trajs, rollouts.results, pad_id=parts.tokenizer.pad_token_id)
        adv_needs = advantage_requirements(a.advantage, a.advantage_args)
        fused = fuse_old_logprobs(cfg, parts, adv_needs, batch.batch_size)
        token_stats: dict[str, torch.Tensor] = {}
        if not fused:
            with timer("old_logprob"):
                stats = ("entropy", "entropy_direction") if "entropy_direction" in adv_needs else ("entropy",)
                batch.old_logprobs, token_stats = batched_logprobs(
                    parts.model, batch, micro_batch_size=micro, micro_batch_tokens=cfg.train.micro_batch_tokens,
                    temperature=temperature, stats=stats, opts=ForwardOptions.of(cfg))
                batch.entropy = token_stats["entropy"]
            state.entropy_history.append(float(masked_mean(batch.entropy, batch.response_mask)))
            if parts.replay is not None:  # replayed answers were not sampled: the current policy is their behaviour
                rows = replay_rows(rollouts.trajs)
                batch.rollout_logprobs[rows] = batch.old_logprobs[rows]
            # sampler vs trainer log-probs of the same tokens (verl's rollout_probs_diff): ~0 on-policy, the policy
            # lag's effect in one-step-off mode
            metrics["rollout/logprob_abs_diff"] = float(masked_mean((batch.rollout_logprobs - batch.old_logprobs).abs(),
                                                                    batch.response_mask))
            if cfg.rollout.one_step_off and cfg.rollout.off_policy_ratio == "behaviour":
                batch.old_logprobs = batch.rollout_logprobs  # the PPO ratio against the policy that generated
        if parts.critic is not None:
            with timer("values"):
                batch.values, batch.value_quantiles = batched_values(parts.critic, batch, micro_batch_size=micro)
        rewards = batch.scores if not parts.agent else \
            reward_tensor(cfg, batch.scores, rollouts.trajs, batch.responses.shape[1])  # agent reward placement
        rewards = apply_reference(cfg, parts, batch, metrics, timer, rewards)
        with timer("adv"):
            inputs = advantage_inputs(cfg, parts, batch, rollouts.trajs, adv_needs, token_stats, state, timer)
            adv = compute_advantages(a.advantage, rewards=rewards, group_ids=batch.group_ids,
                                     response_mask=batch.response_mask, **inputs, **a.advantage_args)
            batch.advantages, batch.returns, batch.return_quantiles = adv.advantages, adv.returns, adv.return_quantiles
            if parts.critic is not None and not {"values", "value_quantiles"} & set(adv_needs):
                # a monitored critic (the estimator does not read it) learns the returns
                batch.returns = discounted_returns(rewards, batch.response_mask, 1.0)
        if parts.critic is not None:
            with timer("update_critic"):
                metrics.update(update_critic(cfg, parts.critic, batch, parts.critic_optimizer,
                                             parts.critic_scheduler, step=step, dp=parts.dp))
        if step >= cfg.critic.warmup_steps or parts.critic is None:
            policy_batch = vepo_select(cfg, parts.model, parts.tokenizer, batch, rollouts.trajs, metrics, timer,
                                      step=step)
            with timer("update"):
                metrics.update(update_policy(cfg, parts.model, select_tokens(cfg, policy_batch, metrics),
                                             parts.optimizer, parts.scheduler, step=step, dp=parts.dp))
            if fused and "actor/entropy" in metrics:  # absent when every row had zero advantage (skipped)
                state.entropy_history.append(metrics["actor/entropy"])
    metrics.update(adv.metrics | timer.metrics() | step_metrics(batch, rollouts.trajs, timer, step=step))
    every = cfg.log.rollouts_every
    if every and (step + 1) % every == 0:
        for row in rollout_records(batch, rollouts.trajs, rollouts.results, parts.tokenizer):
            parts.logger.log_record(step + 1, row, file="rollouts.jsonl")
    return metrics


def step_rollouts(cfg: RunConfig, parts: Parts, step: int, timer: Timer) -> Rollouts:
    """This step's rollouts. The engine first serves the trainer's weights as policy ``step``. One-step-off
    mode: the batch generated (by the previous policy) while the previous step updated, and the next batch starts
    generating now, overlapping this step's update. Ray mode: rank 0 collects, the other ranks receive."""
    ready = parts.pending.wait(timer) if parts.pending is not None else None  # the engine is idle after this
    parts.pending = None
    sync_engine(parts, step)

    def leader() -> Rollouts:
        rollouts = ready if ready is not None else collect(cfg, parts, step, timer)
        if cfg.rollout.one_step_off and step + 1 < cfg.train.steps:
            parts.pending = Prefetch(lambda t: collect(cfg, parts, step + 1, t))
        return rollouts

    rollouts = from_leader(parts.dp, parts.leader_only, leader)
    if parts.shard_rollouts:
        with timer("gather"):
            rollouts = gather_rollouts(rollouts, parts.dp)
    return rollouts


def collect(cfg: RunConfig, parts: Parts, step: int, timer: Timer) -> Rollouts:
    """Generate and score one batch: agent episodes, or single-turn groups (with group filtering)."""
    a = cfg.algo
    if parts.agent:  # multi-turn episodes, rewards from the environments
        sampler = parts.stage_samplers[stage_of(cfg, step)] if parts.stage_samplers else parts.sampler
        rollouts = collect_agent_rollouts(cfg, parts.engine, parts.tokenizer, sampler, step=step,
                                          sampling=sampling_params(cfg), timer=timer)
    elif cfg.attnrl.enabled:  # AttnRL tree rollouts; the FCI pass runs on the policy that sampled (credo.methods.attnrl.collector)
        model = fci_model(parts.engine, parts.model, one_step_off=cfg.rollout.one_step_off)
        rollouts = collect_tree_rollouts(cfg, parts.engine, training_runner(cfg, parts.runner, step), parts.sampler,
                                         model, parts.tokenizer, state=parts.tree_state, step=step, timer=timer)
    else:
        rollouts = collect_rollouts(
            parts.engine, training_runner(cfg, parts.runner, step), parts.sampler,
            prompts_per_step=cfg.train.prompts_per_step, group_size=cfg.rollout.group_size, sampling=sampling_params(cfg), filter_groups=a.filter_groups,
            dynamic_sampling=a.dynamic_sampling, max_gen_batches=a.max_gen_batches,
            overlong_buffer=cfg.reward.overlong_buffer, overlong_factor=cfg.reward.overlong_penalty, timer=timer)
        if parts.replay is not None:
            with timer("replay"):
                replay_step(cfg, parts.replay, parts.tokenizer, training_runner(cfg, parts.runner, step), rollouts,
                            step)
        if cfg.reward.noise > 0:
            rollouts.metrics["reward/noised_frac"] = sum(bool(r.info.get("noised")) for r in rollouts.results) / \
                max(len(rollouts.results), 1)
    if parts.ray:  # workers replaced so far (their shares were re-queued)
        rollouts.metrics["dist/rollout_restarts"] = parts.engine.restarts
        if parts.runner is not None:
            rollouts.metrics["dist/reward_restarts"] = parts.runner.restarts
    return rollouts


def sync_engine(parts: Parts, version: int, *, force: bool = False) -> None:
    """The rollout engine serves the trainer's current weights as policy ``version`` (shipped to Ray rollout
    workers; an in-process engine on the trainer's own module only takes the version). Every rank calls it at the
    same points: a sharded (FSDP2) policy's whole weights are gathered by all of them."""
    if not force and parts.served_version == version:
        return
    weights = full_state_dict(parts.model) if is_sharded(parts.model) else parts.model
    if parts.engine is not None:
        parts.engine.update_weights(weights, version=version)
    parts.served_version = version


def evaluate_now(cfg: RunConfig, parts: Parts, run_dir: Path, step: int, *, force_sync: bool = False) -> dict:
    """Held-out evaluation of the current policy (rank 0's, broadcast, in Ray mode)."""
    if parts.pending is not None:  # the engine first finishes the batch in flight
        parts.pending.wait()
    sync_engine(parts, step, force=force_sync)
    return from_leader(parts.dp, parts.leader_only,
                       lambda: run_eval(cfg, parts.engine, parts.runner, parts.data, run_dir, step=step))


def plain_model(parts: Parts):
    """The policy as one module with whole weights, for saving: the model itself, or for a sharded (FSDP2) policy
    its replica loaded with the gathered weights (a collective: every rank calls it at the same point)."""
    if not is_sharded(parts.model):
        return parts.model
    parts.replica.load_state_dict(full_state_dict(parts.model))
    return parts.replica


def shard_policy_of(cfg: RunConfig, parts: Parts) -> None:
    """distributed.strategy=fsdp2: shard the policy over the ranks (after the warm start, the reference and the
    critic were made from it whole); its optimizer is rebuilt on the shards."""
    parts.replica = copy.deepcopy(parts.model)
    shard_policy(parts.model, parts.dp.world_size)
    parts.optimizer = build_optimizer(parts.model, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                                      betas=cfg.train.betas)
    parts.scheduler = _scheduler(cfg, parts.optimizer)


def apply_reference(cfg: RunConfig, parts: Parts, batch: TrainBatch, metrics: dict, timer: Timer,
                    rewards: torch.Tensor) -> torch.Tensor:
    """Reference log-probs when a KL term needs them; returns ``rewards`` ((B,) scores or (B, T) token rewards),
    KL-penalised per token if ``algo.kl_in_reward``."""
    a = cfg.algo
    if parts.ref_model is None:
        return rewards
    entropy = "ref_entropy" in critic_requirements(cfg)  # VRPO's critic reads the frozen LM's entropy
    with timer("ref"):
        batch.ref_logprobs, stats = batched_logprobs(
            parts.ref_model, batch, micro_batch_size=cfg.train.micro_batch_size,
            micro_batch_tokens=cfg.train.micro_batch_tokens, temperature=cfg.rollout.temperature,
            stats=("entropy",) if entropy else (), opts=ForwardOptions.of(cfg))
        batch.ref_entropy = stats.get("entropy")
    kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, a.kl_estimator) * batch.response_mask  # (B, T)
    metrics["actor/kl"] = float(masked_mean(kl, batch.response_mask))
    if not (a.kl_in_reward and a.kl_coef > 0):
        return rewards
    # token-level rewards, as verl: the score on its token minus kl_coef * KL_t on every token
    metrics["actor/reward_kl_penalty"] = float((a.kl_coef * kl.sum(-1)).mean())
    metrics["actor/reward_kl_penalty_coeff"] = a.kl_coef
    token_scores = rewards if rewards.dim() == 2 else token_rewards(rewards, batch.response_mask)
    return token_scores - a.kl_coef * kl


def advantage_inputs(cfg: RunConfig, parts: Parts, batch: TrainBatch, trajs, needs: tuple[str, ...],
                     token_stats: dict[str, torch.Tensor], state: RunState, timer: Timer) -> dict[str, Any]:
    """The optional inputs the configured estimator declares it needs, and only those."""
    providers = {
        "values": lambda: batch.values,
        "value_quantiles": lambda: batch.value_quantiles,
        "entropy_direction": lambda: token_stats["entropy_direction"],
        "entropy_history": lambda: list(state.entropy_history),
        "reward_baselines": lambda: greedy_baselines(cfg, parts, trajs, timer),
        "tree_paths": lambda: [t.info["tree_path"] for t in trajs],
    }
    return {name: providers[name]() for name in needs}


def greedy_baselines(cfg: RunConfig, parts: Parts, trajs, timer: Timer) -> torch.Tensor:
    """ReMax baseline: the score of one greedy response per prompt, repeated over the prompt's samples."""
    first = {}
    for t in trajs:
        first.setdefault(t.group_id, t.example)

    def leader() -> list[float]:
        if parts.pending is not None:  # one engine call at a time
            parts.pending.wait()
        greedy = parts.engine.generate(list(first.values()), 1,
                                       SamplingParams(greedy=True, max_new_tokens=cfg.rollout.max_new_tokens))
        return [r.score for r in parts.runner.score([g.response_text for g in greedy], [g.example for g in greedy])]

    with timer("gen_baseline"):
        scores = from_leader(parts.dp, parts.leader_only, leader)
    by_group = dict(zip(first, scores))
    return torch.tensor([by_group[t.group_id] for t in trajs], dtype=torch.float32)


def fuse_old_logprobs(cfg: RunConfig, parts: Parts, adv_needs: tuple[str, ...], batch_size: int) -> bool:
    """Whether the old-log-prob pass can be skipped: one optimizer step on the whole batch (so the policy has not
    moved when the loss is computed), no reference KL on old log-probs, no estimator or token selection that reads
    the pass's statistics, no critic (whose warm-up steps skip the policy update), no replay (replayed rows
    need the current policy's log-probs as their behaviour's), and no VEPO (its selection is made from the
    behaviour policy before the update, and the entropy logged is the whole batch's)."""
    t, a = cfg.train, cfg.algo
    return (t.old_logprob_pass == "auto" and t.ppo_epochs == 1 and (t.mini_batch_size or batch_size) >= batch_size
            and parts.ref_model is None and not {"entropy_direction", "entropy_history"} & set(adv_needs)
            and a.top_entropy_quantile >= 1.0 and parts.critic is None and not cfg.rollout.one_step_off
            and parts.replay is None and not cfg.vepo.enabled)


def step_metrics(batch: TrainBatch, trajs, timer: Timer, *, step: int) -> dict[str, float]:
    n_resp = float(batch.response_mask.sum())
    n_total = n_resp + sum(len(t.prompt_ids) for t in trajs)
    out = {"advantages/abs_mean": float(masked_mean(batch.advantages.abs(), batch.response_mask)),
           "perf/tokens_per_s": n_total / max(timer.seconds["step"], 1e-9),
           "perf/gen_tokens_per_s": n_resp / max(timer.seconds["gen"], 1e-9), "perf/response_tokens": n_resp}
    versions = [t.policy_version for t in trajs]
    out["rollout/policy_version"] = sum(versions) / len(versions)
    out["rollout/policy_lag"] = step - min(versions)  # optimizer steps between the sampler's policy and the trainer's
    if batch.old_logprobs is not None:  # else the update reported it (old-log-prob pass fused into it)
        out["actor/entropy"] = float(masked_mean(batch.entropy, batch.response_mask))
    if batch.values is not None:
        out["critic/vf_explained_var"] = explained_variance(batch.returns, batch.values, batch.response_mask)
        out["critic/values_mean"] = float(masked_mean(batch.values, batch.response_mask))
    return out


# ============================================================================ pieces of the run

def needs_reference(cfg: RunConfig) -> bool:
    a = cfg.algo
    return a.kl_coef > 0 or "ref_logprobs" in policy_loss_requirements(a.policy_loss, a.policy_loss_args) \
        or bool({"ref_logprobs", "ref_entropy"} & set(critic_requirements(cfg)))


def critic_requirements(cfg: RunConfig) -> tuple[str, ...]:
    """Inputs the configured critic loss needs (none without a critic)."""
    return critic_loss_requirements(cfg.critic.loss, cfg.critic.loss_args) if needs_critic(cfg) else ()


def needs_critic(cfg: RunConfig) -> bool:
    if cfg.critic.enabled is not None:
        return cfg.critic.enabled
    return bool({"values", "value_quantiles"} & set(advantage_requirements(cfg.algo.advantage,
                                                                             cfg.algo.advantage_args)))


def attach_critic(cfg: RunConfig, parts: Parts, critic: ValueModel) -> None:
    c = cfg.critic
    parts.critic = critic
    parts.critic_optimizer = build_optimizer(critic, lr=c.lr, weight_decay=c.weight_decay, betas=cfg.train.betas)
    parts.critic_scheduler = _scheduler(cfg, parts.critic_optimizer)


def _scheduler(cfg: RunConfig, optimizer):
    return build_scheduler(optimizer, warmup_steps=cfg.train.warmup_steps, total_steps=total_optimizer_steps(cfg),
                           schedule=cfg.train.lr_schedule, min_lr_ratio=cfg.train.min_lr_ratio)


def total_optimizer_steps(cfg: RunConfig) -> int:
    batch = cfg.train.prompts_per_step * cfg.rollout.group_size
    return cfg.train.steps * cfg.train.ppo_epochs * max(batch // (cfg.train.mini_batch_size or batch), 1)


def eval_due(cfg: RunConfig, step: int) -> bool:
    return step == cfg.train.steps or (cfg.eval.every > 0 and step % cfg.eval.every == 0)


def checkpoint_due(cfg: RunConfig, step: int) -> bool:
    return step == cfg.train.steps or (cfg.checkpoint.every > 0 and step % cfg.checkpoint.every == 0)


def load_reference(cfg: RunConfig, run_dir: Path):
    if not needs_reference(cfg):
        return None
    ref, _ = load_model(run_dir / "reference", cfg.model)
    ref.eval().requires_grad_(False)
    return ref


def trainer_state(state: RunState, parts: Parts) -> dict[str, Any]:
    # one-step-off: the batch in flight is finished and saved (its prompts are drawn, its sampler state advanced),
    # so a resumed run trains on it as the uninterrupted run would
    pending = parts.pending.wait() if parts.pending is not None else None
    saved = {"run": copy.deepcopy(state.__dict__), "optimizer": parts.optimizer.state_dict(),
             "scheduler": parts.scheduler.state_dict(), "rng": rng_state(),
             "engine": parts.engine.state_dict() if parts.engine is not None else None,
             "sampler": parts.sampler.state_dict(), "stage_samplers": [s.state_dict() for s in parts.stage_samplers],
             "pending_rollouts": pending, "replay": parts.replay.state_dict() if parts.replay is not None else None}
    if parts.critic is not None:
        saved["critic_optimizer"] = parts.critic_optimizer.state_dict()
        saved["critic_scheduler"] = parts.critic_scheduler.state_dict()
    return saved


def restore(cfg: RunConfig, ckpt: Path, parts: Parts) -> RunState:
    saved = load_trainer_state(ckpt)
    parts.optimizer.load_state_dict(saved["optimizer"])
    parts.scheduler.load_state_dict(saved["scheduler"])
    if parts.engine is not None:
        parts.engine.load_state_dict(saved["engine"])
    if saved.get("pending_rollouts") is not None:
        parts.pending = Prefetch(done=saved["pending_rollouts"])
    parts.sampler.load_state_dict(saved["sampler"])
    for sampler, st in zip(parts.stage_samplers, saved.get("stage_samplers", [])):
        sampler.load_state_dict(st)
    if (ckpt / "critic").is_dir():
        attach_critic(cfg, parts, ValueModel.load(ckpt / "critic", cfg.model.device))
        parts.critic_optimizer.load_state_dict(saved["critic_optimizer"])
        parts.critic_scheduler.load_state_dict(saved["critic_scheduler"])
    if parts.replay is not None and saved.get("replay"):
        parts.replay.load_state_dict(saved["replay"])
    set_rng_state(saved["rng"])
    log.info("resumed from %s (step %d)", ckpt, saved["run"]["step"])
    state = RunState(**saved["run"])
    sync_engine(parts, state.step, force=True)  # remote rollout workers start from the checkpoint's weights
    return state


def _step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[-1])
