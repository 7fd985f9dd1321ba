"""On-policy distillation against GRPO at the same compute on the demo task (docs/algorithms/distill.md).

Every arm is the default student (0.5M parameters, 100 SFT steps, 200 RL steps of 16 prompts x 8 samples) with the
same seed; the distill arms add the teacher of benchmarks/distill_teacher.py (built first when --teacher does not
exist). All runs start at the same time, one torch thread each, so they share the machine alike.

    OMP_NUM_THREADS=1 python benchmarks/distill_compare.py --teacher runs/distill_teacher --seeds 0,1,2 \
        --out /tmp/distill_cmp [--arms grpo,distill,distill_pure] [key=value ...]

Prints one row per run and the mean per arm (held-out greedy accuracy and avg@4, after the warm start -> after RL;
the training wall time, and the teacher pass's share of it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = {"grpo": ["--config", "grpo"],
        "distill": ["--config", "distill"],  # advantage mode, coef 1, reward_weight 1
        "distill_pure": ["--config", "distill", "distill.reward_weight=0"],
        "distill_reward": ["--config", "distill", "distill.mode=reward"],
        "distill_loss": ["--config", "distill", "distill.mode=loss"]}


def launch(arm: str, seed: int, out: Path, teacher: Path, extra: list[str]) -> subprocess.Popen:
    run = out / f"{arm}_s{seed}"
    args = [sys.executable, "-m", "credo.cli.main", "-q", "train", *ARMS[arm], "--run-dir", str(run), "--overwrite",
            f"seed={seed}", "train.threads=1", "log.progress=false", "log.report=false", "checkpoint.every=0"]
    if arm.startswith("distill"):
        args.append(f"distill.teacher.path={teacher}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([*args, *extra], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(out / f"{arm}_s{seed}.log", "w"))


def result(run: Path) -> dict[str, float]:
    s = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    teacher_s = sum(r.get("timing_s/teacher", 0.0) for r in rows)
    return {"greedy0": s["start/eval/greedy_acc"], "greedy": s["final/eval/greedy_acc"],
            "avg0": s["start/eval/avg@4"], "avg": s["final/eval/avg@4"], "wall_s": s["train_wall_s"],
            "teacher_s": teacher_s}


def table(results: dict[tuple[str, int], dict[str, float]]) -> str:
    lines = ["| arm | seed | greedy: start -> after | avg@4: start -> after | train wall s | teacher pass s |",
             "|---|---|---|---|---|---|"]

    def row(arm, seed, r):
        return (f"| {arm} | {seed} | {100 * r['greedy0']:.1f}% -> {100 * r['greedy']:.1f}% | {100 * r['avg0']:.1f}% "
                f"-> {100 * r['avg']:.1f}% | {r['wall_s']:.1f} | {r['teacher_s']:.1f} |")

    arms = sorted({a for a, _ in results}, key=list(ARMS).index)
    for arm in arms:
        for (a, seed), r in sorted(results.items()):
            if a == arm:
                lines.append(row(arm, seed, r))
    for arm in arms:
        rs = [r for (a, _), r in results.items() if a == arm]
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}
        lines.append(row(f"**{arm} mean**", f"{len(rs)} seeds", mean))
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", type=Path, default=REPO / "runs" / "distill_teacher")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default="grpo,distill")
    parser.add_argument("--out", type=Path, default=Path("/tmp/distill_cmp"))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for all runs together")
    args, extra = parser.parse_known_args(argv)
    teacher = args.teacher.resolve()
    if not (teacher / "config.json").is_file():
        from distill_teacher import build_teacher  # benchmarks/ (this script's directory) is on sys.path

        print("teacher:", json.dumps(build_teacher(teacher)), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = {(arm, int(s)): launch(arm, int(s), args.out, teacher, extra)
            for arm in args.arms.split(",") for s in args.seeds.split(",")}
    for key, proc in jobs.items():
        try:
            if proc.wait(timeout=args.timeout) != 0:
                raise SystemExit(f"{key}: exit {proc.returncode}; see {args.out}/{key[0]}_s{key[1]}.log")
        except subprocess.TimeoutExpired:
            for p in jobs.values():
                p.kill()
            raise SystemExit(f"runs exceeded --timeout {args.timeout:.0f} s") from None
    print(table({key: result(args.out / f"{key[0]}_s{key[1]}") for key in jobs}))


if __name__ == "__main__":
    cli(sys.argv[1:])
