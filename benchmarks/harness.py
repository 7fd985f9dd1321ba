"""A/B harness for comparative benchmarks: interleaved sides, the median ratio B / A with a bootstrap 95% interval.

Convention: side A is the reference, side B the candidate, and every ratio is **B / A** (time of B over time of A:
below 1 means B is faster). `vs_trl.py` runs A = TRL, B = credo and prints `credo / TRL step time: R x [lo, hi]`.

Two ways to measure, both alternating the sides so that a change of the machine's load falls on both:

- in one process (`run_inprocess`): the two callables alternate step by step (A B A B ..., or each pair in a seeded
  random order), after warm-up pairs that are left out. Step i of A and step i of B run back to back, so they are
  **paired**: the statistic is the median of the per-pair ratios b_i / a_i, and the bootstrap resamples pairs.
- in separate processes (`run_rounds`): short rounds, one process per side per round, A B A B ... (or seeded
  random order within each round pair); each process prints its step times as JSON on a line. Steps of A and
  B are not one-to-one (a process's steps are not matched to the other's), so the samples are **independent**:
  the statistic is median(b) / median(a) over the pooled timed steps, and the bootstrap resamples each side.

The interval is a seeded percentile bootstrap: `boot` resamples with replacement, the statistic of each, and the
2.5% and 97.5% quantiles (linear interpolation between order statistics). Constant series give a zero-width
interval at the exact ratio. `Comparison.line()` is `NAME: R x [lo, hi]`; `report` prints it (with an optional
deterministic proxy such as tokens or FLOPs per step beside it) and writes the raw series and metadata (date,
CPU count, load average before / after, command) to a JSON file (default runs/bench/, which git ignores).

    import harness                               # benchmarks/ (a script's own directory) is on sys.path
    cmp = harness.run_inprocess(step_a, step_b, repeats=20, warmup=2, name="lean / HF decode step")
    harness.report(cmp)
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence, Union

BOOT = 2000  # bootstrap resamples
SIDES = ("A", "B")
Command = Union[Sequence[str], Callable[[int], Sequence[str]]]  # argv, or argv for round i


# ---------------------------------------------------------------- statistics (pure)


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics: s[floor(h)] + (h - floor(h)) (s[floor(h)+1] - s[floor(h)]),
    h = q (n - 1), s sorted (numpy's default, Hyndman-Fan type 7)."""
    if not xs or not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile needs a non-empty series and 0 <= q <= 1 (got {len(xs)} values, q={q})")
    s = sorted(xs)
    h = q * (len(s) - 1)
    lo = int(h)
    return s[lo] if lo + 1 >= len(s) else s[lo] + (h - lo) * (s[lo + 1] - s[lo])


def median_ratio(a: Sequence[float], b: Sequence[float], paired: bool) -> float:
    """B / A. Paired: median_i(b_i / a_i) (a and b the same length, pair i measured back to back).
    Independent: median(b) / median(a)."""
    if not a or not b:
        raise ValueError("median_ratio needs both series non-empty")
    if paired:
        if len(a) != len(b):
            raise ValueError(f"paired series differ in length: {len(a)} vs {len(b)}")
        return statistics.median(y / x for x, y in zip(a, b))
    return statistics.median(b) / statistics.median(a)


