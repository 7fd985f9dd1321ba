"""One number per run from a metric's series in metrics.jsonl, for ``credo compare`` (docs/evidence.md, "Reductions").

A reduction reads the rows of one run (dicts with ``step``) and one key, and returns a float:

- ``final`` / ``first``: the last / first logged value;
- ``mean``: the mean over every row that logged the key; ``last:F``: the mean over the last fraction F of them
  (at least one row);
- ``min`` / ``max``;
- ``slope``: the least-squares slope of value against step (per step; 0 with one row);
- ``steps_to:X``: the first step whose value is >= X; a run that never reaches X counts as its last step + 1
  (censored: it needed more than the budget);
- ``ratio:KEY2``: the sum of the key over the rows that log both, divided by the sum of KEY2 there (a share, e.g.
  clipped over all).

Rows without the key are skipped; a run that never logged it raises ValueError with the key's name.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Sequence

Rows = Sequence[dict]

_PARAM = re.compile(r"^(last|steps_to|ratio):(.+)$")
PLAIN = ("final", "first", "mean", "min", "max", "slope")


def check_reduce(reduce: str) -> str:
    """``reduce`` if it names a reduction, else ValueError listing them."""
    if reduce in PLAIN:
        return reduce
    m = _PARAM.match(reduce)
    if m:
        kind, arg = m.groups()
        if kind == "ratio":
            return reduce
        try:
            x = float(arg)
        except ValueError:
            x = float("nan")
        if kind == "last" and 0.0 < x <= 1.0 or kind == "steps_to" and math.isfinite(x):
            return reduce
    raise ValueError(f"unknown reduction {reduce!r}: one of {', '.join(PLAIN)}, last:F (0 < F <= 1), steps_to:X, "
                     f"ratio:KEY")


def points(rows: Rows, key: str, x: str = "step") -> list[tuple[float, float]]:
    """(x, value) of every row that logged ``key`` with a number; ``x`` is the step or another key of the row (a
    budget total, 0 at step 0 before RL), rows without it skipped."""
    out = []
    for r in rows:
        v = r.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or "step" not in r:
            continue
        at = r["step"] if x == "step" else r.get(x, 0.0 if r["step"] == 0 else None)
        if isinstance(at, (int, float)):
            out.append((float(at), float(v)))
    return out


def reduce_series(rows: Rows, key: str, reduce: str) -> float:
    """The reduction ``reduce`` (module docstring) of ``key`` over one run's ``rows``."""
    check_reduce(reduce)
    if reduce.startswith("ratio:"):
        other = reduce.split(":", 1)[1]
        pairs = [(r[key], r[other]) for r in rows if isinstance(r.get(key), (int, float))
                 and isinstance(r.get(other), (int, float))]
        if not pairs:
            raise ValueError(f"no row logs both {key!r} and {other!r}")
        den = sum(b for _, b in pairs)
        return sum(a for a, _ in pairs) / den if den else float("nan")
    pts = points(rows, key)
    if not pts:
        raise ValueError(f"the run never logged {key!r}")
    values = [v for _, v in pts]
    if reduce.startswith("steps_to:"):
        target = float(reduce.split(":", 1)[1])
        hit = next((s for s, v in pts if v >= target), None)
        last = max(float(r["step"]) for r in rows if "step" in r)
        return hit if hit is not None else last + 1.0
    if reduce.startswith("last:"):
        n = max(1, math.ceil(len(values) * float(reduce.split(":", 1)[1])))
        return sum(values[-n:]) / n
    fn: Callable[[list[float]], float] = {"final": lambda v: v[-1], "first": lambda v: v[0],
                                          "mean": lambda v: sum(v) / len(v), "min": min, "max": max}.get(reduce)
    if fn is not None:
        return float(fn(values))
    return _slope(pts)


def _slope(pts: list[tuple[float, float]]) -> float:
    if len(pts) < 2:
        return 0.0
    mx = sum(s for s, _ in pts) / len(pts)
    my = sum(v for _, v in pts) / len(pts)
    sxx = sum((s - mx) ** 2 for s, _ in pts)
    return sum((s - mx) * (v - my) for s, v in pts) / sxx if sxx else 0.0
