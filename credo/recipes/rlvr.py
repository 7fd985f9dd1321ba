"""RL with verifiable rewards: the training recipe, top to bottom.

    for each step:
        prompts      = sampler.next_batch(...)                       # credo.data
        trajectories = engine.generate(prompts, group_size, ...)     # credo.rollout
        rewards      = runner.score(responses, examples)             # credo.rewards
        old_logprobs = batched_logprobs(model, batch)                # credo.train.forward
        advantages   = compute_advantages(estimator, ...)            # credo.algo
        update_policy: epochs x mini-batches x micro-batches of compute_policy_loss -> AdamW step
        metrics -> metrics.jsonl / TensorBoard; periodic eval; atomic checkpoint

Which estimator, loss and aggregation run is configuration (``algo.*``); nothing here branches on
method names.
"""
from __future__ import annotations

import copy
import json
import logging
import random
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from credo.algo import AggNorm, agg_loss, compute_advantages, compute_policy_loss, kl_penalty, masked_mean
from credo.algo.registry import POLICY_LOSSES
from credo.config import RunConfig, dump_config
from credo.data import PromptSampler
from credo.data.source import TaskData, load_task_data
from credo.models import load_model, load_or_build, num_parameters, save_model
from credo.rewards import RewardRunner
from credo.rollout import HFRolloutEngine
from credo.train.batch import collate
from credo.train.checkpoint import latest_checkpoint, load_trainer_state, rng_state, save_checkpoint, set_rng_state
from credo.train.evaluate import evaluate
from credo.train.forward import batched_logprobs, policy_logprobs
from credo.train.metrics import MetricsLogger
from credo.train.optim import build_optimizer, build_scheduler, clip_and_step
from credo.train.progress import StepProgress
from credo.train.sft import run_sft
from credo.train.stats import MetricAccumulator, Timer, rollout_metrics
from credo.types import SamplingParams, TrainBatch

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """What a checkpoint restores besides model and optimizer."""

    step: int = 0
    start_eval: dict[str, float] = field(default_factory=dict)  # held-out metrics before RL
    last_eval: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0  # training wall time summed over (resumed) segments
    bad_rows: int = 0  # malformed dataset rows skipped


@dataclass
class Parts:
    """The live objects of a run (built once, shared by the loop's steps)."""

    model: Any
    tokenizer: Any
    ref_model: Any  # frozen reference policy, or None when algo.kl_coef == 0
    engine: HFRolloutEngine
    runner: RewardRunner
    sampler: PromptSampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    data: TaskData
    logger: MetricsLogger


# ============================================================================ entry point

def train(cfg: RunConfig, *, run_dir: Path | None = None, resume: bool = False) -> Path:
    """Run (or resume) RL training; returns the run directory."""
    run_dir = prepare_run_dir(cfg, run_dir, resume)
    seed_everything(cfg.seed, cfg.train.threads)
    data = load_task_data(cfg.task, seed=cfg.seed)
    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"no complete checkpoint in {run_dir}/checkpoints; start a new run instead")
    model, tokenizer, fresh = (load_model(ckpt / "model", cfg.model) + (False,)) if ckpt else \
        load_or_build(cfg.model, seed=cfg.seed)
    log.info("policy: %s parameters, run dir %s", f"{num_parameters(model):,}", run_dir)
    with reward_runner(cfg, data) as runner, MetricsLogger(run_dir, tensorboard=cfg.log.tensorboard,
                                                           resume_step=_step_of(ckpt) if ckpt else None) as logger:
        optimizer = build_optimizer(model, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, betas=cfg.train.betas)
        parts = Parts(
            model=model, tokenizer=tokenizer, ref_model=None, runner=runner, data=data, logger=logger,
            engine=HFRolloutEngine(model, tokenizer, seed=cfg.seed, max_batch_size=cfg.rollout.max_batch_size),
            sampler=PromptSampler(data.train, seed=cfg.seed), optimizer=optimizer,
            scheduler=build_scheduler(optimizer, warmup_steps=cfg.train.warmup_steps,
                                      total_steps=total_optimizer_steps(cfg), schedule=cfg.train.lr_schedule,
                                      min_lr_ratio=cfg.train.min_lr_ratio),
        )
        state = restore(ckpt, parts) if ckpt else start(cfg, run_dir, parts, fresh)
        parts.ref_model = load_reference(cfg, run_dir)
        rl_loop(cfg, run_dir, state, parts)
    finish(cfg, run_dir, state, model, tokenizer)
    return run_dir


