"""Rollout throughput with 1 vs N data-parallel ranks (torchrun, sharded rollouts), printed as a ratio.

Runs the same `credo train` command (default demo task unless overridden) once in one process with N torch threads
and once as `torchrun --nproc-per-node N` ranks with one thread each (`distributed.rollout=shard`), so both use the
same cores. Per step it reads the rollout phase (generation + rewards + the ranks' exchange) from rank 0's
metrics and reports sequences generated per second of rollout phase, median over the steps after warm-up.
Ray-placed rollout workers are not implemented (docs/distributed.md); this measures the torchrun mode.

    python benchmarks/scaling.py                  # 2 ranks vs 1 process, demo model
    python benchmarks/scaling.py --ranks 2 train.prompts_per_step=32
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
    ap.add_argument("--ranks", type=int, default=2)
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
    with tempfile.TemporaryDirectory() as tmp:
        common = [f"train.steps={args.steps}", "eval.every=0", "eval.size=8", "checkpoint.every=0",
                  "checkpoint.save_final=false", "log.report=false", "log.tensorboard=false", "log.progress=false",
                  f"output_dir={tmp}", *args.overrides]
        runs = {
            "1 process": [credo, "train", *common, f"train.threads={args.ranks}", "run_name=one"],
            f"{args.ranks} ranks": [torchrun, "--nproc-per-node", str(args.ranks), "--no-python", credo, "train",
                                    *common, "train.threads=1", "run_name=dp", "distributed.backend=torchrun"],
        }
        rates = {}
        for (name, cmd), run in zip(runs.items(), ("one", "dp")):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
            rates[name], seconds = rollout_rate(Path(tmp) / run / "metrics.jsonl", sequences, args.warmup)
            print(f"{name:<10} rollout phase median {statistics.median(seconds):.3f} s per step of {sequences} "
                  f"sequences -> {rates[name]:,.0f} sequences/s", flush=True)
    one, many = rates["1 process"], rates[f"{args.ranks} ranks"]
    print(f"rollout throughput, {args.ranks} ranks / 1 process: {many / one:.2f}x")


if __name__ == "__main__":
    main()
