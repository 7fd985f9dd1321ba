"""``credo rm train rm.method=idrm``: Interaction Distillation (docs/reward_models.md, [derived]).

    pairs   = generate_pairs(task, noise=rm.noise) | rm.train_file                  # as rm.method=bt
    policy  = load_or_build(model); SFT warm start (generated pairs only)
    teacher = CrossEncoder.load(idrm.teacher) | build_teacher + train_teacher        # credo.methods.reward_models.idrm.teacher
              held-out accuracy (both orders averaged) < idrm.min_teacher_acc -> stop
    student = ValueModel.from_policy(policy), eager attention while it trains        # credo.methods.reward_models.idrm.student
    train_idrm(student, teacher, ...): L_BT + intra_coef L_intra + inter_coef L_inter # credo.methods.reward_models.idrm.train
    -> metrics.jsonl, RUN_DIR/reward_model (the configured attention kernel), RUN_DIR/teacher, summary.json
"""
from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from pathlib import Path

from credo.config import ConfigError, RunConfig
from credo.data.source import load_task_data
from credo.methods.reward_models.idrm.evaluate import by_kind, masked_prefix_accuracy, student_by_kind
from credo.methods.reward_models.idrm.student import decoder_layers, eager_attention, eos_attention_mass, head_shape
from credo.methods.reward_models.idrm.teacher import (CrossEncoder, build_teacher, check_char_tokenizer, teacher_accuracy,
                                        train_teacher)
from credo.methods.reward_models.idrm.train import train_idrm
from credo.methods.reward_models.pairs import preference_data
from credo.methods.reward_models.train import pairwise_accuracy
from credo.models import ValueModel, load_or_build
from credo.recipes.common import metrics_logger, prepare_run_dir, process_setup, warm_start, warm_start_enabled
from credo.tracking.metrics import MetricsLogger
from credo.tracking.progress import StepProgress
from credo.tracking.atomic import atomic_write_text

log = logging.getLogger(__name__)


def check_idrm(cfg: RunConfig) -> None:
    """The combinations this reading refuses, before anything is built."""
    if cfg.rm.model != "value_head":
        raise ConfigError("rm.method=idrm: the student is a value-head reward model (rm.model=value_head); the "
                          "implicit reward model is outside this reading")


def teacher_for(cfg: RunConfig, tokenizer, train, held_out) -> tuple[CrossEncoder, dict[str, float], bool]:
    """(the teacher, its summary entries, trained here): loaded from ``idrm.teacher`` or built and trained on the
    training pairs; stops (ValueError) when its held-out accuracy, both orders averaged, is below the gate."""
    d, t0 = cfg.idrm, time.perf_counter()
    if d.teacher:
        teacher, trained = CrossEncoder.load(d.teacher, cfg.model.device).eval(), False
    else:
        teacher = build_teacher(tokenizer, hidden=d.teacher_hidden, layers=d.teacher_layers, heads=d.teacher_heads,
                                intermediate=d.teacher_intermediate, seed=cfg.seed).to(cfg.model.device)
        log.info("idrm: training the teacher (%d steps)", d.teacher_steps)
        train_teacher(teacher, tokenizer, train, steps=d.teacher_steps, batch_size=d.teacher_batch_size,
                      lr=d.teacher_lr, grad_clip=cfg.train.grad_clip, seed=cfg.seed)
        trained = True
    acc = teacher_accuracy(teacher, tokenizer, held_out)
    summary = {"teacher/acc": acc["mean"], "teacher/acc_chosen_first": acc["chosen_first"],
               "teacher/acc_chosen_second": acc["chosen_second"], "teacher_wall_s": round(time.perf_counter() - t0, 1)}
    summary |= {f"teacher/acc/{k}": v for k, v in by_kind(held_out, acc["per_pair"]).items()}
    log.info("idrm teacher: held-out accuracy %.3f (chosen first %.3f, second %.3f)", acc["mean"],
             acc["chosen_first"], acc["chosen_second"])
    return teacher, summary, trained


