"""Pieces shared by the recipes: run directory, seeding, warm start, evaluation, summary."""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import random
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from credo.config import RunConfig, config_to_dict, dump_config
from credo.data.source import TaskData
from credo.models import num_parameters, save_model
from credo.models.hub import resolve_model_path
from credo.rewards import RewardRunner
from credo.rewards.mixed import MixedRunner, NoisyRunner
from credo.rollout import HFRolloutEngine
from credo.collect.evaluate import evaluate
from credo.tracking.atomic import atomic_write_text
from credo.tracking.metrics import MetricsLogger
from credo.tracking.progress import StepProgress
from credo.tracking.rundir import check_run_dir, clear_run_dir, write_marker
from credo.tracking.trackers import open_trackers
from credo.train.host_memory import reuse_freed_memory
from credo.train.sft import run_sft
from credo.types import SamplingParams

log = logging.getLogger(__name__)


def prepare_run_dir(cfg: RunConfig, run_dir: Path | None, resume: bool, overwrite: bool = False, *,
                    command: str = "train") -> Path:
    """The run directory (``run_dir``, else ``output_dir/run_name``, else a timestamped name) with the run's
    ``config.yaml`` and credo's marker written (:mod:`credo.tracking.rundir`). A new run refuses a directory that
    already holds files (its logs would mix with the previous run's) unless ``overwrite``, which first deletes what
    a previous credo run wrote there (:func:`credo.tracking.rundir.clear_run_dir`: a folder without credo's marker
    is refused). A resumed run's directory must hold no symlink (:func:`credo.tracking.rundir.check_run_dir`)."""
    if run_dir is None:
        name = cfg.run_name or f"{cfg.task.name}-{cfg.algo.policy_loss}-{datetime.now():%Y%m%d-%H%M%S}"
        run_dir = Path(cfg.output_dir) / name
    run_dir = Path(run_dir)
    if resume and run_dir.is_dir():
        check_run_dir(run_dir, "--resume")
    if not resume and run_dir.is_dir() and any(run_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{run_dir} is not empty (a previous run?); continue a training run with "
                                  f"--resume {run_dir}, replace it with --overwrite, or choose another run_name "
                                  f"or --run-dir")
        clear_run_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_marker(run_dir, command)
    dump_config(cfg, run_dir / "config.yaml")
    return run_dir


def process_setup(cfg: RunConfig) -> None:
    """What a run sets for its whole process: the seeds, torch's thread count and, with
    ``train.reuse_host_memory``, the host allocator's reuse of freed memory (credo.train.host_memory)."""
    seed_everything(cfg.seed, cfg.train.threads)
    if cfg.train.reuse_host_memory:
        reuse_freed_memory()


def seed_everything(seed: int, threads: int | None = None) -> None:
    if threads:
        torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def sampling_params(cfg: RunConfig) -> SamplingParams:
    return SamplingParams.of(cfg.rollout)


def is_agent_run(cfg: RunConfig, data: TaskData) -> bool:
    """Agent RL: rewards come from the environments, not from a verifier."""
    return data.default_reward is None and cfg.reward.name is None


def reward_runner(cfg: RunConfig, data: TaskData):
    """The verifier pool (Ray reward workers under ``distributed.backend=ray``); a null context for agent RL,
    whose rewards come from the environments."""
    if is_agent_run(cfg, data):
        return contextlib.nullcontext(None)
    r, d = cfg.reward, cfg.distributed
    kwargs = dict(name_or_path=r.name or data.default_reward, fn_kwargs=r.kwargs, timeout_s=r.timeout_s,
                  failure_score=r.failure_score, workers=r.workers, executor=r.executor)
    if d.backend == "ray":
        from credo.distributed.ray_pools import RewardPool

        return RewardPool(kwargs, workers=d.reward_workers, num_cpus=d.worker_cpus, faults=injected_faults(cfg, "reward"),
                          placement=d.ray_placement)
    if not r.mix:
        return _routed(cfg, RewardRunner(**kwargs))
    components = [(kwargs["name_or_path"], r.weight, _routed(cfg, RewardRunner(**kwargs)))]
    for comp in r.mix:
        components.append((comp["name"], float(comp.get("weight", 1.0)), RewardRunner(
            comp["name"], fn_kwargs=comp.get("kwargs", {}), timeout_s=r.timeout_s, failure_score=r.failure_score,
            workers=r.workers, executor=comp.get("executor", "auto"))))
    return MixedRunner(components)


