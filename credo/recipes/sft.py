"""Supervised fine-tuning on task demonstrations (``credo sft``), and evaluation of a model (``credo eval``).

``credo sft`` uses the ``warm_start.*`` settings (steps, batch size, lr), evaluates before and
after, and writes ``RUN_DIR/final`` as a Hugging Face directory that ``credo train
model.path=RUN_DIR/final`` can start from.
"""
from __future__ import annotations

from pathlib import Path

from credo.config import RunConfig, load_config
from credo.data.source import format_prompts, load_task_data
from credo.models import load_model, load_or_build, save_model
from credo.models.vision import expand_image_prompts
from credo.recipes.common import (
    load_data,
    metrics_logger,
    prepare_run_dir,
    reward_runner,
    run_eval,
    process_setup,
    warm_start,
    write_summary,
)
from credo.rollout import HFRolloutEngine
from credo.train.checkpoint import write_manifest


def sft(cfg: RunConfig, *, run_dir: Path | None = None, overwrite: bool = False) -> Path:
    if cfg.model.lora is not None:
        raise NotImplementedError("credo sft with model.lora is not implemented: it would fine-tune the whole model; "
                                  "LoRA is for credo train (docs/lora.md)")
    if run_dir is None and cfg.run_name is None:
        from datetime import datetime

        cfg.run_name = f"{cfg.task.name}-sft-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = prepare_run_dir(cfg, run_dir, resume=False, overwrite=overwrite)
    process_setup(cfg)
    data = load_task_data(cfg.task, seed=cfg.seed)
    model, tokenizer, _ = load_or_build(cfg.model, seed=cfg.seed)
    data = format_prompts(data, tokenizer, template=cfg.task.prompt_template, chat=cfg.task.chat_template)
    data = expand_image_prompts(data, model)
    with reward_runner(cfg, data) as runner, metrics_logger(cfg, run_dir) as logger:
        engine = HFRolloutEngine(model, tokenizer, seed=cfg.seed, max_batch_size=cfg.rollout.max_batch_size,
                                 lean=cfg.rollout.lean_decode)
        before = run_eval(cfg, engine, runner, data, run_dir, step=0)
        logger.log(0, before)
        warm_start(cfg, model, tokenizer, data, logger)
        after = run_eval(cfg, engine, runner, data, run_dir, step=cfg.warm_start.steps)
        logger.log(cfg.warm_start.steps, after)
    save_model(model, tokenizer, run_dir / "final")
    write_manifest(run_dir / "final")
    write_summary(cfg, run_dir, model, start_eval=before, last_eval=after, extra={"sft_steps": cfg.warm_start.steps})
    return run_dir


def evaluate_target(target: Path, config: str | None, overrides: list[str]) -> dict[str, float]:
    """Evaluate a run directory (its config and final model or latest checkpoint), a checkpoint or a model dir."""
    cfg, model_dir = resolve_target(target, config, overrides)
    process_setup(cfg)
    data = load_data(cfg, cfg.seed)  # an agent run's are the held-out tasks of its environments
    model, tokenizer = load_model(model_dir, cfg.model)
    data = format_prompts(data, tokenizer, template=cfg.task.prompt_template, chat=cfg.task.chat_template)
    data = expand_image_prompts(data, model)
    with reward_runner(cfg, data) as runner:
        engine = HFRolloutEngine(model, tokenizer, seed=cfg.seed, max_batch_size=cfg.rollout.max_batch_size,
                                 lean=cfg.rollout.lean_decode)
        examples = data.eval[: cfg.eval.size] if cfg.eval.size else data.eval
        from credo.collect.evaluate import evaluate

        from credo.collect.registry import COLLECTOR_EVALS

        if cfg.rollout.collector.type in COLLECTOR_EVALS:  # the collector's own (agent RL: episodes in the envs)
            metrics = COLLECTOR_EVALS.get(cfg.rollout.collector.type)(cfg, engine, runner, examples, seed=cfg.seed)
            return {"model": str(model_dir), "examples": len(examples), **metrics}
        metrics = evaluate(engine, runner, examples, k=cfg.eval.k, temperature=cfg.eval.temperature,
                           max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed, pass_k=cfg.eval.pass_k)
    return {"model": str(model_dir), "examples": len(examples), **metrics}


def resolve_target(target: Path, config: str | None, overrides: list[str]) -> tuple[RunConfig, Path]:
    """(config, model directory) of a run directory (its final model, else its latest checkpoint), a checkpoint
    directory (RUN/checkpoints/step_N: its model, the run's config), a Hugging Face model directory or a hub id
    ``org/name[@revision]`` (credo.models.hub; ``config`` and the overrides, or the defaults)."""
    from credo.train.checkpoint import latest_checkpoint
    from credo.tracking.rundir import check_run_dir

    target = Path(target)
    if (target / "config.yaml").is_file() and not (target / "config.json").is_file():
        check_run_dir(target, "credo eval")  # a run directory: no links out, no plugin imported from it
        cfg = load_config(config or str(target / "config.yaml"), overrides, untrusted_dir=target)
        ckpt = latest_checkpoint(target)
        model_dir = target / "final" if (target / "final").is_dir() else (ckpt / "model" if ckpt else None)
        if model_dir is None:
            raise FileNotFoundError(f"{target} has neither final/ nor a complete checkpoint")
        return cfg, model_dir
    if (target / "model").is_dir() and (target.parent.parent / "config.yaml").is_file():  # a checkpoint
        check_run_dir(target.parent.parent, "credo eval")
        return (load_config(config or str(target.parent.parent / "config.yaml"), overrides,
                            untrusted_dir=target.parent.parent), target / "model")
    from credo.models.hub import hub_id_of, resolve_model_path

    if not target.is_dir() and hub_id_of(str(target)) is not None:  # a hub id: its snapshot (credo.models.hub)
        cfg = load_config(config, overrides)
        return cfg, resolve_model_path(str(target), key="credo eval", trust_remote_code=cfg.model.trust_remote_code)
    if not target.is_dir():
        raise FileNotFoundError(f"{target} is not a run, checkpoint or model directory")
    return load_config(config, overrides), target
