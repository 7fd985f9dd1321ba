"""Preemption: SIGTERM / SIGUSR1 end a training run with a checkpoint instead of losing its last steps.

Slurm (``--signal``) and Kubernetes (before ``terminationGracePeriodSeconds`` runs out) send SIGTERM, or a
signal of the user's choice, some time before they kill a job. While :class:`StopSignals` is active (around the RL
loop; ``checkpoint.on_signal``, on by default), the first such signal only records itself: the loop finishes the
step in progress, writes a checkpoint (unless that step just wrote one) and stops with :class:`Preempted`
(``credo: preempted: ...``, exit code 75); ``credo train --resume RUN`` continues exactly where it stopped. A
second signal abandons the step at once (:class:`Preempted` raised from the handler; the previous checkpoint is
intact). With data parallelism every rank checks, after each step, whether any rank got a signal (one all-reduce),
so all ranks stop after the same step. Handlers are installed only in the main thread and not under
``distributed.backend=ray`` (a Ray run's driver, not its rank actors, gets the signal: it stops at once).
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from credo.errors import EXIT_PREEMPTED, RunStopped

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(RunStopped):
    """The run stopped on a preemption signal (after a checkpoint, unless a second signal abandoned the step)."""

    label = "preempted"
    exit_code = EXIT_PREEMPTED


class StopSignals:
    """``with StopSignals(enabled) as stop:`` ... ``stop.requested(dp)`` after each step (module docstring)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # the same on every rank (from the config): requested() is a collective iff enabled
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if self.enabled and threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            raise Preempted(f"a second {name}: the step in progress was abandoned without a checkpoint; the last "
                            f"complete checkpoint is intact (credo train --resume RUN_DIR continues from it)")
        self.received = signum
        log.warning("credo: %s received: finishing this step, then writing a checkpoint and exiting with code %d "
                    "(a second %s stops at once)", name, EXIT_PREEMPTED, name)

    def requested(self, dp: Any = None) -> str | None:
        """The signal's name when this process (or, with data parallelism, any rank) got one, else None. Every
        rank must call it after the same step: with ``dp.enabled`` it is a collective."""
        if not self.enabled:
            return None
        flag = 0 if self.received is None else int(self.received)
        if dp is not None and dp.enabled:
            flag = dp.max_over_ranks(flag)
        return signal.Signals(flag).name if flag else None
