"""Behaviour-unchanged check for refactors: run short, seeded training runs with two checkouts of credo and compare
their ``metrics.jsonl`` rows (timing fields aside); and resume runs written by the old checkout with the new one.

    git worktree add /tmp/base OLD_COMMIT
    python tools/same_metrics.py run  --src /tmp/base --out /tmp/golden-old
    python tools/same_metrics.py run  --src . --out /tmp/golden-new
    python tools/same_metrics.py diff /tmp/golden-old /tmp/golden-new
    python tools/same_metrics.py resume --old /tmp/base --new . --out /tmp/resume-check

``run`` executes ``python -m credo.cli.main train ...`` for each case in CASES with ``PYTHONPATH=SRC`` and
``cwd=SRC`` (so a ``git worktree`` of an older commit runs its own code, not an editable install of another tree:
checked before the first case) and prints each case's wall time. ``diff`` prints the first differing fields of
every case and exits 1 when any case differs or is missing from one side.

``resume`` checks that runs written by the OLD checkout resume under the NEW one: for each case of RESUME, the old
code trains uninterrupted (``full``) and again interrupted at the start of one step (``cut``: a KeyboardInterrupt
raised where ``rl_step`` would run, as tests/conftest.py's ``full_and_resumed_runs`` does, after a checkpoint and a
later metrics row that resume must drop); copies of ``cut`` are resumed with ``credo train --resume`` by the new code
(``cut_new``) and, as a control, by the old code (``cut_old``). It exits 1 unless every ``cut_new`` has ``full``'s
rows. The commands use the config keys of the older layout on purpose: the newer code must still load them (with
deprecation notices), and the resumed runs load the old code's config.yaml and checkpoints.

Measured (2 CPU cores shared with other jobs, load average 8-10): ``run`` of all 16 cases 12-15 min wall, about
4 min of CPU (20-140 s a case; agent_calc and agent_tools the longest); ``resume`` of its 5 cases 7.6 min wall,
3.2 min of CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SHORT = ["train.steps=3", "eval.every=2", "eval.size=16", "eval.k=2", "warm_start.steps=80", "log.progress=false",
         "log.tensorboard=false", "log.report=false", "checkpoint.every=0", "checkpoint.save_final=false",
         "train.threads=1"]
TEACHER = "{teacher}"  # replaced by the directory of a teacher that `run` / `resume` builds with the checkout itself
CASES = {
    "demo": [],
    "attnrl": ["-c", "attnrl"],
    "rlep": ["-c", "rlep", "replay.collect_prompts=32", "replay.collect_samples=8"],
    "vepo": ["-c", "vepo"],
    "ppo_critic": ["-c", "ppo"],
    "dvpo_critic": ["-c", "dvpo"],
    "agent_calc": ["-c", "agent_calc", "eval.size=8"],
    "one_step_off": ["rollout.one_step_off=true"],
    # issue 34's additions
    "distill": ["-c", "distill", f"distill.teacher.path={TEACHER}"],
    "lora": ["-c", "lora_grpo"],
    "dfpo": ["-c", "dfpo"],
    # verl's bypass mode: the old log-probs are the sampler's (no old-log-prob pass), several mini-batches, the
    # reinforce loss with token IS weights and token rejection sampling
    "bypass_mode": ["algo.policy_loss=bypass_mode", "train.mini_batch_size=64",
                    "algo.policy_loss_args={loss_type: reinforce, rollout_is: token, rollout_rs: token_k1, "
                    "rollout_rs_threshold: '0.5_2.0'}"],
    # a warm start of 40 steps of 8 demonstrations: enough for parsed tool calls and a nonzero reward
    "agent_tools": ["-c", "agent_tools", "eval.size=8", "train.prompts_per_step=4", "rollout.group_size=4",
                    "warm_start.steps=40", "warm_start.batch_size=8"],
    "vepo_vision": ["-c", "vepo_vision", "warm_start.steps=40", "train.prompts_per_step=8", "eval.k=2"],
    # bounded staleness K = 2 with partial rollouts (each batch's decoding switches to newer policies mid-way)
    "staleness_partial": ["rollout.max_staleness=2", "rollout.partial=true"],
}
# resume cases: (case, extra overrides, interrupted at the start of this step). 4 steps, checkpoint at step 2,
# interrupted before step 4 (index 3): the cut run holds checkpoint 2 and the row of step 3, which resume drops.
RESUME_ARGS = ["train.steps=4", "checkpoint.every=2"]
RESUME = {
    "demo": ([], 3),
    "ppo_critic": ([], 3),
    "distill": ([], 3),
    "lora": ([], 3),
    "staleness_partial": (["train.steps=5"], 3),  # batches 3 and 4 queued (or partly decoded) at the interruption
}
TIMING = ("timing_s/", "perf/", "time/")

# Runs credo.cli.main from SRC (sys.path[0]) with rl_step raising KeyboardInterrupt at the start of step STOP_AT.
_INTERRUPTED = """
import sys
src, stop_at, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
sys.path.insert(0, src)
import credo.recipes.rlvr as rlvr
from credo.cli.main import main
real = rlvr.rl_step
def interrupted(cfg, parts, state, *, step):
    if step == stop_at:
        raise KeyboardInterrupt
    return real(cfg, parts, state, step=step)
