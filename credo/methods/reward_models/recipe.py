"""``credo rm train``: train an outcome reward model (Bradley-Terry) or CRM's pair of peer-reviewing models.

    pairs        = load_pairs(rm.train_file) or generate_pairs(task, noise=rm.noise)   # credo.methods.reward_models.pairs
    policy       = load_or_build(model); SFT warm start on the task (generated pairs only)
    rm           = ValueModel.from_policy(policy)                                       # backbone + scalar head
    train_bt(rm, ...) | train_crm((rm_a, rm_b), ...)                                    # credo.methods.reward_models.train
    held-out pairwise accuracy every rm.eval_every steps -> metrics.jsonl; RUN_DIR/reward_model (+ _b); summary
"""
from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from pathlib import Path

import torch

from credo.config import RunConfig
from credo.methods.reward_models.pairs import preference_data
from credo.data.source import load_task_data
from credo.models import ValueModel, load_or_build
from credo.models.implicit import ImplicitRewardModel
from credo.recipes.common import metrics_logger, prepare_run_dir, process_setup, warm_start, warm_start_enabled
from credo.tracking.metrics import MetricsLogger
from credo.tracking.progress import StepProgress
from credo.tracking.atomic import atomic_write_text
from credo.methods.reward_models.train import pairwise_accuracy, train_bt, train_crm

log = logging.getLogger(__name__)


def rm_train(cfg: RunConfig, *, run_dir: Path | None = None, overwrite: bool = False) -> Path:
    r = cfg.rm
    if r.method == "birm":  # a process reward model on self-labelled steps: its own recipe
        from credo.methods.birm.recipe import birm_train

        return birm_train(cfg, run_dir=run_dir, overwrite=overwrite)
    if r.method == "idrm":  # BT with attention alignment to a cross-encoder teacher: its own recipe
        from credo.methods.reward_models.idrm.recipe import idrm_train

        return idrm_train(cfg, run_dir=run_dir, overwrite=overwrite)
    if run_dir is None and cfg.run_name is None:
        cfg.run_name = f"{cfg.task.name}-rm-{r.method}-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = prepare_run_dir(cfg, run_dir, resume=False, overwrite=overwrite)
    process_setup(cfg)
    train, held_out, bad = preference_data(cfg)
    policy, tokenizer, fresh = load_or_build(cfg.model, seed=cfg.seed)
    if r.train_file is None and warm_start_enabled(cfg, fresh):  # generated pairs: the backbone first learns the task
        with MetricsLogger(run_dir, tensorboard=False) as logger:
            warm_start(cfg, policy, tokenizer, load_task_data(cfg.task, seed=cfg.seed), logger)
    models = [new_reward_model(cfg, policy, 0)]
    if r.method == "crm":  # two peers from the same backbone (heads drawn apart so that they can disagree)
        models.append(new_reward_model(cfg, policy, 1))
    log.info("reward model (%s): %d training pairs (%d flipped), %d held out", r.method, len(train),
             sum(p.flipped for p in train), len(held_out))
    summary: dict[str, float] = {}
    with metrics_logger(cfg, run_dir) as logger, \
            StepProgress(f"reward model ({r.method})", r.steps, enabled=cfg.log.progress,
                         print_every=cfg.log.print_every) as bar:
        def evaluate() -> dict[str, float]:  # a tie (equal scores) counts as wrong
            return {f"eval/pairwise_acc{'' if i == 0 else '_b'}":
                    pairwise_accuracy(m, tokenizer, held_out, pooling=r.pooling) for i, m in enumerate(models)}

        def on_step(step: int, metrics: dict[str, float]) -> None:
            if r.eval_every and step % r.eval_every == 0 and step < r.steps:
                metrics = metrics | evaluate()
            logger.log(step, metrics)
            bar.update(step, metrics)

        t0 = time.perf_counter()
        start = evaluate()
        logger.log(0, start)
        summary |= {f"start/{k}": v for k, v in start.items()}
        common = dict(steps=r.steps, batch_size=r.batch_size, lr=r.lr, margin=r.margin, seed=cfg.seed,
                      grad_clip=cfg.train.grad_clip, pooling=r.pooling, on_step=on_step)
        if r.method == "crm":
            train_crm((models[0], models[1]), tokenizer, train, keep_final=r.keep_ratio, keep_warmup=r.keep_warmup,
                      curriculum=r.curriculum, **common)
        else:
            train_bt(models[0], tokenizer, train, **common)
        final = evaluate()
        logger.log(r.steps, final)
        summary["train_wall_s"] = round(time.perf_counter() - t0, 1)
        summary |= {f"final/{k}": v for k, v in final.items()}
    for i, m in enumerate(models):
        m.save(run_dir / ("reward_model" if i == 0 else "reward_model_b"))
    tokenizer.save_pretrained(run_dir / "reward_model")
    summary |= {"train_pairs": len(train), "flipped_pairs": sum(p.flipped for p in train),
                "eval_pairs": len(held_out), "data/bad_rows": len(bad)}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return run_dir


def new_reward_model(cfg: RunConfig, policy, index: int):
    """A reward model started from the (warm-started) policy: a scalar-head ValueModel (CRM's peers get heads drawn
    apart, seeded by ``index``), or an implicit reward model (``rm.model=implicit``)."""
    if cfg.rm.model == "implicit":
        return ImplicitRewardModel.from_policy(policy, beta=cfg.rm.beta)
    model = ValueModel.from_policy(policy)
    if cfg.rm.method == "crm":
        with torch.no_grad():
            model.value_head.weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(cfg.seed * 1009 + index))
    return model
