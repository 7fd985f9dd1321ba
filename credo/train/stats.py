"""Small helpers for step metrics: a stage timer, a micro-batch metric accumulator, rollout statistics."""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

from credo.types import RewardResult, Trajectory


class Timer:
    """``with timer("gen"): ...`` accumulates wall seconds under ``timing_s/gen``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}


class MetricAccumulator:
    """Combines metrics of many micro-batches.

    ``add_weighted``: token-weighted means (clip fractions, ratios). ``add_per_update``: values that
    sum over the micro-batches of one optimizer step (aggregated losses) or occur once per step
    (grad norm, lr); reported as their mean over optimizer steps.
    """

    def __init__(self) -> None:
        self._wsum: dict[str, float] = defaultdict(float)
        self._w: dict[str, float] = defaultdict(float)
        self._sum: dict[str, float] = defaultdict(float)
        self.updates = 0

    def add_weighted(self, metrics: dict[str, float], weight: float) -> None:
        for k, v in metrics.items():
            self._wsum[k] += v * weight
            self._w[k] += weight

    def add_per_update(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self._sum[k] += v

    def end_update(self) -> None:
        self.updates += 1

    def result(self) -> dict[str, float]:
        out = {k: self._wsum[k] / self._w[k] for k in self._wsum if self._w[k] > 0}
        out.update({k: v / max(self.updates, 1) for k, v in self._sum.items()})
        return out


def rollout_metrics(trajs: list[Trajectory], results: list[RewardResult]) -> dict[str, float]:
    """Reward, accuracy, length and verifier-failure statistics of one rollout batch."""
    scores = [r.score for r in results]
    lengths = [len(t.response_ids) for t in trajs]
    return {
        "reward/mean": statistics.fmean(scores),
        "reward/std": statistics.pstdev(scores) if len(scores) > 1 else 0.0,
        "reward/max": max(scores),
        "reward/min": min(scores),
        "acc/mean": sum(r.correct for r in results) / len(results),
        "response_length/mean": statistics.fmean(lengths),
        "response_length/max": max(lengths),
        "response_length/min": min(lengths),
        "response_length/clip_ratio": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
        "reward/verifier_failures": sum(r.failed for r in results),
        "reward/verifier_timeouts": sum(r.failed and "timeout" in r.error for r in results),
    }
