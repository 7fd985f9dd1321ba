"""``credo rm train rm.method=birm``: BiRM on steps the framework labels itself, then best-of-N and beam search.

    policy  = load_or_build(model); SFT warm start on the task (a fresh model)          # the generator
    samples = label_steps(engine, runner, train prompts, birm.samples, birm.rollouts)  # MC step labels
    birm    = BiRewardModel.from_policy(policy); train_birm(birm, samples)             # credo.methods.birm.train
              (LogRatioBiRM with birm.heads=logratio)
    held-out: best_of_n (BiRM vs value / reward heads vs sampled log-prob) and beam search
    -> metrics.jsonl, RUN_DIR/birm, summary.json
"""
from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from pathlib import Path

from credo.config import RunConfig
from credo.data.source import load_task_data
from credo.models import load_or_build
from credo.methods.birm.model import BiRewardModel, LogRatioBiRM
from credo.recipes.common import metrics_logger, prepare_run_dir, process_setup, warm_start, warm_start_enabled
from credo.rewards import RewardRunner
from credo.rollout import HFRolloutEngine
from credo.methods.birm.train import label_steps, train_birm
from credo.methods.birm.search import beam_search, best_of_n
from credo.tracking.progress import StepProgress
from credo.tracking.atomic import atomic_write_text
from credo.types import SamplingParams

log = logging.getLogger(__name__)


def birm_train(cfg: RunConfig, *, run_dir: Path | None = None, overwrite: bool = False) -> Path:
    b = cfg.birm
    if run_dir is None and cfg.run_name is None:
        cfg.run_name = f"{cfg.task.name}-rm-birm-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = prepare_run_dir(cfg, run_dir, resume=False, overwrite=overwrite)
    process_setup(cfg)
    data = load_task_data(cfg.task, seed=cfg.seed)
    if data.default_reward is None:
        raise ValueError("rm.method=birm needs a task with a verifier (its step labels are verified continuations)")
    policy, tokenizer, fresh = load_or_build(cfg.model, seed=cfg.seed)
    summary: dict[str, float] = {}
    sampling = SamplingParams.of(cfg.rollout)
    with metrics_logger(cfg, run_dir) as logger, \
            RewardRunner(cfg.reward.name or data.default_reward, fn_kwargs=cfg.reward.kwargs,
                         timeout_s=cfg.reward.timeout_s, workers=cfg.reward.workers,
                         executor=cfg.reward.executor) as runner:
        if warm_start_enabled(cfg, fresh):
            warm_start(cfg, policy, tokenizer, data, logger)
        engine = HFRolloutEngine(policy, tokenizer, seed=cfg.seed, max_batch_size=cfg.rollout.max_batch_size,
                                 lean=cfg.rollout.lean_decode)
        t0 = time.perf_counter()
        samples = label_steps(engine, runner, tokenizer, data.train[: b.prompts], samples=b.samples,
                              rollouts=b.rollouts, step_tokens=b.step_tokens, sampling=sampling,
                              reward_label=b.reward_label)
        summary |= {"label_s": round(time.perf_counter() - t0, 1), "labelled_responses": len(samples),
                    "labelled_correct_frac": sum(s.correct for s in samples) / max(len(samples), 1)}
        log.info("BiRM: %d responses step-labelled in %.0f s", len(samples), summary["label_s"])
        model = LogRatioBiRM.from_policy(policy, b.logratio_beta) if b.heads == "logratio" else \
            BiRewardModel.from_policy(policy)
        with StepProgress("BiRM", b.steps, enabled=cfg.log.progress, print_every=cfg.log.print_every) as bar:
            def on_step(step: int, metrics: dict[str, float]) -> None:
                logger.log(step, metrics)
                bar.update(step, metrics)

            train_birm(model, tokenizer, samples, steps=b.steps, batch_size=b.batch_size, lr=b.lr,
                       loss_on_llm=b.loss_on_llm, seed=cfg.seed, grad_clip=cfg.train.grad_clip, on_step=on_step)
        held_out = data.eval[: b.eval_prompts]
        final = best_of_n(engine, runner, model, tokenizer, held_out, n=b.best_of, sampling=sampling,
                          step_tokens=b.step_tokens, beta=b.beta, agg=b.agg)
        final |= greedy_and_beam(cfg, engine, runner, model, tokenizer, held_out, sampling)
        logger.log(b.steps, final)
    model.save(run_dir / "birm")
    tokenizer.save_pretrained(run_dir / "birm")
    summary |= {f"final/{k}": v for k, v in final.items()} | {"eval_prompts": len(held_out), "best_of": b.best_of}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return run_dir


def greedy_and_beam(cfg: RunConfig, engine, runner, model, tokenizer, examples, sampling: SamplingParams
                    ) -> dict[str, float]:
    """Held-out accuracy of the generator's greedy response and of BiRM-guided step-level beam search."""
    b = cfg.birm
    greedy = engine.generate(examples, 1, SamplingParams(greedy=True, max_new_tokens=sampling.max_new_tokens))
    out = {"eval/greedy_acc": _accuracy(runner, [g.response_text for g in greedy], examples)}
    if b.beam_width > 0:
        ids = beam_search(engine, model, tokenizer, examples, beam_width=b.beam_width, expand=b.beam_expand,
                          step_tokens=b.step_tokens, sampling=sampling, beta=b.beta, agg=b.agg)
        texts = [tokenizer.decode(x, skip_special_tokens=True) for x in ids]
        out["eval/beam_acc"] = _accuracy(runner, texts, examples)
    return out


def _accuracy(runner, texts: list[str], examples) -> float:
    return sum(r.correct for r in runner.score(texts, list(examples))) / max(len(examples), 1)
