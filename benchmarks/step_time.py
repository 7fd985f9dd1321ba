"""Per-step time split and throughput of the default `credo train` configuration.

Runs the default config (or a preset plus overrides) for a few RL steps after its own warm start,
then prints the median seconds per phase, each phase's share of the step, and tokens/s. The
baseline in the same run is the step itself: shares are fractions of the measured step time.

    python benchmarks/step_time.py                       # default demo config, 20 steps
    python benchmarks/step_time.py --steps 40 train.prompts_per_step=32
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from credo.config import load_config
from credo.recipes.rlvr import train
from credo.tracking.metrics import read_metrics

PHASES = ("gen", "reward", "old_logprob", "ref", "adv", "update")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=3, help="RL steps excluded from the medians")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, [f"train.steps={args.steps}", "eval.every=0", "checkpoint.every=0",
                                        "checkpoint.save_final=false", "log.report=false", "log.tensorboard=false",
                                        "log.progress=false", *args.overrides])
        run = train(cfg, run_dir=Path(tmp) / "bench")
        rows = [r for r in read_metrics(run / "metrics.jsonl") if "timing_s/step" in r][args.warmup_steps:]
    if not rows:
        sys.exit("no steps measured; increase --steps")
    step = statistics.median(r["timing_s/step"] for r in rows)
    batch = cfg.train.prompts_per_step * cfg.rollout.group_size
    print(f"config: {args.config or 'default'} {' '.join(args.overrides)}".rstrip())
    print(f"batch: {cfg.train.prompts_per_step} prompts x {cfg.rollout.group_size} samples = {batch} sequences; "
          f"median over {len(rows)} steps")
    print(f"{'phase':<14}{'seconds':>10}{'share':>9}")
    for phase in PHASES:
        key = f"timing_s/{phase}"
        if any(key in r for r in rows):
            sec = statistics.median(r.get(key, 0.0) for r in rows)
            print(f"{phase:<14}{sec:>10.4f}{sec / step:>8.1%}")
    print(f"{'step':<14}{step:>10.4f}{1:>8.0%}")
    print(f"tokens/s (prompt+response, whole step): {statistics.median(r['perf/tokens_per_s'] for r in rows):,.0f}")
    print(f"response tokens/s during generation:    {statistics.median(r['perf/gen_tokens_per_s'] for r in rows):,.0f}")
    print(f"response tokens per step:               {statistics.median(r['perf/response_tokens'] for r in rows):,.0f}")
    print(f"mean reward {statistics.mean(r['reward/mean'] for r in rows):.3f}; rows left out of the update (all-zero "
          f"advantages) {statistics.mean(r.get('actor/skipped_rows_frac', 0.0) for r in rows):.0%}")


if __name__ == "__main__":
    main()
