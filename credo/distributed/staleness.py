"""Bounded-staleness asynchronous rollouts (``rollout.max_staleness: K``, ``rollout.partial``; docs/async.md).

One background thread generates the batches ahead of the trainer, in order, on the engine's own copy of the
policy. The schedule is fixed by policy versions, never by the wall clock, so a run is reproducible and resumes
exactly:

    batch s (trained at step s) is sampled by policy  v(s) = max(0, s - K)           (staleness min(s, K) <= K)
    partial: token d of batch s by                    v(s, d) = clamp(s - K + d // c, 0, max(s - 1, 0)),
                                                      c = ceil(max_new_tokens / K)

At step t the trainer publishes policy t (a detached copy of its weights) and batches up to t + K are queued
(:meth:`AsyncPipeline.fill`): each may start once its first version is published, so up to K batches are generated
ahead. With partial rollouts the generation of batch s passes through K policy versions: between decode steps the
engine takes the next version's weights (:class:`credo.rollout.hf.DecodeHook`), waiting for its publication, and
records each token's version and its behaviour log-prob as sampled; a finished row keeps the versions it had.
Partial rollouts draw their sampling keys from the pipeline's own stream (a copy of the engine's generator taken
when the pipeline starts): an evaluation, which may run while a batch waits for a version, does not move it.
K = 1 without partial rollouts is today's one-step-off mode (:class:`credo.collect.group.Prefetch`); K = 1 with
partial rollouts runs this pipeline and samples the same tokens (no switch falls inside a batch).

Checkpoints: without partial rollouts the queued batches are finished (their versions are all published) and
saved; with partial rollouts a queued batch may wait for a version that does not exist yet, so the checkpoint
holds what replays them exactly instead: the key stream's and collector's state at the start of the first
unconsumed batch and the published weights from its first version on (up to K copies of the policy).

Memory: up to K + 1 published copies of the weights are kept (a copy is dropped once no queued batch can read it).
"""
from __future__ import annotations

import copy
import threading
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable

import torch

from credo.train.fsdp import full_state_dict, is_sharded
from credo.tracking.timer import Timer

WAIT_S = 0.2  # how often a waiting thread re-checks that the pipeline was not closed


class PipelineClosed(RuntimeError):
    """The run ended while the pipeline's thread was waiting (for a job or a policy version)."""


