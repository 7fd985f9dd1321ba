"""Rollout phase time with 1 (A) vs N (B) rollout workers (Ray) or ranks (torchrun), R = B / A.

``--mode ray`` (default): the same `credo train` command (default demo task unless overridden) with
``distributed.backend=ray`` and A = 1 Ray rollout worker, B = N workers (one torch thread each, one trainer rank, one
reward worker); then, for reference, A = 1 worker against B = 1 worker with N threads (the same cores as N workers).
``--mode torchrun``: A = one process with N threads, B = `torchrun --nproc-per-node N` ranks with one thread each
(``distributed.rollout=shard``). Per step it reads the rollout phase (generation + rewards + the ranks' exchange:
timing_s/gen + timing_s/reward + timing_s/gather) from rank 0's metrics.

The two sides alternate in `--rounds` short rounds of separate processes (A, B, A, B, ...: benchmarks/harness.py
`run_rounds`), each a fresh `credo train` of `--steps` steps whose first `--warmup` are left out. The result is
median(B) / median(A) of the rollout phase seconds per step over the pooled steps, with a bootstrap 95% interval
(independent samples), printed as `N workers / 1 worker rollout phase time: R x [lo, hi]` (below 1: B is faster;
the throughput ratio in sequences per second is 1 / R, printed beside it); the proxy is the median response tokens
generated per step on each side (the same work on both when the sampling matches). Raw series go to JSON (--json).

    python benchmarks/scaling.py                  # 2 Ray rollout workers vs 1, demo model
    python benchmarks/scaling.py --mode torchrun  # 2 torchrun ranks vs 1 process
    python benchmarks/scaling.py --workers 2 --rounds 3 train.prompts_per_step=32
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


def rollout_seconds(metrics: Path) -> dict[str, list[float]]:
    """Per RL step: the rollout phase (sum of PHASES) and the response tokens generated, from rank 0's metrics."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing_s/gen" in r]
    return {"times": [sum(r.get(k, 0.0) for k in PHASES) for r in rows],
            "response_tokens": [r.get("perf/response_tokens", 0.0) for r in rows]}


def child(out: Path, cmd: list[str]) -> None:
    """One round of one side: run the `credo train` command in `out`, print its per-step rollout phase as JSON."""
    proc = subprocess.run([*cmd, f"output_dir={out}"], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    run = next(a for a in cmd if a.startswith("run_name=")).split("=", 1)[1]
    print("TIMES " + json.dumps(rollout_seconds(out / run / "metrics.jsonl")))


def sides(args, credo: str, torchrun: str, common: list[str]) -> list[tuple[str, str, list[str], list[str]]]:
    """(label A, label B, command A, command B) of each comparison."""
    n = args.workers
    if args.mode == "ray":
        ray = [credo, "train", *common, "distributed.backend=ray", "distributed.reward_workers=1"]
        one = [*ray, "distributed.rollout_workers=1", "train.threads=1", "run_name=r1"]
        many = [*ray, f"distributed.rollout_workers={n}", "train.threads=1", "run_name=rn"]
        threads = [*ray, "distributed.rollout_workers=1", f"train.threads={n}", "run_name=r1t"]
        return [("1 worker", f"{n} workers", one, many), ("1 worker", f"1 worker, {n} threads", one, threads)]
    one = [credo, "train", *common, f"train.threads={n}", "run_name=one"]
    ranks = [torchrun, "--nproc-per-node", str(n), "--no-python", credo, "train", *common, "train.threads=1",
             "run_name=dp", "distributed.backend=torchrun"]
    return [("1 process", f"{n} ranks", one, ranks)]


def _round_cmd(tmp: Path, name: str, cmd: list[str]):
    def argv(i: int) -> list[str]:  # each round its own output folder: credo refuses an existing run directory
        out = tempfile.mkdtemp(dir=tmp, prefix=f"{name.replace(' ', '_').replace(',', '')}-{i}-")
        return [sys.executable, __file__, "--child", out, "--", *cmd]
    return argv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("ray", "torchrun"), default="ray")
    ap.add_argument("--workers", "--ranks", type=int, default=2, dest="workers")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds: one process per side per round")
    ap.add_argument("--steps", type=int, default=8, help="RL steps per process (round)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of each process left out")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--json", help="raw series and metadata (default: runs/bench/<name>-<time>.json)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="credo overrides for both sides, e.g. train.prompts_per_step=32")
    args = ap.parse_args()
    if args.child:
        child(Path(args.child), args.overrides)
        return
    credo, torchrun = shutil.which("credo"), shutil.which("torchrun")
    if credo is None or torchrun is None:
        sys.exit("needs the credo and torchrun console scripts on PATH (pip install -e .)")
    import harness  # benchmarks/ (this script's directory) is on sys.path
    from credo.config import load_config

    cfg = load_config(None, list(args.overrides))
    sequences = cfg.train.prompts_per_step * cfg.rollout.group_size
    common = [f"train.steps={args.steps}", "eval.every=0", "eval.size=8", "checkpoint.every=0",
              "checkpoint.save_final=false", "log.report=false", "log.tensorboard=false", "log.progress=false",
              *args.overrides]
    print(f"{args.mode}: {sequences} sequences per step; {args.rounds} rounds of {args.steps} steps per side "
          f"({args.warmup} warm-up steps per process left out)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for k, (label_a, label_b, cmd_a, cmd_b) in enumerate(sides(args, credo, torchrun, common)):
            name = f"{label_b} / {label_a} rollout phase time"
            try:
                cmp = harness.run_rounds(_round_cmd(Path(tmp), label_a, cmd_a), _round_cmd(Path(tmp), label_b, cmd_b),
                                         rounds=args.rounds, warmup=args.warmup, marker="TIMES ", timeout=args.timeout,
                                         name=name, labels=(label_a, label_b), seed=args.seed)
            except (RuntimeError, ValueError) as err:
                sys.exit(f"{name}: {err}")
            tokens = [statistics.median(t for out in cmp.raw[key] for t in out["response_tokens"][args.warmup:])
                      for key in ("rounds_a", "rounds_b")]
            cmp.proxy = harness.Proxy("response tokens / step", *tokens)
            cmp.meta["benchmark"] = {**vars(args), "sequences_per_step": sequences}
            path = Path(args.json) if args.json else None  # the reference comparison: NAME-1.json
            harness.report(cmp, path.with_stem(f"{path.stem}-{k}") if path and k else path)
            rate = [sequences / statistics.median(s) for s in (cmp.a, cmp.b)]
            print(f"  sequences/s of rollout phase: {label_a} {rate[0]:,.0f}, {label_b} {rate[1]:,.0f}; throughput "
                  f"{label_b} / {label_a} = 1 / R = {1 / cmp.ratio:.2f}x [{1 / cmp.hi:.2f}, {1 / cmp.lo:.2f}]",
                  flush=True)


if __name__ == "__main__":
    main()