rlvr.rl_step = interrupted
code = main(argv)
sys.exit(3 if code == 0 else 0)  # 0 = interrupted as planned
"""


def _env(src: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(src.resolve()), OMP_NUM_THREADS="1", PYTHONHASHSEED="0")


def check_src(src: Path) -> str:
    """The file ``credo`` is imported from under ``_env(src)`` / ``cwd=src``; raises unless it lies in SRC."""
    p = subprocess.run([sys.executable, "-c", "import credo; print(credo.__file__)"], env=_env(src), cwd=src,
                       capture_output=True, text=True)
    out = p.stdout.strip() if p.returncode == 0 else (p.stderr.strip().splitlines() or ["no output"])[-1]
    if p.returncode != 0 or Path(out).resolve().parent.parent != src.resolve():
        raise SystemExit(f"{src}: credo is not imported from this checkout ({out})")
    return out


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "credo.cli.main", "-q", *argv]


def _call(src: Path, cmd: list[str], log: Path) -> float:
    """Run CMD from SRC with its output appended to LOG; raises with the log's tail on a nonzero exit."""
    print("$", " ".join(a if a != _INTERRUPTED else "<interrupting driver>" for a in cmd), flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        code = subprocess.run(cmd, env=_env(src), cwd=src, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise SystemExit(f"{tail}\nexit {code} (log: {log})")
    return time.perf_counter() - t0


def build_teacher(src: Path, out: Path) -> Path:
    """A distillation teacher: the demo model after a short warm start and one GRPO step with another seed, written
    by the checkout's own CLI (final/ is a Hugging Face directory with the student's tokenizer)."""
    teacher = out / "_teacher"
    if not (teacher / "final" / "config.json").is_file():
        _call(src, _cli("train", "seed=11", "warm_start.steps=40", "train.steps=1", "eval.every=0",
                        "log.progress=false", "log.tensorboard=false", "log.report=false", "checkpoint.every=0",
                        "checkpoint.save_final=true", "train.threads=1", "--run-dir", str(teacher), "--overwrite"),
              out / "_logs" / "_teacher.log")
    return (teacher / "final").resolve()


def _args(src: Path, out: Path, name: str) -> list[str]:
    args = CASES[name]
    if any(TEACHER in a for a in args):
        t = str(build_teacher(src, out))
        args = [a.replace(TEACHER, t) for a in args]
    return args


def _select(names, only: list[str]) -> list[str]:
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(names)}")
    return [n for n in names if not only or n in only]


def run(src: Path, out: Path, only: list[str]) -> list[str]:
    """Train every selected case with SRC's code into OUT/CASE; each case's wall time goes to OUT/walls.json, its
    output to OUT/_logs/CASE.log. Returns the cases that failed (the others still run)."""
    src, out = src.resolve(), out.resolve()
    print(f"credo from {check_src(src)}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    wall_file = out / "walls.json"
    walls = json.loads(wall_file.read_text()) if wall_file.is_file() else {}
    failed = []
    for name in _select(CASES, only):
        cmd = _cli("train", *_args(src, out, name), *SHORT, "--run-dir", str(out / name), "--overwrite")
        log = out / "_logs" / f"{name}.log"
        log.unlink(missing_ok=True)
        shutil.rmtree(out / name, ignore_errors=True)  # a failed case leaves no rows behind for `diff`
        try:
            walls[name] = round(_call(src, cmd, log), 1)
        except SystemExit as e:  # the other cases still run; `run` exits 1
            failed.append(name)
            print(f"[{name}] FAILED\n{e}", flush=True)
            continue
        print(f"[{name}] {walls[name]} s", flush=True)
        wall_file.write_text(json.dumps(walls, indent=1) + "\n")
    if failed:
        print(f"failed: {', '.join(failed)}", flush=True)
    return failed


def rows(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING) and k not in ("time", "wall_s")}
            for line in path.read_text().splitlines() if line.strip()]


