"""Progress display: a rich progress bar on a terminal, plain lines otherwise (logs, CI)."""
from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_SHOWN = (("reward/mean", "reward", "{:.3f}"), ("acc/mean", "acc", "{:.2f}"), ("eval/greedy_acc", "eval", "{:.2f}"),
          ("actor/entropy", "ent", "{:.3f}"), ("response_length/mean", "len", "{:.1f}"), ("sft/loss", "loss", "{:.3f}"))


def summarize(metrics: dict[str, Any]) -> str:
    parts = []
    for key, label, fmt in _SHOWN:
        if metrics.get(key) is not None:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    return "  ".join(parts)


class StepProgress:
    """``with StepProgress("rl", total, start) as bar: bar.update(step, metrics)``."""

    def __init__(self, description: str, total: int, start: int = 0, *, enabled: bool = True, print_every: int = 10):
        self.description, self.total, self.start = description, total, start
        self.print_every = print_every
        self.console = Console(stderr=True)
        self.live = enabled and self.console.is_terminal
        self.enabled = enabled
        self.last: dict[str, Any] = {}
        self._t0 = time.time()
        self._progress: Progress | None = None

    def __enter__(self) -> "StepProgress":
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=self.console, transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total, completed=self.start, info="")
        return self

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        """``step`` is the number of completed steps."""
        self.last.update({k: v for k, v in metrics.items() if v is not None})
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=summarize(self.last))
        elif self.enabled and (step % self.print_every == 0 or step == self.total):
            elapsed = time.time() - self._t0
            print(f"[{self.description}] {step}/{self.total} {elapsed:6.1f}s  {summarize(self.last)}",
                  file=sys.stderr, flush=True)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
