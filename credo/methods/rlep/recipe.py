"""RLEP's experience pool: ``credo rlep collect`` and the pool a training run replays from.

    credo rlep collect RUN_DIR[/checkpoints/step_N] --out pool.jsonl   # sample, verify, keep, store
    credo train --config rlep replay.pool=pool.jsonl                   # replay it (credo.methods.rlep.pool)

``replay.pool=warm_start`` collects the pool inside the run, from the warm-started policy, before RL starts
(RUN_DIR/replay_pool.jsonl) — a self-contained demo; the paper collects from a later checkpoint of a baseline run.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from credo.config import RunConfig
from credo.data.source import drop_overlong, format_prompts, load_task_data, model_context
from credo.models import load_model
from credo.recipes.common import reward_runner, process_setup
from credo.rollout import HFRolloutEngine
from credo.tracking.progress import StepProgress
from credo.methods.rlep.config import ReplayConfig
from credo.methods.rlep.pool import ReplayOptions, ReplayPool, collect_pool, mix_replay, refresh_entries, step_rng
from credo.types import SamplingParams

log = logging.getLogger(__name__)

POOL_FILE = "replay_pool.jsonl"  # in the run directory, for replay.pool=warm_start


def collect_settings(cfg: RunConfig) -> ReplayConfig:
    """The ``replay`` section's ``collect_*`` keys (their defaults when the config has replay off)."""
    return cfg.replay if cfg.replay is not None else ReplayConfig()


def collect_sampling(cfg: RunConfig) -> SamplingParams:
    r = collect_settings(cfg)
    return SamplingParams(temperature=r.collect_temperature, top_p=r.collect_top_p,
                          max_new_tokens=cfg.rollout.max_new_tokens)


def collect_into(cfg: RunConfig, engine, runner, examples, out: Path, source: dict) -> dict:
    """Collect a pool from ``engine``'s policy over ``examples`` into ``out`` (JSONL) and ``out``.summary.json."""
    r = collect_settings(cfg)
    examples = examples[: r.collect_prompts] if r.collect_prompts else examples
    t0 = time.perf_counter()
    with StepProgress("rlep collect (prompts)", len(examples), enabled=cfg.log.progress,
                      print_every=cfg.log.print_every) as bar:
        entries, stats = collect_pool(engine, runner, examples, samples=r.collect_samples,
                                      sampling=collect_sampling(cfg), min_correct=r.collect_min_correct,
                                      keep_negatives=r.collect_negatives, source=source,
                                      on_chunk=lambda done, total: bar.update(done, {}))
    if not entries:
        raise ValueError(f"no prompt had {r.collect_min_correct} verified answers out of {r.collect_samples} "
                         f"samples (sampled accuracy {stats['sampled_accuracy']:.3f}): nothing to replay; collect "
                         "from a stronger checkpoint or lower replay.collect_min_correct")
    out.parent.mkdir(parents=True, exist_ok=True)
    ReplayPool(entries).save(out)
    stats |= {"collect_s": round(time.perf_counter() - t0, 1), "source": source}
    out.with_name(out.name + ".summary.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info("replay pool: %d answers of %d/%d prompts -> %s", stats["stored_answers"], stats["stored_prompts"],
             stats["prompts"], out)
    return stats


def rlep_collect(target: Path, out: Path, config: str | None, overrides: list[str]) -> dict:
    """``credo rlep collect``: the pool of the model in ``target`` (a run, a checkpoint or a model directory)."""
    from credo.recipes.sft import resolve_target

    cfg, model_dir = resolve_target(target, config, overrides)
    process_setup(cfg)
    data = load_task_data(cfg.task, seed=cfg.seed)
    if data.default_reward is None:
        raise ValueError("credo rlep collect needs a task with a verifier (agent environments are not supported)")
    model, tokenizer = load_model(model_dir, cfg.model)
    data = format_prompts(data, tokenizer, template=cfg.task.prompt_template, chat=cfg.task.chat_template)
    data = drop_overlong(data, tokenizer, cfg.task, context=model_context(model),
                         max_new_tokens=cfg.rollout.max_new_tokens)
    with reward_runner(cfg, data) as runner:
        engine = HFRolloutEngine(model, tokenizer, seed=cfg.seed, max_batch_size=cfg.rollout.max_batch_size,
                                 lean=cfg.rollout.lean_decode)
        return collect_into(cfg, engine, runner, data.train, out, {"model": str(model_dir), "seed": cfg.seed})


def open_replay(cfg: RunConfig, run_dir: Path) -> ReplayPool | None:
    """The run's pool: ``replay.pool``'s file, or the run's own for ``warm_start`` (None before it is collected,
    and when replay is off)."""
    r = cfg.replay
    if r is None or r.pool is None:
        return None
    path = run_dir / POOL_FILE if r.pool == "warm_start" else Path(r.pool)
    if r.pool == "warm_start" and not path.is_file():
        return None
    pool = ReplayPool.load(path, max_per_prompt=r.refresh_max if r.refresh else None)
    log.info("replay pool %s: %d answers, %d prompts (%d malformed rows skipped)", path, len(pool), pool.prompts(),
             pool.bad_rows)
    return pool


def collect_at_start(cfg: RunConfig, engine, runner, data, run_dir: Path) -> ReplayPool:
    """``replay.pool=warm_start``: the pool from the current (warm-started) policy, saved in the run directory."""
    collect_into(cfg, engine, runner, data.train, run_dir / POOL_FILE, {"model": "warm_start", "seed": cfg.seed})
    return open_replay(cfg, run_dir)


def replay_step(cfg: RunConfig, pool: ReplayPool, tokenizer, runner, rollouts, step: int) -> None:
    """One step's replay, in place on ``rollouts`` (credo.types.Rollouts): stored answers join their
    prompts' groups, scored by ``runner`` (the training verifier); with ``replay.refresh`` the fresh answers the
    verifier accepted join the pool."""
    r = cfg.replay
    opts = ReplayOptions(num=r.num, negative=r.negative, fill_missing=r.fill_missing,
                         max_new_tokens=cfg.rollout.max_new_tokens)
    fresh_trajs, fresh_results = list(rollouts.trajs), list(rollouts.results)
    rollouts.trajs, rollouts.results, metrics = mix_replay(fresh_trajs, fresh_results, pool, tokenizer, runner,
                                                           opts=opts, rng=step_rng(cfg.seed, step))
    if r.refresh:
        metrics["replay/refreshed"] = pool.add(refresh_entries(fresh_trajs, fresh_results, step=step))
    rollouts.metrics.update(metrics)
