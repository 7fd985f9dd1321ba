"""The GPU certification check (issue 36, item 7), driven by tools/gpu_check.sh. NEVER RUN ON A GPU YET: written
for one CUDA machine and dry-run on the CPU only (docs/distributed.md, "GPU certification").

    tools/gpu_check.sh [--out gpu_check.json] [--budget-s 570] [--dry-run] [--only NAME ...]

Runs, each with a timeout and all within --budget-s (10 minutes at most on one GPU), the steps below and writes
ONE JSON file: the machine's facts (nvidia-smi, torch.cuda) and per step its name, command, status (passed /
failed / skipped / dry-run), reason, wall seconds and the figures parsed from its output (pytest's counts, a run's
median step time and timing_s/* from metrics.jsonl, peak CUDA memory, the weight-sync benchmark's medians).

- the `gpu`- and `vllm`-marked tests on CUDA;
- a Qwen2-0.5B-sized policy built from a config (hidden 896, MLP 4864, 24 layers, 14 heads, 2 KV heads; no hub:
  credo's own small tokenizer, so the vocabulary and embeddings are smaller than Qwen2's) stepping RL on CUDA with
  credo's HF engine, with vLLM colocated in process (sleep / wake between rollouts) and with vLLM as a server;
- FSDP2 over every visible GPU (torchrun, nccl); activation checkpointing, bf16 mixed precision and the NCCL
  weight sync when this tree has their config keys (probed with load_config; a step whose key is missing is
  skipped with the reason recorded); the weight-sync benchmark (benchmarks/vllm_sync.py);
- ``credo parity`` with that policy on CUDA, float32 and bfloat16, HF engine and vLLM: each step's JSON report is
  kept and its out-of-range shares become the step's figures (docs/parity.md).

A step that needs what is absent (no CUDA, no vLLM, a config key not in the tree) is skipped with its reason; in
--dry-run nothing is started and every step is listed with its command and status "dry-run" (plus the reason it
would be skipped, if any).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# Qwen2-0.5B's shape (its config.json), built from credo's model keys; the vocabulary is credo's own tokenizer's.
QWEN2_0P5B = ["model.arch=qwen2", "model.hidden_size=896", "model.intermediate_size=4864", "model.num_layers=24",
              "model.num_heads=14", "model.num_kv_heads=2", "model.max_position_embeddings=2048"]
RL_RUN = ["train.steps=4", "train.prompts_per_step=8", "rollout.group_size=8", "rollout.max_new_tokens=64",
          "warm_start.enabled=false", "eval.every=0", "log.report=false", "log.tensorboard=false",
          "checkpoint.every=0"]
# Candidate config keys of features other work adds (issue 36 items 2-4): the first one load_config accepts is used.
FEATURE_KEYS = {
    "activation_checkpointing": [["train.activation_checkpointing=true"]],
    "mixed_precision_bf16": [["train.mixed_precision=bf16"]],
    # vLLM colocated in process on the trainer's GPU: vLLM's CUDA IPC engine (NCCL refuses two ranks on one GPU,
    # so vLLM's nccl engine needs the engine on a GPU of its own, which this one-GPU check does not set up)
    "weight_sync_ipc": [["rollout.vllm.weight_sync=ipc"]],
    "optimizer_offload": [["train.optimizer_offload=true"]],
    "lora_vllm": [["model.lora.r=8"]],
}


@dataclass
class Step:
    name: str
    command: list[str]
    timeout_s: float
    needs: list[str] = field(default_factory=list)  # cuda, vllm, feature:<name>
    kind: str = "run"  # pytest, train, bench, parity
    run_dir: str | None = None
    env: dict = field(default_factory=dict)
    overrides: list[str] | None = None  # a train step's config overrides, where its command is a script


def _train(out_dir: Path, name: str, *overrides: str, launcher: list[str] | None = None) -> tuple[list[str], str]:
    run_dir = str(out_dir / name)
    if launcher:  # torchrun: each rank the console script on its own GPU (credo also pins cuda:LOCAL_RANK itself)
        cmd = [*launcher, "bash", "-c", 'CUDA_VISIBLE_DEVICES=$LOCAL_RANK exec credo "$@"', "credo-rank",
               "train", "--run-dir", run_dir]
    else:  # in process through the peak-memory wrapper below
        cmd = [PY, str(Path(__file__).resolve()), "_peak", "--", "train", "--run-dir", run_dir]
    return [*cmd, *QWEN2_0P5B, *RL_RUN, *overrides], run_dir


def steps(out_dir: Path, n_gpus: int) -> list[Step]:
    cuda = ["model.device=cuda"]
    vllm = ["rollout.engine=vllm", "rollout.vllm.dtype=auto", "rollout.vllm.gpu_memory_utilization=0.3"]
    out: list[Step] = []
    pt = [PY, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "tests"]
    out.append(Step("pytest_gpu", [*pt, "-m", "gpu"], 90, ["cuda"], "pytest"))
    for name, over, t, needs in [
        ("rl_hf_cuda", cuda, 90, ["cuda"]),
        ("rl_vllm_colocated_sleep", [*cuda, *vllm, "rollout.vllm.mode=inprocess", "rollout.vllm.sleep=true"], 120,
         ["cuda", "vllm"]),
        ("rl_vllm_server", [*cuda, *vllm, "rollout.vllm.mode=server"], 120, ["cuda", "vllm"]),
    ]:
        cmd, rd = _train(out_dir, name, *over)
        out.append(Step(name, cmd, t, needs, "train", rd))
    cmd, rd = _train(out_dir, "fsdp2_all_gpus", *cuda, "distributed.backend=torchrun", "distributed.strategy=fsdp2",
                     "distributed.comm=nccl",
                     launcher=["torchrun", "--standalone", f"--nproc-per-node={max(n_gpus, 1)}", "--no-python"])
    out.append(Step("fsdp2_all_gpus", cmd, 120, ["cuda"], "train", rd))
    out.append(fsdp2_resume_step(out_dir, n_gpus, cuda))
    for feat, extra in [("activation_checkpointing", []), ("mixed_precision_bf16", []), ("optimizer_offload", []),
                        ("weight_sync_ipc", vllm + ["rollout.vllm.mode=inprocess"]),
                        ("lora_vllm", vllm + ["rollout.vllm.mode=inprocess"])]:
        keys = probe_feature(feat)
        cmd, rd = _train(out_dir, feat, *cuda, *extra, *(keys or FEATURE_KEYS[feat][0]))
        out.append(Step(feat, cmd, 90, ["cuda", f"feature:{feat}"] + (["vllm"] if extra else []), "train", rd))
    out.append(Step("weight_sync_bench", [PY, "benchmarks/vllm_sync.py", "--models", "smollm2", "--reps", "3"], 120,
                    ["cuda", "vllm"], "bench"))
    out.append(Step("pytest_vllm", [*pt, "-m", "vllm"], 240, ["cuda", "vllm"], "pytest"))
    out.extend(parity_steps(out_dir))
    return out


def parity_steps(out_dir: Path) -> list[Step]:
    """``credo parity`` on CUDA (docs/parity.md): the Qwen2-0.5B-shaped policy, float32 and bfloat16, against
    credo's HF engine and vLLM; each writes its JSON report (figures: the worst out-of-range share and each
    comparison's). Recorded, not gated: a bfloat16 share above 0 is the measurement."""
    steps_ = []
    for engine, dtype, t in [("hf", "float32", 120), ("hf", "bfloat16", 120), ("vllm", "float32", 150),
                             ("vllm", "bfloat16", 150)]:
        report = str(out_dir / f"parity_{engine}_{dtype}.json")
        extra = ["rollout.vllm.gpu_memory_utilization=0.3"] if engine == "vllm" else []
        overrides = [*QWEN2_0P5B, "model.device=cuda", "rollout.group_size=8", "rollout.max_new_tokens=48", *extra]
        cmd = [PY, "-m", "credo.cli.main", "parity", "tiny", "--engine", engine, "--dtype", dtype, "--rows", "32",
               "--out", report, *overrides]
        steps_.append(Step(f"parity_{engine}_{'bf16' if dtype == 'bfloat16' else 'fp32'}", cmd, t,
                           ["cuda"] + (["vllm"] if engine == "vllm" else []), "parity", report, overrides=overrides))
    return steps_