def start(cfg: RunConfig, run_dir: Path, parts: Parts, fresh: bool) -> RunState:
    """A new run: optional SFT warm start, the step-0 evaluation, the frozen reference if KL is on."""
    state = RunState(bad_rows=len(parts.data.bad_rows))
    if warm_start_enabled(cfg, fresh):
        warm_start(cfg, parts.model, parts.tokenizer, parts.data, parts.logger)
    state.start_eval = state.last_eval = run_eval(cfg, parts.engine, parts.runner, parts.data, run_dir, step=0)
    parts.logger.log(0, state.start_eval)
    if cfg.algo.kl_coef > 0:
        save_model(parts.model, parts.tokenizer, run_dir / "reference")
    return state


# ============================================================================ the RL loop

def rl_loop(cfg: RunConfig, run_dir: Path, state: RunState, parts: Parts) -> None:
    with StepProgress("rl", cfg.train.steps, state.step, enabled=cfg.log.progress,
                      print_every=cfg.log.print_every) as bar:
        bar.update(state.step, state.last_eval)
        while state.step < cfg.train.steps:
            t0 = time.perf_counter()
            metrics = rl_step(cfg, parts, step=state.step)
            state.step += 1
            if eval_due(cfg, state.step):
                timer = Timer()
                with timer("eval"):
                    state.last_eval = run_eval(cfg, parts.engine, parts.runner, parts.data, run_dir, step=state.step)
                metrics.update(state.last_eval | timer.metrics())
            state.wall_s += time.perf_counter() - t0
            if checkpoint_due(cfg, state.step):
                t_ck = time.perf_counter()
                save_checkpoint(run_dir, state.step, model=parts.model, tokenizer=parts.tokenizer,
                                keep=cfg.checkpoint.keep, trainer_state=trainer_state(state, parts))
                metrics["timing_s/checkpoint"] = time.perf_counter() - t_ck
            parts.logger.log(state.step, metrics)
            bar.update(state.step, metrics)


def rl_step(cfg: RunConfig, parts: Parts, *, step: int) -> dict[str, float]:
    """One RL step: rollout -> reward -> old log-probs -> advantages -> policy update."""
    timer = Timer()
    a, micro, temperature = cfg.algo, cfg.train.micro_batch_size, cfg.rollout.temperature
    with timer("step"):
        with timer("gen"):
            prompts = parts.sampler.next_batch(cfg.train.prompts_per_step)
            trajs = parts.engine.generate(prompts, cfg.rollout.group_size, sampling_params(cfg))
        with timer("reward"):
            results = parts.runner.score([t.response_text for t in trajs], [t.example for t in trajs])
        batch = collate(trajs, results, pad_id=parts.tokenizer.pad_token_id)
        with timer("old_logprob"):
            batch.old_logprobs, batch.entropy = batched_logprobs(parts.model, batch, micro_batch_size=micro,
                                                                 temperature=temperature, with_entropy=True)
        rewards, kl_metrics = batch.scores, {}
        if parts.ref_model is not None:
            with timer("ref"):
                batch.ref_logprobs, _ = batched_logprobs(parts.ref_model, batch, micro_batch_size=micro,
                                                         temperature=temperature)
            kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, a.kl_estimator) * batch.response_mask  # (B, T)
            kl_metrics["actor/kl"] = float(masked_mean(kl, batch.response_mask))
            if a.kl_in_reward:
                penalty = a.kl_coef * kl.sum(-1)  # (B,)
                rewards = rewards - penalty
                kl_metrics["actor/reward_kl_penalty"] = float(penalty.mean())
        with timer("adv"):
            adv = compute_advantages(a.advantage, rewards=rewards, group_ids=batch.group_ids,
                                     response_mask=batch.response_mask, **a.advantage_args)
            batch.advantages, batch.returns = adv.advantages, adv.returns
        with timer("update"):
            update = update_policy(cfg, parts.model, batch, parts.optimizer, parts.scheduler, step=step)
    metrics = rollout_metrics(trajs, results)
    metrics.update(update | kl_metrics | adv.metrics | timer.metrics())
    metrics["actor/entropy"] = float(masked_mean(batch.entropy, batch.response_mask))
    metrics["advantages/abs_mean"] = float(masked_mean(batch.advantages.abs(), batch.response_mask))
    n_resp = float(batch.response_mask.sum())
    n_total = n_resp + sum(len(t.prompt_ids) for t in trajs)
    metrics["perf/tokens_per_s"] = n_total / max(timer.seconds["step"], 1e-9)
    metrics["perf/gen_tokens_per_s"] = n_resp / max(timer.seconds["gen"], 1e-9)
    metrics["perf/response_tokens"] = n_resp
    return metrics