def compare(ra: list[dict], rb: list[dict]) -> str | None:
    """None when the rows are equal, else the first difference: row counts, or the first differing row's fields
    (missing on one side or of another value; at most 4 named)."""
    if ra == rb:
        return None
    if len(ra) != len(rb):
        return f"{len(ra)} rows vs {len(rb)}"
    i, (x, y) = next((i, xy) for i, xy in enumerate(zip(ra, rb)) if xy[0] != xy[1])
    keys = sorted(set(x) ^ set(y)) or sorted(k for k in x if x[k] != y[k])
    return f"row {i} (step {x.get('step')}): " + ", ".join(f"{k}: {x.get(k, '<missing>')!r} vs "
                                                           f"{y.get(k, '<missing>')!r}" for k in keys[:4])


def diff(a: Path, b: Path) -> int:
    names_a = {p.name for p in a.iterdir() if (p / "metrics.jsonl").is_file()} if a.is_dir() else set()
    names_b = {p.name for p in b.iterdir() if (p / "metrics.jsonl").is_file()} if b.is_dir() else set()
    if not names_a & names_b:
        print("no case in both directories")
        return 1
    bad = 0
    for case in sorted(names_a | names_b):
        if case not in names_a or case not in names_b:
            bad += 1
            print(f"{case:18s}      only in {a if case in names_a else b}")
            continue
        ra, rb = rows(a / case / "metrics.jsonl"), rows(b / case / "metrics.jsonl")
        msg = compare(ra, rb)
        bad += msg is not None
        print(f"{case:18s} {len(ra):3d} rows  {msg or 'identical'}")
    return 1 if bad else 0


def resume(old: Path, new: Path, out: Path, only: list[str]) -> int:
    """See the module docstring; returns 1 unless every case's resumed-by-new rows equal the uninterrupted ones."""
    old, new, out = old.resolve(), new.resolve(), out.resolve()
    print(f"old: credo from {check_src(old)}\nnew: credo from {check_src(new)}", flush=True)
    results = []
    for name in _select(RESUME, only):
        extra, stop_at = RESUME[name]
        d = out / name
        argv = ["train", *_args(old, out, name), *SHORT, *RESUME_ARGS, *extra]
        t0 = time.perf_counter()
        log = out / "_logs" / f"{name}.log"
        log.unlink(missing_ok=True)
        _call(old, _cli(*argv, "--run-dir", str(d / "full"), "--overwrite"), log)
        _call(old, [sys.executable, "-c", _INTERRUPTED, str(old), str(stop_at), "-q", *argv, "--run-dir",
                    str(d / "cut"), "--overwrite"], log)
        cut_rows = rows(d / "cut" / "metrics.jsonl")
        if [r.get("step") for r in cut_rows][-1:] != [stop_at] or not (d / "cut" / "checkpoints").is_dir():
            raise SystemExit(f"{name}: the interrupted run did not stop after the row of step {stop_at} with a "
                             f"checkpoint (steps {[r.get('step') for r in cut_rows]}); see {log}")
        for side, src in (("cut_new", new), ("cut_old", old)):
            shutil.rmtree(d / side, ignore_errors=True)
            shutil.copytree(d / "cut", d / side, symlinks=True)
            _call(src, _cli("train", "--resume", str(d / side)), log)
        full = rows(d / "full" / "metrics.jsonl")
        got = {side: compare(full, rows(d / side / "metrics.jsonl")) for side in ("cut_new", "cut_old")}
        wall = round(time.perf_counter() - t0, 1)
        results.append((name, len(full), [r.get("step") for r in cut_rows], got, wall))
        print(f"[{name}] {wall} s", flush=True)
    bad = 0
    for name, n, cut_steps, got, wall in results:
        bad += got["cut_new"] is not None
        print(f"{name:18s} {n:3d} rows, cut at steps {cut_steps}: resumed by new: {got['cut_new'] or 'identical'}; "
              f"by old (control): {got['cut_old'] or 'identical'}  ({wall} s)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train every case with one checkout")
    r.add_argument("--src", type=Path, default=Path("."))
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*", default=[])
    d = sub.add_parser("diff", help="compare two `run` outputs")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    s = sub.add_parser("resume", help="resume runs written by the old checkout with the new one")
    s.add_argument("--old", type=Path, required=True)
    s.add_argument("--new", type=Path, default=Path("."))
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--only", nargs="*", default=[])
    args = p.parse_args(argv)
    if args.cmd == "run":
        return 1 if run(args.src, args.out, args.only) else 0
    if args.cmd == "resume":
        return resume(args.old, args.new, args.out, args.only)
    return diff(args.a, args.b)


if __name__ == "__main__":
    raise SystemExit(main())
