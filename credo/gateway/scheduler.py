"""The gateway's one engine thread: pending calls batched into ``engine.continue_ids`` calls
(docs/bring-your-own.md; credo.gateway.server).

The rollout engines are not thread-safe and the HF engine is much faster per token in batches, so every call is a
:class:`Job` put on a queue; one thread takes the first pending job, waits up to ``batch_wait_s`` for more (up to
``concurrency`` jobs), groups them by their stop ids and stop sequences (one ``continue_ids`` call samples every
prefix with the same stops) and generates each group at the longest ``max_new`` of its jobs; a job whose
completion ran past its own ``max_new`` is cut there (``finish_reason`` "length"): a prefix of a sample is a sample
under the shorter cap, and its log-probs do not change.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from credo.types import SamplingParams


@dataclass
class Result:
    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" (the engine's)
    policy_version: int | None = None


@dataclass
class Job:
    prefix: list[int]
    max_new: int
    stop_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    future: Future = field(default_factory=Future)


class SchedulerStopped(RuntimeError):
    """The scheduler was stopped before the job ran."""


class Scheduler:
    """Runs :class:`Job` s on ``engine`` from one thread (module docstring)."""

    def __init__(self, engine: Any, sampling: SamplingParams, *, concurrency: int, batch_wait_s: float):
        self.engine, self.sampling = engine, sampling
        self.concurrency, self.batch_wait_s = concurrency, batch_wait_s
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self.batches = 0  # continue_ids calls
        self.jobs = 0  # jobs generated
        self.largest = 0  # the largest batch

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="credo-gateway-engine", daemon=True)
                self._thread.start()

    def submit(self, job: Job) -> Future:
        with self._lock:
            if self._stopped:
                raise SchedulerStopped("the gateway is stopping")
            self._queue.put(job)
        return job.future

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop after the batch in progress; jobs still queued fail with :class:`SchedulerStopped`."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout_s)
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None and job.future.set_running_or_notify_cancel():
                job.future.set_exception(SchedulerStopped("the gateway stopped before this call was generated"))

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            batch, stop = self._collect(job)
            groups: dict[tuple, list[Job]] = {}
            for j in batch:
                groups.setdefault((j.stop_ids, j.stop_sequences), []).append(j)
            for jobs in groups.values():
                self._generate(jobs)
            if stop:
                return

    def _collect(self, first: Job) -> tuple[list[Job], bool]:
        """``first`` and the jobs arriving within ``batch_wait_s`` (at most ``concurrency``); whether the stop
        sentinel was met."""
        batch, deadline = [first], time.monotonic() + self.batch_wait_s
        while len(batch) < self.concurrency:
            left = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return batch, True
            batch.append(job)
        return batch, False

    def _generate(self, jobs: list[Job]) -> None:
        live = [j for j in jobs if j.future.set_running_or_notify_cancel()]  # a cancelled call is not generated
        if not live:
            return
        sp = replace(self.sampling, max_new_tokens=max(j.max_new for j in live))
        try:
            conts = self.engine.continue_ids([j.prefix for j in live], sp, stop_ids=live[0].stop_ids,
                                             stop_sequences=live[0].stop_sequences)
        except Exception as exc:  # noqa: BLE001 - every waiting call learns of it; the thread goes on
            for j in live:
                j.future.set_exception(exc)
            return
        version = getattr(self.engine, "policy_version", None)
        self.batches += 1
        self.jobs += len(live)
        self.largest = max(self.largest, len(live))
        for j, c in zip(live, conts):
            ids, logprobs, finish = list(c.ids), [float(x) for x in c.logprobs], c.finish_reason
            if len(ids) > j.max_new:
                ids, logprobs, finish = ids[:j.max_new], logprobs[:j.max_new], "length"
            j.future.set_result(Result(ids, logprobs, finish, version))
