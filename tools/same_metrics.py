"""Behaviour-unchanged check for refactors: run a few short, seeded training runs with two checkouts of credo and
compare their ``metrics.jsonl`` rows (timing fields aside).

    python tools/same_metrics.py run  --src /path/to/old/checkout --out /tmp/golden-old
    python tools/same_metrics.py run  --src . --out /tmp/golden-new
    python tools/same_metrics.py diff /tmp/golden-old /tmp/golden-new

``run`` executes ``python -m credo.cli.main train ...`` with ``PYTHONPATH=SRC`` (so a ``git worktree`` of an
older commit runs its own code) for each case below; ``diff`` prints the first differing field of every case and
exits 1 when any case differs (cases present in both directories are compared). The commands use the config keys of the older layout on purpose: the newer code
must still load them (with deprecation notices).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SHORT = ["train.steps=3", "eval.every=2", "eval.size=16", "eval.k=2", "warm_start.steps=80", "log.progress=false",
         "log.tensorboard=false", "log.report=false", "checkpoint.every=0", "checkpoint.save_final=false",
         "train.threads=1"]
CASES = {
    "demo": [],
    "attnrl": ["-c", "attnrl"],
    "rlep": ["-c", "rlep", "replay.collect_prompts=32", "replay.collect_samples=8"],
    "vepo": ["-c", "vepo"],
    "ppo_critic": ["-c", "ppo"],
    "dvpo_critic": ["-c", "dvpo"],
    "agent_calc": ["-c", "agent_calc", "eval.size=8"],
    "one_step_off": ["rollout.one_step_off=true"],
}
TIMING = ("timing_s/", "perf/", "time/")


def run(src: Path, out: Path, only: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(src.resolve()), OMP_NUM_THREADS="1")
    for name, args in CASES.items():
        if only and name not in only:
            continue
        run_dir = out / name
        cmd = [sys.executable, "-m", "credo.cli.main", "-q", "train", *args, *SHORT, "--run-dir", str(run_dir),
               "--overwrite"]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, env=env, check=True, cwd=src)


def rows(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING) and k not in ("time", "wall_s")}
            for line in path.read_text().splitlines() if line.strip()]


def diff(a: Path, b: Path) -> int:
    bad = 0
    cases = sorted(p.name for p in a.iterdir() if (p / "metrics.jsonl").is_file() and (b / p.name / "metrics.jsonl").is_file())
    if not cases:
        print("no case in both directories")
        return 1
    for case in cases:
        ra, rb = rows(a / case / "metrics.jsonl"), rows(b / case / "metrics.jsonl")
        msg = "identical" if ra == rb else None
        if msg is None:
            bad += 1
            if len(ra) != len(rb):
                msg = f"{len(ra)} rows vs {len(rb)}"
            else:
                i, (x, y) = next((i, xy) for i, xy in enumerate(zip(ra, rb)) if xy[0] != xy[1])
                keys = sorted(set(x) ^ set(y)) or sorted(k for k in x if x[k] != y.get(k))
                msg = f"row {i}: " + ", ".join(f"{k}: {x.get(k)!r} vs {y.get(k)!r}" for k in keys[:4])
        print(f"{case:14s} {len(ra):3d} rows  {msg}")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--src", type=Path, default=Path("."))
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*", default=[])
    d = sub.add_parser("diff")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    args = p.parse_args()
    if args.cmd == "run":
        run(args.src, args.out, args.only)
        return 0
    return diff(args.a, args.b)


if __name__ == "__main__":
    raise SystemExit(main())
