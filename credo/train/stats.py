"""Small helpers for step metrics: a micro-batch metric accumulator, rollout statistics (the stage timer is
:class:`credo.tracking.timer.Timer`)."""
from __future__ import annotations

import math
import numbers
import statistics
from collections import defaultdict

from credo.rewards.runner import NONFINITE
from credo.types import RewardResult, Trajectory


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


def _is_finite(x: object) -> bool:
    return isinstance(x, numbers.Real) and math.isfinite(x)


def _mean_std(xs: list[float]) -> tuple[float, float]:
    """Population mean and standard deviation of finite numbers (0.0, 0.0 for none). Values whose sum overflows fall
    back to plain float arithmetic (giving inf, which the metrics logger writes as null) instead of raising."""
    if not xs:
        return 0.0, 0.0
    try:
        return statistics.fmean(xs), statistics.pstdev(xs) if len(xs) > 1 else 0.0
    except (OverflowError, ValueError):
        mean = sum(x / len(xs) for x in xs)
        return mean, math.sqrt(sum((x - mean) * (x - mean) / len(xs) for x in xs))


def rollout_metrics(trajs: list[Trajectory], results: list[RewardResult]) -> dict[str, float]:
    """Reward, accuracy, length and verifier-failure statistics of one rollout batch.

    Reward statistics are over the finite scores (the runner already turns NaN / inf / None into failures with the
    failure score); ``reward/nonfinite`` counts the results whose verifier gave a non-finite score, which are also
    ``reward/verifier_failures``. Never raises on a score that is not a finite number."""
    scores = [float(r.score) for r in results if _is_finite(r.score)]
    mean, std = _mean_std(scores)
    lengths = [len(t.response_ids) for t in trajs]
    return {
        "reward/mean": mean,
        "reward/std": std,
        "reward/max": max(scores, default=0.0),
        "reward/min": min(scores, default=0.0),
        "acc/mean": sum(r.correct for r in results) / len(results),
        "response_length/mean": statistics.fmean(lengths),
        "response_length/max": max(lengths),
        "response_length/min": min(lengths),
        "response_length/clip_ratio": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
        "reward/verifier_failures": sum(r.failed for r in results),
        "reward/verifier_timeouts": sum(r.failed and "timeout" in r.error for r in results),
        "reward/nonfinite": sum(not _is_finite(r.score) or (r.failed and NONFINITE in r.error) for r in results),
    }
