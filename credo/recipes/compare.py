"""``credo compare``: arms x seeds under one budget, summarised with intervals (docs/evidence.md).

    1. check      every arm's config builds (a bad preset or key fails before any run), OUT is this spec's
    2. run        every (seed, arm) as a real ``credo train`` subprocess in OUT/<arm>/seed<k>, seed-major (the arms
                  of seed 0, then of seed 1, ...), ``jobs`` at a time; a finished run (summary.json) is reused, one
                  with a checkpoint is resumed: a killed compare continues where it stopped
    3. summarise  each metric reduced to one number per run (credo.report.series), then per arm the mean and a
                  bootstrap 95% interval over seeds, and per arm the paired difference to the baseline with its
                  interval and a verdict only where the interval excludes 0 (credo.report.stats)
    4. write      OUT/compare.json, OUT/compare.md and OUT/compare.png (learning curves, mean and 95% band)

The same seed gives every arm the same data order (the prompt sampler is seeded by ``seed``) and, where the arms'
model and warm-start settings agree, the same initial weights: each run records a digest of the policy's weights
when RL starts (summary.json ``start_weights``) and compare.json says, per seed, whether the arms agree.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from credo.config import load_run_config
from credo.recipes.compare_report import curves, write_markdown, write_plot
from credo.recipes.compare_spec import CompareSpec, SpecError
from credo.report.series import reduce_series
from credo.report.stats import FORMAT, metric_block
from credo.tracking.metrics import read_metrics
from credo.tracking.rundir import check_run_dir, open_nofollow

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunResult:
    arm: str
    seed: int
    run_dir: Path
    ok: bool
    seconds: float = 0.0
    error: str = ""


def compare(spec: CompareSpec, *, out_dir: Path, extra_overrides: tuple[str, ...] = (),
            command: str = "") -> dict[str, Any]:
    """Run and summarise ``spec`` into ``out_dir`` (module docstring); returns compare.json's content. A failed run
    is listed under ``failed`` and its seed left out of the statistics; the other runs still count."""
    spec = dataclasses.replace(spec, overrides=(*spec.overrides, *extra_overrides))
    out_dir = Path(out_dir)
    check_arms(spec)                                                   # 1. check
    claim_out_dir(spec, out_dir)
    results = run_all(spec, out_dir)                                   # 2. run
    data = summarise(spec, out_dir, results, command=command)          # 3. summarise
    write_outputs(out_dir, data)                                       # 4. write
    return data


# ------------------------------------------------------------------------------------------------ 1. check

def check_arms(spec: CompareSpec) -> None:
    """Every arm's config builds with the first seed's overrides (ConfigError otherwise: exit 2, nothing written)."""
    for label, arm in spec.arms.items():
        load_run_config(arm.preset, spec.run_overrides(label, spec.seeds[0]))


def claim_out_dir(spec: CompareSpec, out_dir: Path) -> None:
    """OUT/spec.json records the spec; an OUT written by a spec whose runs differ is refused (its runs would be
    mixed into this comparison)."""
    path = out_dir / "spec.json"
    if path.is_file():
        try:
            old = json.loads(path.read_text()).get("digest")
        except (OSError, ValueError):
            old = None
        if old != spec.digest():
            raise SpecError(f"{out_dir} holds the runs of another compare spec (its arms, seeds, budget or overrides "
                            f"differ); use another --out")
    elif out_dir.exists() and any(out_dir.iterdir()):
        raise SpecError(f"{out_dir} is not empty and holds no compare spec.json; use another --out")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("spec.json.tmp")
    tmp.write_text(json.dumps({"digest": spec.digest(), "spec": spec.to_dict()}, indent=1) + "\n")
    tmp.replace(path)


# ------------------------------------------------------------------------------------------------ 2. run

def run_all(spec: CompareSpec, out_dir: Path) -> list[RunResult]:
    """Every (seed, arm), seed-major, ``spec.jobs`` at a time."""
    from credo.procs import reap_descendants_when_gone

    reap_descendants_when_gone()  # the runs die with a killed compare
    queue = [(seed, arm) for seed in spec.seeds for arm in spec.arms]
    threads = max(1, (os.cpu_count() or 1) // spec.jobs) if spec.jobs > 1 else None
    done = 0
    results: list[RunResult] = []

    def one(item: tuple[int, str]) -> RunResult:
        seed, arm = item
        return run_one(spec, out_dir, arm, seed, threads=threads)

    with ThreadPoolExecutor(max_workers=spec.jobs) as pool:
        for r in pool.map(one, queue):
            done += 1
            status = "ok" if r.ok else f"FAILED ({r.error})"
            log.info("compare %s: [%d/%d] %s seed %d %s in %.0f s", spec.name, done, len(queue), r.arm, r.seed,
                     status, r.seconds)
            print(f"[compare] {done}/{len(queue)} {r.arm} seed {r.seed}: {status} ({r.seconds:.0f} s)", flush=True)
            results.append(r)
    return results


def run_one(spec: CompareSpec, out_dir: Path, arm: str, seed: int, *, threads: int | None) -> RunResult:
    """One run as a ``credo train`` subprocess: reused when finished, resumed from its checkpoint when it has one,
    else started (again) from scratch. Its output goes to OUT/<arm>/seed<k>.log."""
    run_dir = out_dir / arm / f"seed{seed}"
    if run_dir.exists() or run_dir.is_symlink():  # what is read back or resumed holds no link (UnsafeRunDir)
        check_run_dir(run_dir, "credo compare")
    if (run_dir / "summary.json").is_file():
        return RunResult(arm, seed, run_dir, ok=True)
    cli = [sys.executable, "-m", "credo.cli.main", "train"]
    if (run_dir / "checkpoints" / "latest").is_file():
        cli += ["--resume", str(run_dir)]
    else:
        overrides = spec.run_overrides(arm, seed) + ["log.report=false", "log.progress=false"]
        if threads is not None and not any(o.startswith("train.threads=") for o in overrides):
            overrides.append(f"train.threads={threads}")
        cli += ["--config", spec.arms[arm].preset, "--run-dir", str(run_dir), "--overwrite", *overrides]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open_nofollow(run_dir.with_suffix(".log"), "a") as logf:  # never written through a planted link
        code = subprocess.run(cli, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    ok = code == 0 and (run_dir / "summary.json").is_file()
    return RunResult(arm, seed, run_dir, ok=ok, seconds=time.perf_counter() - t0,
                     error="" if ok else f"exit code {code}")


# ------------------------------------------------------------------------------------------------ 3. summarise

def run_record(run_dir: Path) -> dict[str, Any]:
    s = json.loads((run_dir / "summary.json").read_text())
    return {"run_dir": str(run_dir), "steps": s.get("steps"), "sampled_tokens": s.get("sampled_tokens"),
            "trained_tokens": s.get("trained_tokens"), "wall_s": s.get("train_wall_s"),
            "start_weights": s.get("start_weights")}


def summarise(spec: CompareSpec, out_dir: Path, results: list[RunResult], *, command: str) -> dict[str, Any]:
    """compare.json's content: the spec, every run's record, the metrics over the seeds every arm finished."""
    ok = {(r.arm, r.seed) for r in results if r.ok}
    seeds = [s for s in spec.seeds if all((a, s) in ok for a in spec.arms)]
    rows = {(a, s): read_metrics(out_dir / a / f"seed{s}" / "metrics.jsonl") for a in spec.arms for s in seeds}
    runs = {a: [{"seed": s, **run_record(out_dir / a / f"seed{s}")} for s in seeds] for a in spec.arms}
    same_start = {str(s): len({runs[a][i]["start_weights"] for a in spec.arms}) == 1 for i, s in enumerate(seeds)}
    metrics, errors = {}, {}
    for m in spec.metrics:
        try:
            values = {a: [reduce_series(rows[(a, s)], m.key, m.reduce) for s in seeds] for a in spec.arms}
            metrics[m.id] = {"key": m.key, "reduce": m.reduce, **metric_block(values, spec.baseline)}
        except ValueError as exc:  # a metric no run logged, a NaN: named, the others still summarised
            errors[m.id] = str(exc)
    return {"format": FORMAT, "name": spec.name, "command": command, "spec": spec.to_dict(),
            "baseline": spec.baseline, "seeds": seeds,
            "failed": [{"arm": r.arm, "seed": r.seed, "error": r.error} for r in results if not r.ok],
            "budget": {"unit": spec.budget_unit, "value": spec.budget_value}, "same_start_weights": same_start,
            "arms": {a: {"preset": spec.arms[a].preset, "overrides": list(spec.arms[a].overrides), "runs": runs[a]}
                     for a in spec.arms},
            "metrics": metrics, "metric_errors": errors,
            "curves": curves(spec, rows, seeds) if seeds else {}}


def arm_rows(out_dir: Path, arm: str) -> dict[int, list[dict]]:
    """seed -> the metrics.jsonl rows of OUT/<arm>/seed<k>, for the seeds OUT/compare.json summarised (scripts that
    derive further per-seed values from a finished comparison)."""
    seeds = json.loads((out_dir / "compare.json").read_text())["seeds"]
    return {s: read_metrics(out_dir / arm / f"seed{s}" / "metrics.jsonl") for s in seeds}


def write_outputs(out_dir: Path, data: dict[str, Any]) -> None:
    path = out_dir / "compare.json"
    tmp = path.with_name("compare.json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    write_markdown(out_dir / "compare.md", data)
    if data["curves"]:
        write_plot(out_dir / "compare.png", data)