def update_policy(cfg: RunConfig, model, batch: TrainBatch, optimizer, scheduler, *, step: int) -> dict[str, float]:
    """PPO epochs over mini-batches (one optimizer step each) of micro-batches (gradient accumulation).

    Each mini-batch's aggregation normalisers are computed once (:class:`AggNorm`), so the summed
    micro-batch losses equal the mini-batch loss whatever the micro-batch size.
    """
    t, a = cfg.train, cfg.algo
    size = batch.batch_size
    mini = t.mini_batch_size or size
    micro = t.micro_batch_size or mini
    acc = MetricAccumulator()
    model.train()
    for epoch in range(t.ppo_epochs):
        order = torch.arange(size)
        if mini < size:  # shuffle mini-batch membership, reproducibly per (seed, step, epoch)
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 101 + epoch)
            order = torch.randperm(size, generator=gen)
        for mb_rows in order.split(mini):
            mb = batch.select(mb_rows)
            norm = AggNorm.of(mb.response_mask, a.loss_scale_factor if a.loss_scale_factor else None)
            lr = scheduler.get_last_lr()[0]
            for micro_rows in torch.arange(len(mb_rows)).split(micro):
                mbatch = mb.select(micro_rows)
                loss, per_update, weighted = actor_loss(cfg, model, mbatch, norm)
                loss.backward()
                acc.add_per_update(per_update)
                acc.add_weighted(weighted, weight=float(mbatch.response_mask.sum()))
            grad_norm = clip_and_step(model, optimizer, scheduler, t.grad_clip)
            acc.add_per_update({"actor/grad_norm": grad_norm, "actor/lr": lr})
            acc.end_update()
    return acc.result()


def actor_loss(cfg: RunConfig, model, mb: TrainBatch, norm: AggNorm):
    """Policy loss (+ KL loss, - entropy bonus) of one micro-batch, as its share of the mini-batch loss."""
    a = cfg.algo
    needs_entropy = a.entropy_coef != 0 or "entropy" in POLICY_LOSSES[a.policy_loss].requirements(a.policy_loss_args)
    logprobs, entropy = policy_logprobs(model, mb, temperature=cfg.rollout.temperature, with_entropy=needs_entropy)
    mask = mb.response_mask
    out = compute_policy_loss(a.policy_loss, logprobs=logprobs, old_logprobs=mb.old_logprobs,
                              advantages=mb.advantages, response_mask=mask, entropy=entropy,
                              ref_logprobs=mb.ref_logprobs, agg=a.agg, norm=norm, **a.policy_loss_args)
    loss = out.loss
    per_update = {"actor/pg_loss": float(out.loss.detach())}
    if a.kl_coef > 0 and not a.kl_in_reward:
        kl_loss = agg_loss(kl_penalty(logprobs, mb.ref_logprobs, a.kl_estimator), mask, a.agg, norm=norm)
        loss = loss + a.kl_coef * kl_loss
        per_update["actor/kl_loss"] = float(kl_loss.detach())
    if a.entropy_coef != 0:
        ent_loss = agg_loss(entropy, mask, a.agg, norm=norm)
        loss = loss - a.entropy_coef * ent_loss
        per_update["actor/entropy_loss"] = float(ent_loss.detach())
    return loss, per_update, {f"actor/{k}": v for k, v in out.metrics.items()}


# ============================================================================ pieces of the run

def prepare_run_dir(cfg: RunConfig, run_dir: Path | None, resume: bool) -> Path:
    if run_dir is None:
        name = cfg.run_name or f"{cfg.task.name}-{cfg.algo.policy_loss}-{datetime.now():%Y%m%d-%H%M%S}"
        run_dir = Path(cfg.output_dir) / name
    run_dir = Path(run_dir)
    if not resume and latest_checkpoint(run_dir) is not None:
        raise FileExistsError(f"{run_dir} already holds a run with checkpoints; use --resume {run_dir} "
                              f"or choose another run_name")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.yaml")
    return run_dir


def seed_everything(seed: int, threads: int | None = None) -> None:
    if threads:
        torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def sampling_params(cfg: RunConfig) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens)


