"""Configuration: typed dataclasses (:mod:`credo.config.schema`) loaded from YAML presets with overrides."""
from credo.config.loader import (
    ConfigError,
    config_from_dict,
    config_to_dict,
    dump_config,
    load_config,
    load_config_sources,
    load_run_config,
    parse_override,
    resolve_preset,
)
from credo.config.schema import (
    AlgoConfig,
    CheckpointConfig,
    CriticConfig,
    EntropySelectConfig,
    EvalConfig,
    GroupCollectorConfig,
    LogConfig,
    ModelConfig,
    NoSelectConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
    WarmStartConfig,
)

__all__ = [
    "AlgoConfig", "CheckpointConfig", "ConfigError", "CriticConfig", "EntropySelectConfig", "EvalConfig", "GroupCollectorConfig", "LogConfig", "ModelConfig", "NoSelectConfig", "RewardConfig",
    "RolloutConfig", "RunConfig", "TaskConfig", "TrainConfig", "WarmStartConfig", "config_from_dict",
    "config_to_dict", "dump_config", "load_config", "load_config_sources", "load_run_config", "parse_override", "resolve_preset",
]
