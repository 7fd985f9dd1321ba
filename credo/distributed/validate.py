"""The config check of the asynchronous rollout modes (registered in :data:`credo.config.validate.VALIDATORS` as
``rollout.async``; it ran when the run's :class:`credo.distributed.coordinator.RolloutCoordinator` was built, now
when the config is loaded). Imports nothing but the config helpers: it is imported whenever a config is checked."""
from __future__ import annotations

from credo.config.validate import ConfigError, register_validator


@register_validator("rollout.async")
def check_async(cfg) -> None:
    """ConfigError for the bounded-staleness modes credo does not implement."""
    r, d = cfg.rollout, cfg.distributed
    if r.partial and not r.max_staleness:
        raise ConfigError("rollout.partial: needs rollout.max_staleness >= 1 (partial rollouts span policy versions)")
    if (r.max_staleness >= 2 or r.partial) and (d.backend == "ray" or r.engine != "hf"):
        raise ConfigError("rollout.max_staleness >= 2 / rollout.partial: not implemented with Ray or "
                          "rollout.engine=vllm (the pipeline loads each batch's version into an in-process hf "
                          "engine); use max_staleness 1 (one_step_off) there")
    if r.partial and r.collector.type != "group":
        raise ConfigError(f"rollout.partial: not implemented with rollout.collector.type={r.collector.type} "
                          "(the version schedule is by decode step of a single-turn generation)")