def _routed(cfg: RunConfig, runner):
    """``runner``, or with ``reward.by_data_source`` a RoutedRunner sending those rows to their own verifiers."""
    r = cfg.reward
    if not r.by_data_source:
        return runner
    from credo.rewards.routed import RoutedRunner

    routes = {}
    for source, spec in r.by_data_source.items():
        spec = spec if isinstance(spec, dict) else {"name": spec}
        routes[source] = RewardRunner(spec["name"], fn_kwargs=spec.get("kwargs", {}), timeout_s=r.timeout_s,
                                      failure_score=r.failure_score, workers=r.workers, executor=r.executor)
    return RoutedRunner(runner, routes)


def training_runner(cfg: RunConfig, runner, step: int):
    """The runner that scores training rollouts: ``runner``, or with ``reward.noise`` one that corrupts that share
    of the scores (evaluation keeps ``runner``)."""
    r = cfg.reward
    if r.noise <= 0 or runner is None:
        return runner
    return NoisyRunner(runner, rate=r.noise, mode=r.noise_mode, center=r.noise_center, std=r.noise_std,
                       seed=cfg.seed, step=step)


def rollout_engine(cfg: RunConfig, model, tokenizer, *, seed: int, log_dir=None):
    """The rollout engine: Ray rollout workers under ``distributed.backend=ray``, else an in-process engine (on a
    copy of the policy in one-step-off mode, whose generation overlaps the update, and for an FSDP2 policy, whose
    own parameters are shards)."""
    r, d = cfg.rollout, cfg.distributed
    if d.backend == "ray":
        from credo.distributed.ray_pools import RolloutPool

        return RolloutPool(model, tokenizer, workers=d.rollout_workers, seed=seed, max_batch_size=r.max_batch_size,
                           lean=r.lean_decode, num_cpus=d.worker_cpus, num_gpus=d.rollout_gpus,
                           threads=cfg.train.threads or 1, faults=injected_faults(cfg, "rollout"),
                           vllm=vllm_options(cfg) if r.engine == "vllm" else None, placement=d.ray_placement)
    if r.engine == "vllm":
        from credo.rollout.vllm_engine import VLLMRolloutEngine, VLLMUnavailable, vllm_problem

        opts = vllm_options(cfg)
        problem = vllm_problem(opts.mode, opts.url)
        if problem:
            raise VLLMUnavailable(f"rollout.engine=vllm: {problem}; use rollout.engine=hf on this machine")
        if cfg.model.path and cfg.model.lora is None:  # a hub id: vLLM reads its snapshot (credo.models.hub); a
            # LoRA policy's engine loads the base the recipe chose (RUN_DIR/base after a warm start): from_model
            path = resolve_model_path(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
            return VLLMRolloutEngine(str(path), tokenizer, seed=seed, options=opts, log_dir=log_dir)
        return VLLMRolloutEngine.from_model(model, tokenizer, seed=seed, options=opts, log_dir=log_dir)
    served = copy.deepcopy(model) if r.one_step_off or d.strategy == "fsdp2" else model
    return HFRolloutEngine(served, tokenizer, seed=seed, max_batch_size=r.max_batch_size, lean=r.lean_decode)


def vllm_options(cfg: RunConfig):
    """The ``rollout.vllm`` section as the engine's options; ``dtype: auto`` is the trainer's (``model.dtype``),
    not vLLM's own ``auto``, which runs a float32 checkpoint in bfloat16 (log-probs then differ by ~5e-3)."""
    from dataclasses import replace

    from credo.rollout.vllm_transport import VLLMOptions

    opts = VLLMOptions.of(cfg.rollout.vllm)
    return replace(opts, dtype=cfg.model.dtype) if opts.dtype == "auto" else opts


def injected_faults(cfg: RunConfig, kind: str) -> dict[int, int]:
    """``distributed.inject_faults`` entries ``KIND:WORKER:CALL`` of one kind, as {worker: call}."""
    out = {}
    for entry in cfg.distributed.inject_faults:
        k, worker, call = str(entry).split(":")
        if k == kind:
            out[int(worker)] = int(call)
    return out


def load_data(cfg: RunConfig, seed: int) -> TaskData:
    """The collector's own task rows (the agent collector's environment tasks, a verifiers environment's rows:
    ``register_collector(..., data=)``), else the single-turn task of ``task``."""
    from credo.collect.registry import collector_task_data

    return collector_task_data(cfg, seed)


def metrics_logger(cfg: RunConfig, run_dir: Path, *, resume_step: int | None = None,
                   trackers: bool = True) -> MetricsLogger:
    """The run's MetricsLogger (JSONL, TensorBoard) with the experiment trackers of ``log.trackers``
    (``trackers=False``: none, e.g. on distributed ranks other than 0; docs/tracking.md)."""
    opened = None
    if trackers and cfg.log.trackers:
        opened = open_trackers(cfg.log, run_dir, config=config_to_dict(cfg), resume=resume_step is not None)
    return MetricsLogger(run_dir, tensorboard=cfg.log.tensorboard, resume_step=resume_step, trackers=opened)


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

        batch_fn = (lambda exs: data.sft_batch(tokenizer, exs)) if data.sft_batch else None
        run_sft(model, tokenizer, data.train, data.demonstration, steps=w.steps, batch_size=w.batch_size, lr=w.lr,
                warmup_steps=w.warmup_steps, seed=cfg.seed, grad_clip=cfg.train.grad_clip, batch_fn=batch_fn,
                on_step=on_step)


def run_eval(cfg: RunConfig, engine, runner, data: TaskData, run_dir: Path, *, step: int) -> dict[str, float]:
    examples = data.eval[: cfg.eval.size] if cfg.eval.size else data.eval
    if not examples:
        return {}
    from credo.collect.registry import COLLECTOR_EVALS

    kind = cfg.rollout.collector.type
    if kind in COLLECTOR_EVALS:  # the collector's own (agent RL: episodes against the environments)
        return COLLECTOR_EVALS.get(kind)(cfg, engine, runner, examples, seed=cfg.seed * 7919 + step,
                                         samples_path=run_dir / "eval_samples" / f"step_{step:06d}.jsonl")
    return evaluate(engine, runner, examples, k=cfg.eval.k, temperature=cfg.eval.temperature,
                    max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed * 7919 + step,
                    samples_path=run_dir / "eval_samples" / f"step_{step:06d}.jsonl", pass_k=cfg.eval.pass_k)


def write_summary(cfg: RunConfig, run_dir: Path, model, *, start_eval: dict, last_eval: dict, extra: dict) -> None:
    """``summary.json`` (start and final held-out metrics, greedy gain) and, if enabled, the report."""
    summary = {**extra, "parameters": num_parameters(model)}
    summary.update({f"start/{k}": v for k, v in start_eval.items()})
    summary.update({f"final/{k}": v for k, v in last_eval.items()})
    if "eval/greedy_acc" in start_eval and "eval/greedy_acc" in last_eval:
        summary["greedy_acc_gain_points"] = round(100 * (last_eval["eval/greedy_acc"] - start_eval["eval/greedy_acc"]), 2)
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    if cfg.log.report:
        from credo.report import write_report

        write_report(run_dir)


def save_final(cfg: RunConfig, run_dir: Path, model, tokenizer) -> None:
    """``RUN_DIR/final`` with a ``MANIFEST.json`` of its files (checked by ``credo export``)."""
    if cfg.checkpoint.save_final:
        from credo.train.checkpoint import write_manifest

        save_model(model, tokenizer, run_dir / "final")
        write_manifest(run_dir / "final")