def bootstrap_ci(a: Sequence[float], b: Sequence[float], paired: bool, *, boot: int = BOOT, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of median_ratio: `boot` resamples (paired: n pair indices drawn with
    replacement; independent: len(a) from a and len(b) from b), then the (1 - level)/2 and (1 + level)/2
    quantiles of the resampled ratios. Deterministic for a seed."""
    rng = random.Random(seed)
    stats = []
    for _ in range(boot):
        if paired:
            idx = rng.choices(range(len(a)), k=len(a))
            stats.append(median_ratio([a[i] for i in idx], [b[i] for i in idx], True))
        else:
            stats.append(median_ratio(rng.choices(a, k=len(a)), rng.choices(b, k=len(b)), False))
    tail = (1.0 - level) / 2
    return quantile(stats, tail), quantile(stats, 1.0 - tail)


def interleave_order(n: int, order: str = "alternate", seed: int = 0) -> list[str]:
    """The sides of n pairs in run order: "alternate" is A B A B ...; "balanced" runs each pair as A B or B A,
    seeded, so each side runs first in about half the pairs (and each side exactly n times either way)."""
    if order == "alternate":
        return list(SIDES) * n
    if order == "balanced":
        rng = random.Random(seed)
        return [s for _ in range(n) for s in (SIDES if rng.random() < 0.5 else SIDES[::-1])]
    raise ValueError(f"unknown order {order!r}: expected 'alternate' or 'balanced'")


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Proxy:
    """A deterministic per-side quantity (tokens processed, FLOPs per step, ...) printed beside the time."""

    unit: str
    a: float
    b: float

    def line(self) -> str:
        ratio = f" (B / A {self.b / self.a:.2f}x)" if self.a else ""
        return f"{self.unit}: A {self.a:g}, B {self.b:g}{ratio}"


@dataclass
class Comparison:
    """Timed samples of both sides (warm-up left out), the ratio B / A and its interval, the raw series."""

    name: str
    a: list[float]
    b: list[float]
    paired: bool
    ratio: float
    lo: float
    hi: float
    labels: tuple[str, str] = SIDES
    order: list[str] = field(default_factory=list)  # the run order of every step or round, warm-up included
    raw: dict[str, Any] = field(default_factory=dict)  # per-round outputs, warm-up samples, ...
    proxy: Proxy | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.name}: {self.ratio:.2f} x [{self.lo:.2f}, {self.hi:.2f}]"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["convention"] = f"ratio = {self.labels[1]} / {self.labels[0]} (B / A); " + (
            "paired: median of per-pair ratios, pairs resampled" if self.paired
            else "independent: median(B) / median(A), each side resampled")
        d["median_a"], d["median_b"] = statistics.median(self.a), statistics.median(self.b)
        return d


def compare(name: str, a: Sequence[float], b: Sequence[float], paired: bool, *, seed: int = 0, boot: int = BOOT,
            **extra: Any) -> Comparison:
    """The Comparison of two timed series: median_ratio and bootstrap_ci with the given seed."""
    lo, hi = bootstrap_ci(a, b, paired, boot=boot, seed=seed)
    return Comparison(name, list(a), list(b), paired, median_ratio(a, b, paired), lo, hi, **extra)


def machine_state() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "loadavg": load}


def _meta(before: dict[str, Any], **extra: Any) -> dict[str, Any]:
    after = machine_state()
    return {"date": before["date"], "cpu_count": os.cpu_count(), "loadavg_before": before["loadavg"],
            "loadavg_after": after["loadavg"], "python": sys.version.split()[0], "platform": platform.platform(),
            "argv": sys.argv, **extra}


def report(cmp: Comparison, json_path: str | Path | None = None, *, quiet: bool = False) -> Path:
    """Print `NAME: R x [lo, hi]` (and the proxy), write cmp as JSON (default runs/bench/<name>-<time>.json)."""
    if json_path is None:
        slug = re.sub(r"[^a-z0-9]+", "-", cmp.name.lower()).strip("-") or "ab"
        json_path = Path("runs") / "bench" / f"{slug}-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cmp.to_dict(), indent=1) + "\n")
    if not quiet:
        a, b = statistics.median(cmp.a), statistics.median(cmp.b)
        print(f"{cmp.labels[0]} median {a:.4g} s, {cmp.labels[1]} median {b:.4g} s "
              f"({len(cmp.a)} / {len(cmp.b)} timed, {'paired' if cmp.paired else 'independent'} bootstrap)")
        print(cmp.line() + (f"   [{cmp.proxy.line()}]" if cmp.proxy else ""), flush=True)
        if min(len(cmp.a), len(cmp.b)) < 5:
            print(f"warning: {min(len(cmp.a), len(cmp.b))} timed samples on one side: the interval means little")
        print(f"raw series: {path}")
    return path


# ---------------------------------------------------------------- in one process


def run_inprocess(a: Callable[..., Any], b: Callable[[], Any] | None = None, *, repeats: int, warmup: int = 1,
                  order: str = "alternate", seed: int = 0, name: str = "B / A time", labels: tuple[str, str] = SIDES,
                  proxy: Proxy | None = None, timer: Callable[[], float] = time.perf_counter,
                  boot: int = BOOT) -> Comparison:
    """Time `warmup + repeats` pairs, the sides alternating step by step (interleave_order); the first `warmup`
    pairs are left out. `a` and `b` are zero-argument callables, or `a` alone takes the side ("A" or "B")."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0 (got {repeats}, {warmup})")
    fns = {"A": a, "B": b} if b is not None else {s: (lambda s=s: a(s)) for s in SIDES}
    run_order = interleave_order(warmup + repeats, order, seed)
    times: dict[str, list[float]] = {"A": [], "B": []}
    before = machine_state()
    for side in run_order:
        t0 = timer()
        fns[side]()
        times[side].append(timer() - t0)
    meta = _meta(before, mode="in-process", order=order, repeats=repeats, warmup=warmup, seed=seed)
    return compare(name, times["A"][warmup:], times["B"][warmup:], True, seed=seed, boot=boot, labels=labels,
                   order=run_order, raw={"warmup_a": times["A"][:warmup], "warmup_b": times["B"][:warmup]},
                   proxy=proxy, meta=meta)


