"""Rollout throughput with 1 vs N rollout workers (Ray) or ranks (torchrun), printed as a ratio.

``--mode ray`` (default): the same `credo train` command (default demo task unless overridden) with
``distributed.backend=ray`` and 1, then N Ray rollout workers (one torch thread each, one trainer rank, one reward
worker), and for reference 1 worker with N threads (the same cores as N workers). ``--mode torchrun``: one process
with N threads against `torchrun --nproc-per-node N` ranks with one thread each (``distributed.rollout=shard``).
Per step it reads the rollout phase (generation + rewards + the ranks' exchange) from rank 0's metrics and
reports sequences generated per second of rollout phase, median over the steps after warm-up.

    python benchmarks/scaling.py                  # 2 Ray rollout workers vs 1, demo model
    python benchmarks/scaling.py --mode torchrun  # 2 torchrun ranks vs 1 process
    python benchmarks/scaling.py --workers 2 train.prompts_per_step=32
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PHASES = ("timing_s/gen", "timing_s/reward", "timing_s/gather")


def rollout_rate(metrics: Path, sequences: int, warmup: int) -> tuple[float, list[float]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows = [r for r in rows if "timing_s/gen" in r][warmup:]
    seconds = [sum(r.get(k, 0.0) for k in PHASES) for r in rows]
    return sequences / statistics.median(seconds), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("ray", "torchrun"), default="ray")
    ap.add_argument("--workers", "--ranks", type=int, default=2, dest="workers")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    credo, torchrun = shutil.which("credo"), shutil.which("torchrun")
    if credo is None or torchrun is None:
        sys.exit("needs the credo and torchrun console scripts on PATH (pip install -e .)")
    from credo.config import load_config

    cfg = load_config(None, list(args.overrides))
    sequences = cfg.train.prompts_per_step * cfg.rollout.group_size
    n = args.workers
    with tempfile.TemporaryDirectory() as tmp:
        common = [f"train.steps={args.steps}", "eval.every=0", "eval.size=8", "checkpoint.every=0",
                  "checkpoint.save_final=false", "log.report=false", "log.tensorboard=false", "log.progress=false",
                  f"output_dir={tmp}", *args.overrides]
        if args.mode == "ray":
            ray = [credo, "train", *common, "distributed.backend=ray", "distributed.reward_workers=1"]
            runs = {
                "1 worker": [*ray, "distributed.rollout_workers=1", "train.threads=1", "run_name=r1"],
                f"{n} workers": [*ray, f"distributed.rollout_workers={n}", "train.threads=1", "run_name=rn"],
                f"1 worker, {n} threads": [*ray, "distributed.rollout_workers=1", f"train.threads={n}",
                                           "run_name=r1t"],
            }
            base, many = "1 worker", f"{n} workers"
        else:
            runs = {
                "1 process": [credo, "train", *common, f"train.threads={n}", "run_name=one"],
                f"{n} ranks": [torchrun, "--nproc-per-node", str(n), "--no-python", credo, "train", *common,
                               "train.threads=1", "run_name=dp", "distributed.backend=torchrun"],
            }
            base, many = "1 process", f"{n} ranks"
        rates = {}
        for name, cmd in runs.items():
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
            run = next(a for a in cmd if a.startswith("run_name=")).split("=", 1)[1]
            rates[name], seconds = rollout_rate(Path(tmp) / run / "metrics.jsonl", sequences, args.warmup)
            print(f"{name:<20} rollout phase median {statistics.median(seconds):.3f} s per step of {sequences} "
                  f"sequences -> {rates[name]:,.0f} sequences/s", flush=True)
    print(f"rollout throughput, {many} / {base}: {rates[many] / rates[base]:.2f}x")
    for name in rates:
        if name not in (base, many):
            print(f"  ({name} / {base}: {rates[name] / rates[base]:.2f}x)")


if __name__ == "__main__":
    main()
