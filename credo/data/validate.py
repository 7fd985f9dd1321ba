"""The config check of the task (registered in :data:`credo.config.validate.VALIDATORS` as ``task``):
``task.name`` is a registered task (or ``file``, ``hf``, or ``rg:<dataset>``), ``task.params`` are parameters it takes and
build it."""
from __future__ import annotations

from credo.config.validate import ConfigError, did_you_mean, register_validator, wrap


@register_validator("task")
def validate_task(cfg) -> None:
    from credo.data import get_task, list_tasks, task_param_names

    t = cfg.task
    if t.name in ("file", "hf"):  # a dataset (task.train_file / task.dataset: credo.config.validate)
        return
    if t.name not in list_tasks() and not t.name.startswith("rg:"):  # rg:<dataset>: reasoning-gym
        raise ConfigError(f"task.name: unknown task {t.name!r}{did_you_mean(t.name, list_tasks())}; tasks: "
                          f"{', '.join(list_tasks())}, file, hf")
    wrap("task.name", lambda: task_param_names(t.name))
    known = task_param_names(t.name)
    for key in t.params:
        if key not in known:
            raise ConfigError(f"task.params.{key}: task {t.name!r} has no parameter {key!r}"
                              f"{did_you_mean(key, known)}; it takes: {', '.join(known)}")
    wrap("task.params", lambda: get_task(t.name, curriculum=t.curriculum, **t.params))
