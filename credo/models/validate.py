"""The config checks that need the model code (registered in :data:`credo.config.validate.VALIDATORS`): the
critic's head arguments build a head (``critic.head``), and vision-language policies (``model.vision``) get only
the paths that carry images."""
from __future__ import annotations

import json
from pathlib import Path

from credo.config.validate import ConfigError, register_validator


@register_validator("critic.head")
def validate_critic_head(cfg) -> None:
    """``critic.head_args`` are arguments ``critic.head`` takes (a small head is built with them)."""
    from credo.models.value import build_head

    c = cfg.critic
    try:
        build_head(c.head, 8, **c.head_args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"critic.head_args: {exc}") from None


def vision_policy(cfg) -> bool:
    """Whether the policy is a vision-language model: a freshly built ``model.arch=llava``, a local directory
    whose config.json names a vision-language type, or a task whose examples carry images."""
    from credo.models.vision import VISION_MODEL_TYPES

    m = cfg.model
    if m.path is None:
        return m.arch == "llava" or cfg.task.name == "shapes"
    from credo.models.hub import cached_model_path

    config = (cached_model_path(m.path) or Path(m.path).expanduser()) / "config.json"  # a hub id: if cached
    try:
        model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    except (OSError, ValueError):
        model_type = None
    return model_type in VISION_MODEL_TYPES or cfg.task.name == "shapes"


@register_validator("model.vision")
def validate_vision(cfg) -> None:
    """Vision-language policies (``model.arch=llava``, image tasks): the paths that cannot carry images refused."""
    m, v = cfg.model, cfg.model.vision
    if m.path is None and m.arch == "llava":
        if v.image_size % v.patch_size:
            raise ConfigError(f"model.vision.image_size: {v.image_size} must be a multiple of model.vision.patch_size="
                              f"{v.patch_size}")
        if v.hidden % v.heads:
            raise ConfigError(f"model.vision.hidden: {v.hidden} must be divisible by model.vision.heads={v.heads}")
    if m.path is None and cfg.task.name == "shapes" and m.arch != "llava":
        raise ConfigError(f"task.name=shapes: its examples are images; set model.arch=llava (got {m.arch!r})")
    if not vision_policy(cfg):
        return
    if cfg.rollout.engine == "vllm":
        raise ConfigError("rollout.engine=vllm: not implemented for vision-language policies (credo sends vLLM token "
                          "ids, not images); use rollout.engine=hf")
    if cfg.train.pack:
        raise ConfigError("train.pack: not implemented with images (packing does not order the images with their "
                          "token blocks); set train.pack=false")
    if cfg.rollout.collector.type != "group":
        raise ConfigError(f"rollout.collector.type={cfg.rollout.collector.type}: not implemented for vision-language "
                          "policies (single-turn groups only)")
