"""Configuration: typed dataclasses (:mod:`credo.config.schema`) loaded from YAML presets with overrides."""
from credo.config.loader import (
    ConfigError,
    config_from_dict,
    config_to_dict,
    dump_config,
    load_config,
    parse_override,
    resolve_preset,
)
from credo.config.schema import (
    AgentConfig,
    AlgoConfig,
    CheckpointConfig,
    CriticConfig,
    EvalConfig,
    LogConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TaskConfig,
    TrainConfig,
    WarmStartConfig,
)

__all__ = [
    "AgentConfig", "AlgoConfig", "CheckpointConfig", "ConfigError", "CriticConfig", "EvalConfig", "LogConfig", "ModelConfig", "RewardConfig",
    "RolloutConfig", "RunConfig", "TaskConfig", "TrainConfig", "WarmStartConfig", "config_from_dict",
    "config_to_dict", "dump_config", "load_config", "parse_override", "resolve_preset",
]