# ---------------------------------------------------------------- in separate processes


def parse_times(stdout: str, marker: str = "") -> dict[str, Any]:
    """The last stdout line that starts with `marker` and whose rest is JSON: a list of step times, or an object
    with a "times" list (other keys kept). Raises ValueError when there is none."""
    for line in reversed(stdout.splitlines()):
        if not line.startswith(marker):
            continue
        try:
            value = json.loads(line[len(marker):])
        except json.JSONDecodeError:
            continue
        if isinstance(value, list):
            value = {"times": value}
        if isinstance(value, dict) and isinstance(value.get("times"), list):
            return value
    raise ValueError(f"no {marker or 'JSON'} line with step times in the output: {stdout[-300:]!r}")


def run_rounds(cmd_a: Command, cmd_b: Command, *, rounds: int, warmup: int = 0, warmup_rounds: int = 0,
               order: str = "alternate", seed: int = 0, marker: str = "", timeout: float | None = None,
               name: str = "B / A time", labels: tuple[str, str] = SIDES, proxy: Proxy | None = None,
               env: dict[str, str] | None = None, boot: int = BOOT) -> Comparison:
    """`warmup_rounds + rounds` rounds of one process per side, in interleave_order; each process prints its
    step times (parse_times); its first `warmup` steps and the first `warmup_rounds` rounds are left out. A
    command is an argv list, or a function of the round index returning one (e.g. a fresh output directory)."""
    if rounds < 1:
        raise ValueError(f"need rounds >= 1 (got {rounds})")
    cmds = {"A": cmd_a, "B": cmd_b}
    run_order = interleave_order(warmup_rounds + rounds, order, seed)
    outputs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    before = machine_state()
    for side in run_order:
        i = len(outputs[side])
        cmd = cmds[side]
        argv = [str(x) for x in (cmd(i) if callable(cmd) else cmd)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode:
            raise RuntimeError(f"{labels[SIDES.index(side)]} round {i} failed (exit {proc.returncode}): "
                               f"{' '.join(argv)}\n{proc.stderr[-3000:]}")
        outputs[side].append({"argv": argv, **parse_times(proc.stdout, marker)})
    timed = {s: [float(t) for out in outputs[s][warmup_rounds:] for t in out["times"][warmup:]] for s in SIDES}
    if not timed["A"] or not timed["B"]:
        raise ValueError(f"no timed steps left after {warmup} warm-up steps per process: raise the step count")
    meta = _meta(before, mode="rounds", order=order, rounds=rounds, warmup_steps=warmup,
                 warmup_rounds=warmup_rounds, seed=seed)
    return compare(name, timed["A"], timed["B"], False, seed=seed, boot=boot, labels=labels, order=run_order,
                   raw={"rounds_a": outputs["A"], "rounds_b": outputs["B"]}, proxy=proxy, meta=meta)
