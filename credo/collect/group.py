"""Collecting one step's rollouts: generate, score, shape, and (optionally) filter groups.

Group filtering drops prompt groups whose scores are all equal (they carry no GRPO signal).
With ``dynamic_sampling`` (DAPO) more prompts are drawn and generated until ``prompts_per_step``
informative groups are collected or ``max_gen_batches`` generation rounds were used; a short batch
is trained as it is (Klear's behaviour). Without it, dropped groups are simply not trained on
(Archer / ASPO rejection sampling).
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from credo.collect.base import CollectorNeeds
from credo.faults import kill_point
from credo.rewards.shaping import overlong_penalty
from credo.tracking.timer import Timer
from credo.train.stats import rollout_metrics
from credo.types import RewardResult, Rollouts, SamplingParams, Trajectory


@dataclass(frozen=True)
class GroupOptions:
    """How :class:`GroupCollector` collects a step (``train.prompts_per_step``, ``rollout.group_size``, the group
    collector's filtering, ``reward.overlong_*``)."""

    prompts_per_step: int
    group_size: int
    filter_groups: bool = False
    dynamic_sampling: bool = False
    max_gen_batches: int = 1
    overlong_buffer: int = 0
    overlong_factor: float = 1.0
    noise: bool = False  # the training runner corrupts scores (``reward.noise``): log ``reward/noised_frac``

    @classmethod
    def of(cls, cfg) -> "GroupOptions":
        c, r = cfg.rollout.collector, cfg.reward
        return cls(prompts_per_step=cfg.train.prompts_per_step, group_size=cfg.rollout.group_size,
                   filter_groups=c.filter_groups, dynamic_sampling=c.dynamic_sampling,
                   max_gen_batches=c.max_gen_batches, overlong_buffer=r.overlong_buffer,
                   overlong_factor=r.overlong_penalty, noise=r.noise > 0)


class GroupCollector:
    """Single-turn collection (``rollout.collector.type=group``): ``group_size`` samples per prompt, scored by the
    step's training runner (``runner_for(step)``), with group filtering / dynamic sampling and DAPO's overlong
    shaping (:func:`collect_rollouts`)."""

    needs = CollectorNeeds()

    def __init__(self, engine, runner_for: Callable[[int], Any], sampler, sampling: SamplingParams,
                 opts: GroupOptions) -> None:
        self.engine, self.runner_for, self.sampler = engine, runner_for, sampler
        self.sampling, self.opts = sampling, opts

    def start(self, run_dir: Path) -> None:
        """Nothing to prepare before the first step."""

    def collect(self, step: int, timer: Timer) -> Rollouts:
        o = self.opts
        rollouts = collect_rollouts(
            self.engine, self.runner_for(step), self.sampler, prompts_per_step=o.prompts_per_step,
            group_size=o.group_size, sampling=self.sampling, filter_groups=o.filter_groups,
            dynamic_sampling=o.dynamic_sampling, max_gen_batches=o.max_gen_batches,
            overlong_buffer=o.overlong_buffer, overlong_factor=o.overlong_factor, timer=timer, step=step)
        if o.noise:
            rollouts.metrics["reward/noised_frac"] = noised_frac(rollouts.results)
        return rollouts

    def rewards(self, batch, trajs):
        """The verifier scores, (B,)."""
        return batch.scores

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])


def noised_frac(results: list[RewardResult]) -> float:
    """Share of the results whose score the noisy training runner corrupted (``reward.noise``)."""
    return sum(bool(r.info.get("noised")) for r in results) / max(len(results), 1)


