"""The config check of the rewards (registered in :data:`credo.config.validate.VALIDATORS` as ``reward``): every
verifier named (``reward.name``, ``reward.by_data_source``, ``reward.mix``) resolves, the mix's and the routes'
entries have their shape, and what the reward options cannot serve is refused."""
from __future__ import annotations

from credo.config.validate import ConfigError, register_validator


@register_validator("reward")
def validate_rewards(cfg) -> None:
    validate_reward_mix(cfg)
    if cfg.reward.name is not None:
        check_reward("reward.name", cfg.reward.name)
    validate_routes(cfg)


def validate_reward_mix(cfg) -> None:
    """``reward.mix``: {name, weight, kwargs, executor} entries naming known verifiers; ``reward.noise``: single-turn
    tasks only."""
    r = cfg.reward
    for i, comp in enumerate(r.mix):
        key = f"reward.mix[{i}]"
        if not isinstance(comp, dict) or not isinstance(comp.get("name"), str) \
                or set(comp) - {"name", "weight", "kwargs", "executor"}:
            raise ConfigError(f"{key}: expected {{name: VERIFIER, weight: NUMBER, kwargs: {{...}}}}, got {comp!r}")
        if not isinstance(comp.get("weight", 1.0), (int, float)) or not isinstance(comp.get("kwargs", {}), dict):
            raise ConfigError(f"{key}: weight must be a number and kwargs a mapping, got {comp!r}")
        check_reward(f"{key}.name", comp["name"])
    if r.noise > 0 and cfg.rollout.collector.type == "agent":
        raise ConfigError("reward.noise: single-turn tasks only (agent rewards come from the environments)")


def validate_routes(cfg) -> None:
    """``reward.by_data_source``: data_source -> a verifier name or {name, kwargs}, each verifier resolvable."""
    for source, spec in cfg.reward.by_data_source.items():
        key = f"reward.by_data_source.{source}"
        name = spec.get("name") if isinstance(spec, dict) else spec
        if not isinstance(name, str) or (isinstance(spec, dict) and not set(spec) <= {"name", "kwargs"}) \
                or not isinstance(spec.get("kwargs", {}) if isinstance(spec, dict) else {}, dict):
            raise ConfigError(f"{key}: expected a verifier name or {{name: VERIFIER, kwargs: {{...}}}}, got {spec!r}")
        check_reward(key, name)
    if cfg.reward.by_data_source and cfg.distributed.backend == "ray":
        raise ConfigError("reward.by_data_source: not implemented with distributed.backend=ray (its reward workers "
                          "run one verifier); use one verifier, or backend none / torchrun")


def check_reward(key: str, name: str) -> None:
    """The verifier ``name`` resolves. A user module (``package.module:function``) that fails to import is one
    line naming the key, whatever it raised (a syntax error, an exception of its own at import time)."""
    from credo.rewards import get_reward_fn

    try:
        get_reward_fn(name)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(f"{key}: {msg}") from None
    except Exception as exc:  # noqa: BLE001 - a user module may raise anything while it is imported
        raise ConfigError(f"{key}: importing {name!r} failed: {type(exc).__name__}: {exc}") from None