@dataclass(frozen=True)
class StalenessSchedule:
    """Which policy version samples which batch (and, with partial rollouts, which decode step)."""

    k: int  # rollout.max_staleness, >= 1
    partial: bool = False
    max_new_tokens: int = 1

    def start_version(self, batch: int) -> int:
        """v(s) = max(0, s - K): the version that samples batch ``batch``'s first token."""
        return max(0, batch - self.k)

    def version_at(self, batch: int, step: int) -> int:
        """The version of batch ``batch``'s decode step ``step``: v(s) without partial rollouts, else
        clamp(s - K + step // c, 0, max(s - 1, 0)) with c = ceil(max_new_tokens / K)."""
        if not self.partial:
            return self.start_version(batch)
        seg = -(-self.max_new_tokens // self.k)  # ceil
        return min(max(batch - self.k + step // seg, 0), max(batch - 1, 0))


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's whole weights, detached copies (an FSDP2 policy's are gathered: every rank calls it)."""
    if is_sharded(model):
        return full_state_dict(model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def staleness_metrics(trajs, step: int, k: int) -> dict[str, float]:
    """Staleness of the loss tokens trained at ``step``: ``step - version`` of each token whose response_mask is
    1 (a token's own version under partial rollouts, else its response's). Metrics ``rollout/staleness_mean``,
    ``rollout/staleness_max`` and ``rollout/staleness_hist/<d>`` (share of the tokens d versions old, for
    d = 0..K and any older d that occurs, e.g. replayed samples)."""
    counts: Counter = Counter()
    for t in trajs:
        versions = getattr(t, "token_versions", None) or [t.policy_version] * len(t.response_ids)
        counts.update(step - v for v, m in zip(versions, t.response_mask) if m)
    total = sum(counts.values())
    if not total:
        return {}
    out = {f"rollout/staleness_hist/{d}": counts.get(d, 0) / total for d in sorted(set(range(k + 1)) | set(counts))}
    out["rollout/staleness_mean"] = sum(d * n for d, n in counts.items()) / total
    out["rollout/staleness_max"] = float(max(counts))
    return out


class _Hook:
    """The engine's :class:`credo.rollout.hf.DecodeHook` for the pipeline's current batch."""

    def __init__(self, pipeline: "AsyncPipeline", recompute_kv: bool) -> None:
        self.pipeline, self.recompute_kv = pipeline, recompute_kv
        self.batch = 0
        self.generator = torch.Generator(device="cpu")  # continues the engine's stream, apart from evaluations
        self.generator.set_state(pipeline.engine.generator.get_state())

    def applies(self) -> bool:
        return threading.current_thread() is self.pipeline.thread

    def before_step(self, step: int) -> bool:
        return self.pipeline.serve(self.pipeline.schedule.version_at(self.batch, step))


class AsyncPipeline:
    """The background generation of batches ahead of the trainer (module docstring). ``collect(batch, timer)``
    collects one batch on ``engine`` (the coordinator's collection); ``collector`` is the run's collector (its
    state is part of a partial-rollout checkpoint); ``on_load(weights, version)`` runs after each weight load (the
    weight_sync guard)."""

    def __init__(self, schedule: StalenessSchedule, *, engine, collector, collect: Callable[[int, Timer], Any],
                 steps: int, recompute_kv: bool = False,
                 on_load: Callable[[dict[str, torch.Tensor], int], None] | None = None) -> None:
        self.schedule, self.engine, self.collector, self.collect_fn = schedule, engine, collector, collect
        self.steps, self.on_load = steps, on_load
        self.cv = threading.Condition()
        self.weights: dict[int, dict[str, torch.Tensor]] = {}  # published versions
        self.jobs: deque[int] = deque()  # batches queued, not started
        self.results: dict[int, tuple[Any, Timer | None, BaseException | None]] = {}
        self.next = 0  # the next batch to queue
        self.taken = -1  # the last batch the trainer took
        self.running = self.blocked = self.closed = False
        self.replay: dict[str, Any] | None = None  # a resumed partial run: states to start the replay from
        self.thread: threading.Thread | None = None
        self.starts: dict[int, tuple[torch.Tensor, dict]] = {}  # partial: key stream / collector state per batch
        self.hook = _Hook(self, recompute_kv) if schedule.partial else None
        if self.hook is not None:
            engine.decode_hook = self.hook

    # ------------------------------------------------------------------ the trainer's side

    def publish(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Policy ``version``'s weights (a detached copy) are available to the batches that need them."""
        with self.cv:
            self.weights[version] = weights
            self.cv.notify_all()

    def fill(self, step: int) -> None:
        """Queue the batches up to ``step + K`` (and before the last step) whose first version is published."""
        with self.cv:
            if self.replay is not None:  # a resumed partial run starts replaying from the saved states
                self.hook.generator.set_state(self.replay["generator"])
                self.collector.load_state_dict(self.replay["collector"])
                self.replay = None
            while self.next < self.steps and self.next <= step + self.schedule.k \
                    and self.schedule.start_version(self.next) in self.weights:
                self.jobs.append(self.next)
                self.next += 1
            self.cv.notify_all()
        if self.thread is None and self.jobs:
            self.thread = threading.Thread(target=self._work, name="credo-async-rollout", daemon=True)
            self.thread.start()

    def take(self, batch: int, timer: Timer | None = None):
        """Batch ``batch``'s rollouts (waiting for them); its stage times are added to ``timer``."""
        with self.cv:
            if not self.taken < batch < self.next:
                raise RuntimeError(f"async rollouts: batch {batch} is not queued (queued: {self.taken + 1} to "
                                   f"{self.next - 1})")
            self._wait(lambda: batch in self.results)
            rollouts, job_timer, error = self.results.pop(batch)
            self.taken = batch
            floor = self.schedule.start_version(batch + 1)  # no later batch reads an older version
            for v in [v for v in self.weights if v < floor]:
                del self.weights[v]
            for s in [s for s in self.starts if s <= batch]:
                del self.starts[s]
        if error is not None:
            raise error
        if timer is not None and job_timer is not None:
            for name, seconds in job_timer.seconds.items():
                timer.seconds[name] += seconds
        return rollouts

    def idle(self) -> None:
        """Wait until the engine is free for another caller: every queued batch done, or the thread waiting for a
        version not yet published."""
        with self.cv:
            self._wait(lambda: self.blocked or (not self.jobs and not self.running))

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=30)
        if self.hook is not None and getattr(self.engine, "decode_hook", None) is self.hook:
            self.engine.decode_hook = None

    # ------------------------------------------------------------------ the thread

    def serve(self, version: int) -> bool:
        """The engine serves ``version`` (waiting for its publication); True if its weights changed."""
        if self.engine.policy_version == version:
            return False
        with self.cv:
            if version not in self.weights:  # the engine is free for others (an evaluation) while this waits
                self.blocked = True
                self.cv.notify_all()
                try:
                    self._wait(lambda: version in self.weights)
                finally:
                    self.blocked = False
            weights = self.weights[version]
        self.engine.update_weights(weights, version=version)
        if self.on_load is not None:
            self.on_load(weights, version)
        return True

    def _work(self) -> None:
        while True:
            with self.cv:
                try:
                    self._wait(lambda: bool(self.jobs))
                except PipelineClosed:
                    return
                batch = self.jobs.popleft()
                self.running = True
                if self.schedule.partial:
                    self.starts[batch] = (self.hook.generator.get_state(), copy.deepcopy(self.collector.state_dict()))
                    self.cv.notify_all()
            timer, rollouts, error = Timer(), None, None
            try:
                if self.hook is not None:
                    self.hook.batch = batch
                self.serve(self.schedule.version_at(batch, 0))
                rollouts = self.collect_fn(batch, timer)
            except PipelineClosed:
                return
            except BaseException as exc:  # re-raised by take() in the trainer's thread
                error = exc
            with self.cv:
                self.results[batch] = (rollouts, timer, error)
                self.running = False
                self.cv.notify_all()

    def _wait(self, ready: Callable[[], bool]) -> None:
        """Wait on the condition (held) until ``ready()``; PipelineClosed once the pipeline is closed."""
        while not ready():
            if self.closed:
                raise PipelineClosed("async rollouts: the pipeline was closed")
            self.cv.wait(WAIT_S)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Without partial rollouts: every queued batch, finished. With them: what replays the unconsumed batches
        (module docstring). Call it before saving the engine's and the collector's states."""
        if not self.schedule.partial:
            self.idle()
            with self.cv:
                done = {s: r for s, (r, _, err) in self.results.items() if err is None}
            return {"next": self.next, "done": done, "replay": None}
        with self.cv:
            first = self.taken + 1
            if first >= self.next:
                return {"next": self.next, "done": {}, "replay": None}
            self._wait(lambda: first in self.starts)
            key_state, collector_state = self.starts[first]
            floor = self.schedule.start_version(first)
            weights = {v: w for v, w in self.weights.items() if v >= floor}
        return {"next": first, "done": {}, "replay": {"generator": key_state, "collector": collector_state,
                                                     "weights": weights}}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        with self.cv:
            self.next = saved["next"]
            self.taken = self.next - 1 - len(saved["done"])
            self.results = {s: (r, None, None) for s, r in saved["done"].items()}
            if saved["replay"] is not None:
                self.weights.update(saved["replay"]["weights"])
                self.replay = saved["replay"]
