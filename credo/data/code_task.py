"""The built-in ``code`` task: 45 small stdin/stdout programming problems written for credo.

Each problem has a short description (the prompt), a reference Python solution (the SFT
demonstration) and 5-6 tests. The prompt is ``"# <description>\\n"`` and the response is a Python
program; the default reward is ``code_pass_rate`` on the sandbox. Held-out evaluation uses problems
never seen in training (``build_splits`` holds out whole prompts). The test suite judges every
reference solution in the sandbox (``tests/data/test_code_task.py``).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from credo.data.tasks import Task, register_task
from credo.types import Example

PROBLEMS_FILE = Path(__file__).with_name("code_problems.json")


@lru_cache(maxsize=1)
def load_problems() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(PROBLEMS_FILE.read_text()))


@register_task("code")
@dataclass
class CodeTask(Task):
    default_reward = "code_pass_rate"

    def make_example(self, rng: random.Random, index: int, split: str) -> Example:
        p = rng.choice(load_problems())
        return Example(prompt=f"# {p['description']}\n", answer=p["solution"], uid=self._uid(split, index),
                       meta={"tests": p["tests"], "language": "python", "problem": p["id"]})
