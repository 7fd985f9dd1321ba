"""Counting the tokens a rollout engine samples, for ``train.budget=sampled_tokens`` (docs/evidence.md, "Budgets").

:class:`SampledTokens` wraps an engine's ``generate`` (each trajectory's response tokens) and ``continue_ids`` (each
continuation's tokens) on the instance, so every collector, tree, branch, agent turn and greedy baseline that goes
through the engine is counted, whatever method drives it. The outermost call on a thread counts: an engine's
``generate`` that calls its own ``continue_ids`` is counted once.

A call's tokens go to the innermost :meth:`SampledTokens.scope` open on the calling thread. The coordinator opens
one around each collection (credo.distributed.coordinator: the count travels with the batch, as
``perf/sampled_tokens_collect``, also when a background thread sampled it one or more steps ahead, and is restored
with a batch in flight from a checkpoint), the loop one around each step (what else the step sampled, e.g. greedy
baselines). Calls on a thread with no open scope (an OpenAI-compatible gateway's scheduler thread) are counted when
they happen and taken at the end of the step (:meth:`SampledTokens.take_loose`; not reproducible across a resume).
Calls inside :meth:`SampledTokens.paused` on the same thread (the held-out evaluation) are not counted.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass
class Tally:
    tokens: int = 0


class SampledTokens:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._loose = 0

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
            self._local.depth = depth + 1
            try:
                out = inner(*args, **kwargs)
            finally:
                self._local.depth = depth
            if depth == 0 and not getattr(self._local, "paused", False):
                self._add(count(out))
            return out
        return call

    def _add(self, n: int) -> None:
        stack = getattr(self._local, "scopes", None)
        if stack:
            stack[-1].tokens += n
        else:
            with self._lock:
                self._loose += n

    @contextlib.contextmanager
    def scope(self) -> Iterator[Tally]:
        """The tokens sampled on this thread inside the block, nested scopes excluded (they count their own)."""
        stack = getattr(self._local, "scopes", None)
        if stack is None:
            stack = self._local.scopes = []
        tally = Tally()
        stack.append(tally)
        try:
            yield tally
        finally:
            stack.pop()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Calls from this thread inside the block are not counted (nested blocks allowed)."""
        before = getattr(self._local, "paused", False)
        self._local.paused = True
        try:
            yield
        finally:
            self._local.paused = before

    def take_loose(self) -> int:
        """Tokens sampled outside any scope since the last call."""
        with self._lock:
            n, self._loose = self._loose, 0
        return n


def _trajectory_tokens(trajs) -> int:
    return sum(len(t.response_ids) for t in trajs)


def _continuation_tokens(conts) -> int:
    return sum(len(c.ids) for c in conts)