def idrm_train(cfg: RunConfig, *, run_dir: Path | None = None, overwrite: bool = False) -> Path:
    r, d = cfg.rm, cfg.idrm
    check_idrm(cfg)
    if run_dir is None and cfg.run_name is None:
        cfg.run_name = f"{cfg.task.name}-rm-idrm-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = prepare_run_dir(cfg, run_dir, resume=False, overwrite=overwrite)
    process_setup(cfg)
    train, held_out, bad = preference_data(cfg)
    policy, tokenizer, fresh = load_or_build(cfg.model, seed=cfg.seed)
    check_char_tokenizer(tokenizer)
    if r.train_file is None and warm_start_enabled(cfg, fresh):
        with MetricsLogger(run_dir, tensorboard=False) as logger:
            warm_start(cfg, policy, tokenizer, load_task_data(cfg.task, seed=cfg.seed), logger)
    student = ValueModel.from_policy(policy)
    teacher, summary, trained = teacher_for(cfg, tokenizer, train, held_out)
    if trained:
        teacher.save(run_dir / "teacher")
    if d.heads == "per_head" and head_shape(student.backbone)[0] != teacher.bert.config.num_attention_heads:
        raise ConfigError(f"idrm.heads=per_head: the student has {head_shape(student.backbone)[0]} heads and the "
                          f"teacher {teacher.bert.config.num_attention_heads}; use idrm.heads=mean")
    if summary["teacher/acc"] < d.min_teacher_acc:
        raise ValueError(f"idrm: the teacher's held-out pairwise accuracy {summary['teacher/acc']:.3f} is below "
                         f"idrm.min_teacher_acc={d.min_teacher_acc}: aligning to an uninformed teacher is noise "
                         "(more idrm.teacher_steps, or a lower gate)")
    with metrics_logger(cfg, run_dir) as logger, \
            StepProgress("reward model (idrm)", r.steps, enabled=cfg.log.progress,
                         print_every=cfg.log.print_every) as bar:
        def evaluate() -> dict[str, float]:
            return {"eval/pairwise_acc": pairwise_accuracy(student, tokenizer, held_out, pooling=r.pooling)}

        def on_step(step: int, metrics: dict[str, float]) -> None:
            if r.eval_every and step % r.eval_every == 0 and step < r.steps:
                metrics = metrics | evaluate()
            logger.log(step, metrics)
            bar.update(step, metrics)

        t1 = time.perf_counter()
        start = evaluate() | {"idrm/teacher_acc": summary["teacher/acc"]}
        logger.log(0, start)
        summary |= {f"start/{k}": v for k, v in start.items()}
        with eager_attention(student.backbone):  # for this method only: sdpa returns no maps
            train_idrm(student, teacher, tokenizer, train, d, steps=r.steps, batch_size=r.batch_size, lr=r.lr,
                       margin=r.margin, grad_clip=cfg.train.grad_clip, seed=cfg.seed, pooling=r.pooling,
                       on_step=on_step)
        final = evaluate() | diagnostics(student, tokenizer, held_out, r.pooling)
        logger.log(r.steps, final)
        summary["train_wall_s"] = round(time.perf_counter() - t1, 1)
        summary |= {f"final/{k}": v for k, v in final.items()}
    student.save(run_dir / "reward_model")
    tokenizer.save_pretrained(run_dir / "reward_model")
    summary |= {"train_pairs": len(train), "flipped_pairs": sum(p.flipped for p in train),
                "eval_pairs": len(held_out), "data/bad_rows": len(bad), "student_layers":
                len(decoder_layers(student.backbone))}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return run_dir


def diagnostics(rm, tokenizer, pairs, pooling: str) -> dict[str, float]:
    """Accuracy by corruption kind, the EOS row's attention mass per fifth, accuracy against a masked prefix."""
    out = {f"eval/pairwise_acc/{k}": v for k, v in student_by_kind(rm, tokenizer, pairs, pooling).items()}
    mass = eos_attention_mass(rm, tokenizer, pairs)
    out |= {f"idrm/attn_mass_q{i + 1}": float(m) for i, m in enumerate(mass)}
    out |= {f"eval/masked_prefix_acc/{f}": v for f, v in masked_prefix_accuracy(rm, tokenizer, pairs,
                                                                                 pooling=pooling).items()}
    return out
