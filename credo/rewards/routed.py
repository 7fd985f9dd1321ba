"""Per-row verifiers: each example is scored by the verifier its ``data_source`` names (verl's way of mixing
datasets in one file: ``default_compute_score`` dispatches on ``data_source``).

``reward.by_data_source: {openai/gsm8k: math, countdown: countdown}`` routes the rows whose ``data_source`` field
(``Example.meta["data_source"]``, a top-level column of the file) is a key to that verifier; every other row keeps
the run's verifier (``reward.name``, else the task's default). A batch is split by route, each part scored by its
own :class:`~credo.rewards.runner.RewardRunner` (so each keeps its executor, timeouts and failure accounting), and
the results are put back in the batch's order.
"""
from __future__ import annotations

from typing import Any, Sequence

from credo.types import Example, RewardResult

DATA_SOURCE = "data_source"


class RoutedRunner:
    """Scores each example with ``routes[example.meta["data_source"]]``, else with ``default``."""

    def __init__(self, default: Any, routes: dict[str, Any]):
        self.default, self.routes = default, routes
        self.failure_score = getattr(default, "failure_score", 0.0)

    def runner_for(self, example: Example) -> Any:
        source = example.meta.get(DATA_SOURCE)
        return self.default if source is None else self.routes.get(str(source), self.default)

    def score(self, responses: Sequence[str], examples: Sequence[Example]) -> list[RewardResult]:
        parts: dict[int, tuple[Any, list[int]]] = {}
        for i, ex in enumerate(examples):
            runner = self.runner_for(ex)
            parts.setdefault(id(runner), (runner, []))[1].append(i)
        out: list[RewardResult | None] = [None] * len(examples)
        for runner, rows in parts.values():
            for i, result in zip(rows, runner.score([responses[i] for i in rows], [examples[i] for i in rows])):
                out[i] = result
        return out  # type: ignore[return-value]

    def close(self) -> None:
        for runner in {id(r): r for r in (self.default, *self.routes.values())}.values():
            runner.close()

    def __enter__(self) -> "RoutedRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