def fsdp2_resume_step(out_dir: Path, n_gpus: int, cuda: list[str]) -> Step:
    """FSDP2 on every visible GPU preempted after its step-2 checkpoint (SIGTERM to torchrun, which relays it to
    the ranks: credo checkpoints and exits 75, docs/security.md "Preemption"), then ``--resume`` to step 6 from the
    sharded (torch.distributed.checkpoint) state. The same script, with gloo and a tiny model on 2 CPU ranks, was
    run by hand here: preempted after step 2, resumed, metrics.jsonl steps 1-6 once each."""
    launcher = ["torchrun", "--standalone", f"--nproc-per-node={max(n_gpus, 1)}", "--no-python"]
    first, rd = _train(out_dir, "fsdp2_resume", *cuda, "distributed.backend=torchrun", "distributed.strategy=fsdp2",
                       "distributed.comm=nccl", "checkpoint.every=1", "train.steps=6", launcher=launcher)
    first = [a for a in first if a not in ("checkpoint.every=0", "train.steps=4")]  # RL_RUN's, overridden here
    resume = [*launcher, "bash", "-c", 'CUDA_VISIBLE_DEVICES=$LOCAL_RANK exec credo "$@"', "credo-rank", "train",
              "--resume", rd]
    script = (f"{shlex.join(first)} & pid=$!; "
              f"for i in $(seq 1200); do [ -e {shlex.quote(rd)}/checkpoints/step_000002/COMPLETE ] && break; "
              "kill -0 $pid 2>/dev/null || break; sleep 0.25; done; "
              'kill -TERM $pid 2>/dev/null; wait $pid; echo "gpu_check: first run: torchrun exit code $? (its ranks checkpoint and exit 75; torchrun itself exits 1)"; '
              f"exec {shlex.join(resume)}")
    return Step("fsdp2_resume", ["bash", "-c", script], 180, ["cuda"], "train", rd, overrides=overrides_of_cmd(first))