def collect_rollouts(engine, runner, sampler, *, prompts_per_step: int, group_size: int, sampling: SamplingParams,
                     filter_groups: bool = False, dynamic_sampling: bool = False, max_gen_batches: int = 1,
                     overlong_buffer: int = 0, overlong_factor: float = 1.0, timer=None, step: int | None = None
                     ) -> Rollouts:
    timer = timer or Timer()  # a throwaway timer when the caller keeps none
    kept: list[tuple[list[Trajectory], list[RewardResult]]] = []
    dropped = 0
    all_trajs: list[Trajectory] = []
    all_results: list[RewardResult] = []
    rounds = 0
    while True:
        rounds += 1
        with StreamingScorer(runner, min_batch=max(1, prompts_per_step * group_size // 4), step=step) as scorer:
            with timer("gen"):
                trajs = engine.generate(sampler.next_batch(prompts_per_step), group_size, sampling,
                                        on_done=scorer.submit)
            with timer("reward"):  # only what is left once generation has ended
                results = scorer.results(trajs)
        results = [_shape(t, r, sampling.max_new_tokens, overlong_buffer, overlong_factor) for t, r in zip(trajs, results)]
        all_trajs += trajs
        all_results += results
        groups = _groups(trajs, results)
        informative = [g for g in groups if not filter_groups or len({r.score for r in g[1]}) > 1]
        dropped += len(groups) - len(informative)
        kept += informative
        if not (filter_groups and dynamic_sampling) or len(kept) >= prompts_per_step or rounds >= max_gen_batches:
            break
    surplus = max(len(kept) - prompts_per_step, 0)
    kept = kept[:prompts_per_step]
    out_trajs, out_results = [], []
    for new_id, (ts, rs) in enumerate(kept):
        out_trajs += [dataclasses.replace(t, group_id=new_id) for t in ts]
        out_results += rs
    metrics = rollout_metrics(all_trajs, all_results)
    metrics.update({"filter/gen_batches": rounds, "filter/kept_groups": len(kept), "filter/dropped_groups": dropped,
                    "filter/surplus_groups": surplus})
    if overlong_buffer:
        metrics["reward/overlong_penalty_mean"] = sum(r.info.get("overlong_penalty", 0.0) for r in all_results) / len(
            all_results)
    return Rollouts(out_trajs, out_results, metrics, sampling=sampling)


class Prefetch:
    """A rollout collection running in a background thread (one-step-off-policy mode): ``fn(timer)`` starts at
    construction; :meth:`wait` returns its rollouts and adds its stage times to the caller's timer."""

    def __init__(self, fn: Callable[[Timer], Rollouts] | None = None, *, done: Rollouts | None = None) -> None:
        self._timer = Timer()
        self._result, self._error = done, None
        self._thread = None
        if fn is not None:
            self._thread = threading.Thread(target=self._run, args=(fn,), name="credo-prefetch", daemon=True)
            self._thread.start()

    def _run(self, fn: Callable[[Timer], Rollouts]) -> None:
        try:
            self._result = fn(self._timer)
        except BaseException as exc:  # re-raised in the consuming thread
            self._error = exc

    def wait(self, timer: Timer | None = None) -> Rollouts:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        if timer is not None:
            for name, seconds in self._timer.seconds.items():
                timer.seconds[name] += seconds
            self._timer = Timer()  # counted once
        assert self._result is not None
        return self._result


class StreamingScorer:
    """Scores trajectories in a background thread as the engine reports them done, so reward computation
    (verifier worker processes, sandboxes) overlaps the rest of the generation.

    One thread calls ``runner.score`` (the runner is not thread-safe), each time on everything queued so far once
    at least ``min_batch`` items wait (fewer, larger calls: on a small machine every call's inter-process traffic
    and worker wake-ups take cores from the generation; demo model, exact_match in 2 worker processes, 2 cores:
    generation 0.100 s per step with a call per finished row, 0.066 s with quarter-batch calls, 0.041 s with the
    verifier inline, which ``reward.executor=auto`` now picks for it).
    :meth:`results` waits for the remaining items and returns the results in output order; an output that was
    never reported is scored there. An exception inside ``runner.score`` is re-raised by :meth:`results`.
    """

    def __init__(self, runner, *, min_batch: int = 1, step: int | None = None) -> None:
        self.runner, self.step = runner, step  # step: the RL step whose batch this is (credo.faults' generate)
        self.min_batch = max(1, min_batch)
        self._queue: queue.Queue = queue.Queue()
        self._done: dict[int, RewardResult] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="credo-reward-stream", daemon=True)
        self._thread.start()

    def submit(self, index: int, traj: Trajectory) -> None:
        self._queue.put((index, traj))
        kill_point("generate", self.step)

    def _work(self) -> None:
        stop = False
        while not stop:
            items = [self._queue.get()]
            while items[-1] is not None and len(items) < self.min_batch:
                items.append(self._queue.get())
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(item is None for item in items)
            items = [item for item in items if item is not None]
            if items and self._error is None:
                try:
                    scored = self.runner.score([t.response_text for _, t in items], [t.example for _, t in items])
                    self._done.update({i: r for (i, _), r in zip(items, scored)})
                except BaseException as exc:  # surfaced by results()
                    self._error = exc

    def results(self, trajs: list[Trajectory]) -> list[RewardResult]:
        self.close()
        if self._error is not None:
            raise self._error
        missing = [i for i in range(len(trajs)) if i not in self._done]
        if missing:
            scored = self.runner.score([trajs[i].response_text for i in missing], [trajs[i].example for i in missing])
            self._done.update(zip(missing, scored))
        return [self._done[i] for i in range(len(trajs))]

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> "StreamingScorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shape(traj: Trajectory, result: RewardResult, max_len: int, buffer: int, factor: float) -> RewardResult:
    if buffer <= 0:
        return result
    pen = overlong_penalty(len(traj.response_ids), max_len=max_len, buffer=buffer, factor=factor)
    return dataclasses.replace(result, score=result.score + pen, info={**result.info, "overlong_penalty": pen})


def _groups(trajs: list[Trajectory], results: list[RewardResult]):
    order: dict[int, tuple[list[Trajectory], list[RewardResult]]] = {}
    for t, r in zip(trajs, results):
        order.setdefault(t.group_id, ([], []))
        order[t.group_id][0].append(t)
        order[t.group_id][1].append(r)
    return list(order.values())
