"""Counting the tokens a rollout engine samples, for ``train.budget=sampled_tokens`` (docs/evidence.md, "Budgets").

:class:`SampledTokens` wraps an engine's ``generate`` (each trajectory's response tokens) and ``continue_ids`` (each
continuation's tokens) on the instance (the outermost call on a thread counts: an engine's ``generate`` that calls its
own ``continue_ids`` is counted once), so every collector, tree, branch, agent turn and gateway call that goes
through the engine is counted, whatever method drives it. Calls made inside :meth:`SampledTokens.paused` on the same
thread (the held-out evaluation) are not counted.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Iterator


class SampledTokens:
    """A running count of sampled response tokens; :meth:`take` returns what was sampled since the last take."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self.total = 0
        self._taken = 0

    def attach(self, engine: Any) -> Any:
        """Wrap ``engine.generate`` and ``engine.continue_ids`` (those it has) on the instance; returns ``engine``."""
        for name, count in (("generate", _trajectory_tokens), ("continue_ids", _continuation_tokens)):
            inner = getattr(engine, name, None)
            if callable(inner):
                setattr(engine, name, self._counted(inner, count))
        return engine

    def _counted(self, inner, count):
        @functools.wraps(inner)
        def call(*args, **kwargs):
            depth = getattr(self._local, "depth", 0)
            self._local.depth = depth + 1  # an engine's generate may call its own continue_ids: count the outer call
            try:
                out = inner(*args, **kwargs)
            finally:
                self._local.depth = depth
            if depth == 0 and not getattr(self._local, "paused", False):
                with self._lock:
                    self.total += count(out)
            return out
        return call

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Calls from this thread inside the block are not counted (nested blocks allowed)."""
        before = getattr(self._local, "paused", False)
        self._local.paused = True
        try:
            yield
        finally:
            self._local.paused = before

    def take(self) -> int:
        with self._lock:
            delta, self._taken = self.total - self._taken, self.total
        return delta


def _trajectory_tokens(trajs) -> int:
    return sum(len(t.response_ids) for t in trajs)


def _continuation_tokens(conts) -> int:
    return sum(len(c.ids) for c in conts)