_probed: dict[str, list[str] | None] = {}


def config_error(overrides: list[str]) -> str | None:
    """None when this tree's config accepts ``overrides`` (credo.config.load_config), else its message."""
    from credo.config import load_config

    try:
        load_config(None, list(overrides))
    except Exception as e:  # ConfigError, or a schema check
        return f"{type(e).__name__}: {e}"
    return None


def probe_feature(feat: str) -> list[str] | None:
    """The first candidate overrides of ``feat`` that this tree's config accepts, or None."""
    if feat not in _probed:
        _probed[feat] = next((keys for keys in FEATURE_KEYS[feat] if config_error(keys) is None), None)
    return _probed[feat]


def facts() -> dict:
    """nvidia-smi's and torch.cuda's view of the machine, and whether vLLM imports."""
    out: dict = {"python": sys.version.split()[0], "host_cpus": os.cpu_count()}
    smi = shutil.which("nvidia-smi")
    if smi:
        q = "name,memory.total,driver_version,compute_cap"
        r = subprocess.run([smi, f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=30)
        out["nvidia_smi"] = [dict(zip(q.split(","), (v.strip() for v in line.split(","))))
                             for line in r.stdout.strip().splitlines()] if r.returncode == 0 else r.stderr.strip()
    else:
        out["nvidia_smi"] = "not found"
    import torch

    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    out["gpus"] = [{"name": torch.cuda.get_device_name(i),
                    "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                    "bf16": torch.cuda.is_bf16_supported()} for i in range(torch.cuda.device_count())]
    r = subprocess.run([PY, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True,
                       timeout=120)
    out["vllm"] = r.stdout.strip() if r.returncode == 0 else None
    return out


def skip_reason(step: Step, env: dict) -> str | None:
    """Every reason ``step`` cannot run here, joined; None when it can."""
    reasons = []
    for need in step.needs:
        if need == "cuda" and not env["cuda_available"]:
            reasons.append("no CUDA device (torch.cuda.is_available() is False)")
        if need == "vllm" and not env["vllm"]:
            reasons.append("vLLM does not import here")
        if need.startswith("feature:"):
            feat = need.split(":", 1)[1]
            if probe_feature(feat) is None:
                tried = ", ".join(" ".join(k) for k in FEATURE_KEYS[feat])
                reasons.append(f"not in this tree yet: the config refuses {tried}")
    return "; ".join(reasons) or None


def overrides_of(step: Step) -> list[str]:
    """A credo train step's config overrides (what follows its --run-dir)."""
    return step.overrides if step.overrides is not None else overrides_of_cmd(step.command)


def overrides_of_cmd(cmd: list[str]) -> list[str]:
    return cmd[cmd.index("--run-dir") + 2:] if "--run-dir" in cmd else []


def parse_pytest(text: str) -> dict:
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed)", text)}
    return counts


def parse_run(run_dir: str) -> dict:
    """Median step time and every timing_s/* and perf/* median over steps >= 1 (step 0 carries the warm-up)."""
    out: dict = {}
    rd = Path(run_dir)
    mfile = rd / "metrics.jsonl"
    if mfile.is_file():
        rows = [json.loads(line) for line in mfile.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "timing_s/step" in r]
        later = rows[1:] or rows
        keys = sorted({k for r in later for k in r if k.startswith(("timing_s/", "perf/"))})
        for k in keys:
            vals = [r[k] for r in later if isinstance(r.get(k), (int, float))]
            if vals:
                out[k + " (median)"] = round(statistics.median(vals), 4)
        out["steps_logged"] = len(rows)
        if rows:
            out["first_step_s"] = rows[0]["timing_s/step"]
    for name in ("summary.json", "peak_cuda.json"):
        f = rd / name
        if f.is_file():
            data = json.loads(f.read_text())
            out.update({k: v for k, v in data.items() if k in ("train_wall_s", "parameters") or k.startswith("peak")})
    return out


def parse_bench(text: str) -> dict:
    """benchmarks/vllm_sync.py's medians: ``MODEL wire only (...): median S s`` and, under each
    ``MODEL (...) MODE: start-up ...`` header, one ``  KIND S s ...`` line per backend."""
    out: dict = {}
    where = None
    for line in text.splitlines():
        if m := re.match(r"^(\w+) wire only .*?: median ([\d.]+) s", line):
            out[f"{m[1]} wire only median s"] = float(m[2])
        elif m := re.match(r"^(\w+) \(.*\) (\w+): start-up ([\d.]+) s", line):
            where = f"{m[1]} {m[2]}"
            out[f"{where} start-up s"] = float(m[3])
        elif where and (m := re.match(r"^  (\S+)\s+([\d.]+) s \(min", line)):
            out[f"{where} {m[1]} sync median s"] = float(m[2])
        elif not line.startswith("  "):
            where = None
    return out


def parse_parity(report_file: str) -> dict:
    """``credo parity --out FILE``'s figures: the worst out-of-range share, and per comparison its share and
    max |log-prob difference|."""
    f = Path(report_file)
    if not f.is_file():
        return {}
    report = json.loads(f.read_text())
    out: dict = {"worst_out_of_range": report.get("worst_out_of_range")}
    for v in report.get("variants", []):
        out[f"{v['name']} out_of_range"] = v.get("out_of_range")
        out[f"{v['name']} max_abs"] = v.get("max_abs")
    return out


def run_step(step: Step, budget_end: float, logs: Path) -> dict:
    left = budget_end - time.monotonic()
    if left < 20:
        return {"status": "skipped", "reason": f"out of the time budget ({left:.0f} s left)"}
    timeout = min(step.timeout_s, left)
    t0 = time.monotonic()
    log = logs / f"{step.name}.log"
    with open(log, "w") as fh:
        try:
            proc = subprocess.Popen(step.command, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                    env={**os.environ, **step.env}, start_new_session=True)
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = None
        except FileNotFoundError as e:
            rc, fh_err = 127, str(e)
            fh.write(fh_err)
    wall = round(time.monotonic() - t0, 2)
    text = log.read_text(errors="replace")
    res: dict = {"wall_s": wall, "log": str(log), "returncode": rc}
    if rc is None:
        res.update(status="failed", reason=f"timed out after {timeout:.0f} s")
    elif rc != 0 and not (step.kind == "pytest" and rc == 5):  # 5: pytest collected nothing
        res.update(status="failed", reason=f"exit code {rc}: " + " | ".join(text.strip().splitlines()[-3:])[-600:])
    else:
        res["status"] = "passed"
    if step.kind == "pytest":
        res["figures"] = parse_pytest(text.strip().splitlines()[-1] if text.strip() else "")
    elif step.kind == "train" and step.run_dir:
        res["figures"] = parse_run(step.run_dir)
    elif step.kind == "bench":
        res["figures"] = parse_bench(text)
    elif step.kind == "parity" and step.run_dir:
        res["figures"] = parse_parity(step.run_dir)
    return res


def compare_to_baseline(entries: list[dict], baseline: str = "rl_hf_cuda") -> None:
    """Figures of the feature steps (same run as ``baseline`` plus one override) as ratios to ``baseline``'s."""
    base = next((e for e in entries if e["name"] == baseline and e["status"] == "passed"), None)
    if base is None:
        return
    for e in entries:
        if e["name"] in FEATURE_KEYS and e["status"] == "passed":
            for key in ("peak_allocated_gib", "timing_s/step (median)"):
                a, b = e.get("figures", {}).get(key), base.get("figures", {}).get(key)
                if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
                    e["figures"][f"{key} / {baseline}'s"] = round(a / b, 4)


def peak_main(argv: list[str]) -> int:
    """``gpu_check.py _peak -- <credo args>``: credo's CLI in this process, then peak CUDA memory into the run dir."""
    import torch

    from credo.cli.main import main

    code = main(argv)
    if torch.cuda.is_available() and "--run-dir" in argv:
        rd = Path(argv[argv.index("--run-dir") + 1])
        if rd.is_dir():
            (rd / "peak_cuda.json").write_text(json.dumps({
                "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3)}))
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_peak"]:
        return peak_main(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json", help="the JSON file written")
    ap.add_argument("--work-dir", default=None, help="run directories and logs (default: OUT's stem + _runs)")
    ap.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget of all steps together")
    ap.add_argument("--dry-run", action="store_true", help="list the steps and commands; start nothing")
    ap.add_argument("--only", nargs="+", default=None, help="run only these steps")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    out = Path(args.out).resolve()
    work = Path(args.work_dir).resolve() if args.work_dir else out.with_name(out.stem + "_runs")
    env = facts()
    plan = steps(work, len(env["gpus"]))
    if args.only:
        unknown = set(args.only) - {s.name for s in plan}
        if unknown:
            ap.error(f"unknown step(s) {sorted(unknown)}; steps: {[s.name for s in plan]}")
        plan = [s for s in plan if s.name in args.only]
    report = {"tool": "tools/gpu_check.sh", "note": "never run on a GPU yet (docs/distributed.md)",
              "dry_run": args.dry_run, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "budget_s": args.budget_s, "facts": env, "steps": []}
    if not args.dry_run:
        (work / "logs").mkdir(parents=True, exist_ok=True)
    budget_end = t_start + args.budget_s
    for step in plan:
        entry = {"name": step.name, "command": shlex.join(step.command), "timeout_s": step.timeout_s}
        reason = skip_reason(step, env)
        if step.kind in ("train", "parity") and not any(n.startswith("feature:") and probe_feature(n[8:]) is None
                                            for n in step.needs):
            entry["config_error"] = config_error(overrides_of(step))  # a renamed key shows here, on the CPU too
        if args.dry_run:
            entry.update(status="dry-run", would_skip=reason, wall_s=0.0, figures={})
        elif reason:
            entry.update(status="skipped", reason=reason, wall_s=0.0, figures={})
        else:
            print(f"gpu_check: {step.name} ...", flush=True)
            entry.update(run_step(step, budget_end, work / "logs"))
        print(f"gpu_check: {step.name}: {entry['status']}"
              f"{' (' + str(entry.get('reason') or entry.get('would_skip')) + ')' if entry.get('reason') or entry.get('would_skip') else ''}",
              flush=True)
        report["steps"].append(entry)
        out.write_text(json.dumps(report, indent=2) + "\n")  # after every step: a killed check keeps what ran
    compare_to_baseline(report["steps"])
    report["wall_s"] = round(time.monotonic() - t_start, 2)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu_check: wrote {out}", flush=True)
    failed = [s["name"] for s in report["steps"] if s["status"] == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
