"""Statistics over seeds for ``credo compare`` and the evidence table (docs/evidence.md, "Statistics").

Every number summarises one value per seed. For an arm: the mean and a percentile-bootstrap 95% interval of the
mean. Against the baseline: the per-seed paired differences ``d_k = arm_k - baseline_k`` (same seed = same data
order and initial weights), their mean, a percentile-bootstrap interval of that mean, an exact two-sided sign-flip
p-value, and a verdict that is only "higher" / "lower" where the interval excludes 0 and at least
:data:`MIN_SEEDS` (5) seeds were paired ("too few seeds" otherwise).

Bootstrap. The resamples are the n^n equally likely draws of n values with replacement. For n <= 6 all of them are
enumerated (exact, no randomness); above that ``resamples`` draws from a generator seeded by ``seed``. The interval
is the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the resample means with linear interpolation
(numpy's default): for values (0, 1) the means are (0, .5, .5, 1) and the 95% interval is (0.0375, 0.9625).

With few seeds a percentile bootstrap is narrow (it cannot see tails it never sampled), so the verdict also carries
``wins`` (seeds where the arm is above the baseline) and the sign-flip p-value, whose smallest possible value is
2 / 2^n (0.0625 for 5 seeds): read a verdict at 5 seeds as "every seed or nearly every seed agrees", not as p < 0.05.
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

EXACT_MAX_N = 6  # 6^6 = 46656 resamples
MIN_SEEDS = 5  # fewer paired seeds than this give no verdict (the "at least 5 seeds" for a ranking)
FORMAT = "credo.compare/1"


def resample_means(values: Sequence[float], *, resamples: int = 20_000, seed: int = 0) -> np.ndarray:
    """The bootstrap distribution of the mean: all n^n resample means for n <= EXACT_MAX_N, else ``resamples``
    seeded draws."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n == 0:
        raise ValueError("no values to resample")
    if n <= EXACT_MAX_N:
        idx = np.array(list(itertools.product(range(n), repeat=n)), dtype=np.int64)  # (n^n, n)
        return x[idx].mean(axis=1)
    rng = np.random.default_rng(seed)
    return x[rng.integers(0, n, size=(resamples, n))].mean(axis=1)


def bootstrap_ci(values: Sequence[float], *, level: float = 0.95, resamples: int = 20_000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean (module docstring). One value: the interval is that value."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    means = resample_means(values, resamples=resamples, seed=seed)
    lo, hi = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Exact two-sided paired permutation p-value: the share of the 2^n sign assignments whose |mean| is at least
    the observed |mean| (n <= 16; above that 65536 seeded random flips)."""
    d = np.asarray(diffs, dtype=np.float64)
    n = len(d)
    if n == 0:
        raise ValueError("no differences")
    if n <= 16:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    else:
        signs = np.random.default_rng(0).choice((1.0, -1.0), size=(65_536, n))
    observed = abs(d.mean())
    flipped = np.abs((signs * d).mean(axis=1))
    return float(np.mean(flipped >= observed - 1e-12 * max(1.0, observed)))


def verdict(ci: tuple[float, float], n: int = MIN_SEEDS, min_n: int = MIN_SEEDS) -> str:
    """"higher" / "lower" when the interval excludes 0, else "no difference"; "too few seeds" below ``min_n``."""
    if n < min_n:
        return "too few seeds"
    lo, hi = ci
    if lo > 0:
        return "higher"
    if hi < 0:
        return "lower"
    return "no difference"


def _finite(values: Sequence[float], what: str) -> list[float]:
    out = [float(v) for v in values]
    bad = [v for v in out if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what}: non-finite values {bad} (a run that diverged or never logged the metric)")
    return out


def arm_summary(values: Sequence[float], **kw: Any) -> dict[str, Any]:
    """{"values", "mean", "ci95"} of one arm's per-seed values."""
    v = _finite(values, "arm")
    return {"values": v, "mean": float(np.mean(v)), "ci95": list(bootstrap_ci(v, **kw))}


def paired_difference(arm: Sequence[float], baseline: Sequence[float], *, min_n: int = MIN_SEEDS,
                      **kw: Any) -> dict[str, Any]:
    """The paired difference ``arm_k - baseline_k`` over seeds: {"diffs", "mean", "ci95", "verdict", "wins", "ties",
    "n", "p_sign_flip"}; no verdict ("too few seeds") with fewer than ``min_n`` seeds."""
    a, b = _finite(arm, "arm"), _finite(baseline, "baseline")
    if len(a) != len(b):
        raise ValueError(f"paired difference needs one value per seed in both arms, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    ci = bootstrap_ci(diffs, **kw)
    return {"diffs": diffs, "mean": float(np.mean(diffs)), "ci95": list(ci), "verdict": verdict(ci, len(diffs), min_n),
            "wins": sum(d > 0 for d in diffs), "ties": sum(d == 0 for d in diffs), "n": len(diffs),
            "p_sign_flip": sign_flip_p(diffs)}


def metric_block(values_by_arm: dict[str, Sequence[float]], baseline: str, *, min_n: int = MIN_SEEDS,
                 **kw: Any) -> dict[str, Any]:
    """One metric of a comparison: every arm's summary and each other arm's paired difference to ``baseline``.
    ``values_by_arm[arm][k]`` is seed k's value (the same seed order in every arm)."""
    if baseline not in values_by_arm:
        raise ValueError(f"baseline {baseline!r} is not an arm ({', '.join(values_by_arm)})")
    return {"arms": {arm: arm_summary(v, **kw) for arm, v in values_by_arm.items()},
            "vs_baseline": {arm: paired_difference(v, values_by_arm[baseline], min_n=min_n, **kw)
                            for arm, v in values_by_arm.items() if arm != baseline}}


def write_compare_json(path: Path | str, *, name: str, command: str, baseline: str, seeds: Sequence[int],
                       metrics: dict[str, dict[str, Any]], extra: dict[str, Any] | None = None) -> Path:
    """Write a comparison in credo compare's JSON shape (``format`` credo.compare/1), for data that does not come
    from training runs (a benchmark script): ``metrics`` maps a metric id to :func:`metric_block`'s output."""
    path = Path(path)
    payload = {"format": FORMAT, "name": name, "command": command, "baseline": baseline, "seeds": list(seeds),
               "metrics": metrics, **(extra or {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    tmp.replace(path)
    return path