def total_optimizer_steps(cfg: RunConfig) -> int:
    batch = cfg.train.prompts_per_step * cfg.rollout.group_size
    return cfg.train.steps * cfg.train.ppo_epochs * (batch // (cfg.train.mini_batch_size or batch))


def warm_start_enabled(cfg: RunConfig, fresh: bool) -> bool:
    enabled = cfg.warm_start.enabled
    return (fresh if enabled is None else enabled) and cfg.warm_start.steps > 0


def warm_start(cfg: RunConfig, model, tokenizer, data: TaskData, logger: MetricsLogger) -> None:
    w = cfg.warm_start
    log.info("warm start: %d SFT steps on task demonstrations", w.steps)
    with StepProgress("warm start (SFT)", w.steps, enabled=cfg.log.progress, print_every=cfg.log.print_every) as bar:
        def on_step(step: int, metrics: dict[str, float]) -> None:
            logger.log(step, metrics, file="warm_start.jsonl")
            bar.update(step, metrics)

        run_sft(model, tokenizer, data.train, data.demonstration, steps=w.steps, batch_size=w.batch_size, lr=w.lr,
                warmup_steps=w.warmup_steps, seed=cfg.seed, grad_clip=cfg.train.grad_clip, on_step=on_step)


def run_eval(cfg: RunConfig, engine, runner, data: TaskData, run_dir: Path, *, step: int) -> dict[str, float]:
    examples = data.eval[: cfg.eval.size] if cfg.eval.size else data.eval
    if not examples:
        return {}
    return evaluate(engine, runner, examples, k=cfg.eval.k, temperature=cfg.eval.temperature,
                    max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed * 7919 + step,
                    samples_path=run_dir / "eval_samples" / f"step_{step:06d}.jsonl")


def eval_due(cfg: RunConfig, step: int) -> bool:
    return step == cfg.train.steps or (cfg.eval.every > 0 and step % cfg.eval.every == 0)


def checkpoint_due(cfg: RunConfig, step: int) -> bool:
    return step == cfg.train.steps or (cfg.checkpoint.every > 0 and step % cfg.checkpoint.every == 0)


def reward_runner(cfg: RunConfig, data: TaskData) -> RewardRunner:
    r = cfg.reward
    return RewardRunner(r.name or data.default_reward, fn_kwargs=r.kwargs, timeout_s=r.timeout_s,
                        failure_score=r.failure_score, workers=r.workers, executor=r.executor)


def load_reference(cfg: RunConfig, run_dir: Path):
    if cfg.algo.kl_coef <= 0:
        return None
    ref, _ = load_model(run_dir / "reference", cfg.model)
    ref.eval().requires_grad_(False)
    return ref


def trainer_state(state: RunState, parts: Parts) -> dict[str, Any]:
    return {"run": copy.deepcopy(state.__dict__), "optimizer": parts.optimizer.state_dict(),
            "scheduler": parts.scheduler.state_dict(), "rng": rng_state(), "engine": parts.engine.state_dict(),
            "sampler": parts.sampler.state_dict()}


def restore(ckpt: Path, parts: Parts) -> RunState:
    saved = load_trainer_state(ckpt)
    parts.optimizer.load_state_dict(saved["optimizer"])
    parts.scheduler.load_state_dict(saved["scheduler"])
    parts.engine.load_state_dict(saved["engine"])
    parts.sampler.load_state_dict(saved["sampler"])
    set_rng_state(saved["rng"])
    log.info("resumed from %s (step %d)", ckpt, saved["run"]["step"])
    return RunState(**saved["run"])


def finish(cfg: RunConfig, run_dir: Path, state: RunState, model, tokenizer) -> None:
    if cfg.checkpoint.save_final:
        save_model(model, tokenizer, run_dir / "final")
    summary = {"steps": state.step, "train_wall_s": round(state.wall_s, 2), "parameters": num_parameters(model),
               "data/bad_rows": state.bad_rows}
    for key, value in state.start_eval.items():
        summary[f"start/{key}"] = value
    for key, value in state.last_eval.items():
        summary[f"final/{key}"] = value
    if "eval/greedy_acc" in state.start_eval and "eval/greedy_acc" in state.last_eval:
        summary["greedy_acc_gain_points"] = round(100 * (state.last_eval["eval/greedy_acc"]
                                                         - state.start_eval["eval/greedy_acc"]), 2)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.log.report:
        from credo.report import write_report

        write_report(run_dir)


def _step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[-1])
