"""Bounded-staleness async training vs on-policy at equal wall time (docs/async.md).

Runs the demo configuration (reversal, the default tiny Qwen2, its SFT warm start) once per arm, all arms at the
same time as separate `credo train` processes with ``train.threads=1`` (so they share the machine alike), then
reads each run's metrics.jsonl: the training seconds elapsed at each evaluation are the summed ``timing_s/step``
of the steps so far (evaluation and checkpoint time excluded), and the accuracy "at equal wall time" is each arm's
last evaluation within the fastest arm's total training time.

    python benchmarks/async_staleness.py                          # arms K = 0, 2, 4, seed 0, 200 steps
    python benchmarks/async_staleness.py --arms 0,2,2p,4 --seed 1  # "2p": K = 2 with partial rollouts
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from credo.tracking.metrics import read_metrics


def arm_overrides(arm: str) -> list[str]:
    """``"K"`` or ``"Kp"`` (partial rollouts) as config overrides."""
    partial = arm.endswith("p")
    k = int(arm.rstrip("p"))
    return [f"rollout.max_staleness={k}", f"rollout.partial={str(partial).lower()}"]


def launch(arm: str, run_dir: Path, args, overrides: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "credo.cli.main", "-q", "train", "--run-dir", str(run_dir), f"seed={args.seed}",
           f"train.steps={args.steps}", f"eval.every={args.eval_every}", "train.threads=1", "checkpoint.every=0",
           "checkpoint.save_final=false", "log.report=false", "log.tensorboard=false", "log.progress=false",
           *arm_overrides(arm), *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=(run_dir.parent / f"{arm}.err").open("w"))


def curve(run_dir: Path) -> tuple[list[tuple[int, float, float, float]], list[dict]]:
    """[(step, elapsed training s, greedy acc, avg@k)] at each evaluation (step 0 included), and the step rows."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in rows if "timing_s/step" in r]
    out, elapsed = [], 0.0
    avg_key = next((k for r in rows for k in r if k.startswith("eval/avg@")), None)
    for r in rows:
        elapsed += r.get("timing_s/step", 0.0)
        if "eval/greedy_acc" in r:
            out.append((int(r["step"]), elapsed, r["eval/greedy_acc"], r.get(avg_key, float("nan"))))
    return out, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="0,2,4", help="comma-separated: K, or Kp for K with partial rollouts")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds before the arms are killed")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {arm: Path(tmp) / f"k{arm}" for arm in args.arms.split(",")}
        procs = {arm: launch(arm, run, args, args.overrides) for arm, run in runs.items()}
        for arm, proc in procs.items():
            try:
                rc = proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                for p in procs.values():
                    p.kill()
                sys.exit(f"arm {arm}: over --timeout {args.timeout} s")
            if rc != 0:
                sys.exit(f"arm {arm} failed (rc {rc}):\n" + (Path(tmp) / f"{arm}.err").read_text()[-2000:])
        curves = {arm: curve(run) for arm, run in runs.items()}
    report(args, curves)


def report(args, curves) -> None:
    print(f"demo task, {args.steps} steps, seed {args.seed}, arms run at the same time, train.threads=1")
    print(f"{'arm':<6}{'train s':>9}{'s/step':>8}{'wait s/step':>12}{'gen s/step':>11}{'final greedy':>13}"
          f"{'final avg@k':>12}{'max staleness':>14}")
    for arm, (points, steps) in curves.items():
        total = points[-1][1]
        n = max(len(steps), 1)
        # the trainer's wait for its rollouts: the pipeline's rollout_wait, else (on-policy) generation + scoring
        wait = sum(r.get("timing_s/rollout_wait", r.get("timing_s/gen", 0.0) + r.get("timing_s/reward", 0.0))
                   for r in steps) / n
        gen = sum(r.get("timing_s/gen", 0.0) for r in steps) / n
        stale = max((r.get("rollout/staleness_max", 0.0) for r in steps), default=0.0)
        print(f"{arm:<6}{total:>9.1f}{total / n:>8.3f}{wait:>12.3f}{gen:>11.3f}{points[-1][2]:>13.3f}"
              f"{points[-1][3]:>12.3f}{stale:>14.0f}")
    budget = min(points[-1][1] for points, _ in curves.values())
    print(f"\nat equal training time ({budget:.1f} s, the fastest arm's total): the last evaluation within it")
    for arm, (points, _) in curves.items():
        step, elapsed, greedy, avg = [p for p in points if p[1] <= budget + 1e-9][-1]
        print(f"  K={arm:<4} step {step:>4} ({elapsed:6.1f} s): greedy {greedy:.3f}, avg@k {avg:.3f}")
    print("\nevaluations (step: elapsed s / greedy acc):")
    for arm, (points, _) in curves.items():
        print(f"  K={arm:<4} " + "  ".join(f"{s}: {e:.0f}/{g:.2f}" for s, e, g, _ in points))


if __name__ == "__main__":
    main()
