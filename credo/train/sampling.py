"""Collecting one step's rollouts: generate, score, shape, and (optionally) filter groups.

Group filtering drops prompt groups whose scores are all equal (they carry no GRPO signal).
With ``dynamic_sampling`` (DAPO) more prompts are drawn and generated until ``prompts_per_step``
informative groups are collected or ``max_gen_batches`` generation rounds were used; a short batch
is trained as it is (Klear's behaviour). Without it, dropped groups are simply not trained on
(Archer / ASPO rejection sampling).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from credo.rewards.shaping import overlong_penalty
from credo.train.stats import rollout_metrics
from credo.types import RewardResult, SamplingParams, Trajectory


@dataclass
class Rollouts:
    trajs: list[Trajectory]  # the samples to train on (group ids renumbered 0..K-1)
    results: list[RewardResult]
    metrics: dict[str, float] = field(default_factory=dict)


def collect_rollouts(engine, runner, sampler, *, prompts_per_step: int, group_size: int, sampling: SamplingParams,
                     filter_groups: bool = False, dynamic_sampling: bool = False, max_gen_batches: int = 1,
                     overlong_buffer: int = 0, overlong_factor: float = 1.0, timer=None) -> Rollouts:
    timer = timer or _NullTimer()
    kept: list[tuple[list[Trajectory], list[RewardResult]]] = []
    dropped = 0
    all_trajs: list[Trajectory] = []
    all_results: list[RewardResult] = []
    rounds = 0
    while True:
        rounds += 1
        with timer("gen"):
            trajs = engine.generate(sampler.next_batch(prompts_per_step), group_size, sampling)
        with timer("reward"):
            results = runner.score([t.response_text for t in trajs], [t.example for t in trajs])
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
    return Rollouts(out_trajs, out_results, metrics)


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


class _NullTimer:
    def __call__(self, name):
        import contextlib

        return contextlib.nullcontext()
