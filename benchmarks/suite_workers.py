"""The workloads of benchmarks/suite.py that are not a `credo train` run, each in its own process started by the
suite with the measured tree first on PYTHONPATH (so this file measures whichever checkout the suite names), and
the suite's helper for MFU. Each prints one line `SUITE {json}` with its samples (seconds per unit of work, so
that every ratio of benchmarks/suite.py --compare is a time ratio: below 1 is faster).

    python benchmarks/suite_workers.py sandbox --batches 5 --runs 8        # sandbox throughput
    python benchmarks/suite_workers.py weight_sync --reps 4                # weight-sync transport, no vLLM
    python benchmarks/suite_workers.py mfu --matmul-n 2048 RUN_DIR ...     # peak FLOP/s, parameters per run

- sandbox: credo.sandbox.Sandbox with 2 workers; per batch, the seconds per run of `print(1)` one at a time and
  submitted all at once, and the seconds per test of a 10-test Python submission (judge_batch).
- weight_sync: the transport of credo's torchdist weight sync (credo/rollout/torchdist_sync.py: state packed into
  buckets, gloo broadcast to another process on loopback; benchmarks/vllm_sync.py `wire`), for the demo model and
  SmolLM2-135M (its prepared weights, else its architecture with random weights: the bytes are the same). What a
  vLLM engine's load adds on top is measured by benchmarks/vllm_sync.py in the vLLM venv.
- mfu: a float32 matmul's FLOP/s (benchmarks/mfu.py `matmul_flops`, the machine's practical limit, measured in the
  same invocation as the runs) and the parameter count of each run's policy.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path

MARK = "SUITE "
TRIVIAL = "print(1)"
ADD_PY = "a,b=map(int,input().split())\nprint(a+b)"
TESTS = [{"stdin": f"{i} {2 * i}\n", "expected_stdout": f"{3 * i}\n"} for i in range(10)]


def emit(obj: dict) -> None:
    print(MARK + json.dumps(obj), flush=True)


def sandbox(args) -> dict:
    from credo.sandbox import JudgeRequest, Limits, RunRequest, Sandbox

    limits = Limits(time_s=2.0)
    req = RunRequest(source=TRIVIAL, language="python", limits=limits)
    judge = [JudgeRequest(source=ADD_PY, tests=TESTS, language="python", limits=limits)] * args.submissions
    samples = []
    with Sandbox(workers=args.workers) as sb:
        sb.run(TRIVIAL, "python")  # start the workers
        sb.judge(ADD_PY, "python", TESTS[:1])
        for _ in range(args.batches):
            t0 = time.perf_counter()
            for _ in range(args.runs):
                assert sb.submit(req).result().verdict == "OK"
            serial = (time.perf_counter() - t0) / args.runs
            t0 = time.perf_counter()
            futures = [sb.submit(req) for _ in range(args.runs)]
            assert all(f.result().verdict == "OK" for f in futures)
            parallel = (time.perf_counter() - t0) / args.runs
            t0 = time.perf_counter()
            results = sb.judge_batch(judge)
            assert all(r.verdict == "AC" for r in results), [r.detail for r in results]
            per_test = (time.perf_counter() - t0) / (args.submissions * len(TESTS))
            samples.append({"run_serial": serial, "run_parallel": parallel, "judge_test": per_test})
    return {"steps": samples, "units": {"run_serial": "s per run of print(1), one at a time",
                                        "run_parallel": f"s per run of print(1), {args.runs} submitted at once "
                                                        f"to {args.workers} workers",
                                        "judge_test": "s per test of a 10-test Python submission (judge_batch)"}}


def _state(name: str):
    """(state dict, description) of the demo model or SmolLM2-135M."""
    import torch

    from credo.config import load_config
    from credo.models import build_model

    if name == "demo":
        return build_model(load_config(None, []).model, seed=0)[0].state_dict(), "demo tiny model"
    from credo.models.smollm2 import SMOLLM2_DIR, smollm2_architecture

    if (SMOLLM2_DIR / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(SMOLLM2_DIR / "model.safetensors")), "SmolLM2-135M prepared weights"
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(smollm2_architecture()).state_dict(), "SmolLM2-135M architecture"


def weight_sync(args) -> dict:
    import vllm_sync  # benchmarks/ (this script's directory) is on sys.path

    class Holder:  # vllm_sync.wire reads model.state_dict()
        def __init__(self, state):
            self.state = state

        def state_dict(self):
            return self.state

    samples, units = [], {}
    for name in args.models:
        state, what = _state(name)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        times = vllm_sync.wire(Holder(state), args.reps + 1, args.bucket_mb)[1:]  # the first one warms up
        samples += [{f"sync_{name}": t} for t in times]
        units[f"sync_{name}"] = (f"s per sync of {what} ({nbytes / 2**20:.0f} MiB): pack + gloo broadcast to "
                                 f"another process, loopback, {args.bucket_mb} MiB buckets")
    return {"steps": samples, "units": units}


def safetensors_params(model_dir: Path) -> int:
    """Parameters of a Hugging Face directory, read from its safetensors headers (no tensor is loaded)."""
    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        for key, info in header.items():
            if key != "__metadata__":
                n = 1
                for d in info["shape"]:
                    n *= d
                total += n
    return total


def run_params(run_dir: Path) -> int:
    from credo.config import load_config

    cfg = load_config(str(run_dir / "config.yaml"))
    if cfg.model.path:
        return safetensors_params(Path(cfg.model.path).expanduser())
    from credo.models import build_model

    model = build_model(cfg.model, seed=0)[0]
    return sum(p.numel() for p in model.parameters())


def mfu(args) -> dict:
    import mfu as mfu_bench  # benchmarks/mfu.py

    params = {}
    for d in args.run_dirs:
        try:
            params[d] = run_params(Path(d))
        except Exception as exc:  # one run's config the tree cannot read: no MFU for it, the others keep theirs
            params[d] = f"error: {type(exc).__name__}: {exc}"
    return {"peak_flops": mfu_bench.matmul_flops(args.matmul_n, args.repeats), "matmul_n": args.matmul_n,
            "params": params}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", required=True)
    s = sub.add_parser("sandbox")
    s.add_argument("--batches", type=int, default=5)
    s.add_argument("--runs", type=int, default=8)
    s.add_argument("--submissions", type=int, default=2)
    s.add_argument("--workers", type=int, default=2)
    w = sub.add_parser("weight_sync")
    w.add_argument("--reps", type=int, default=4)
    w.add_argument("--bucket-mb", type=int, default=32)
    w.add_argument("--models", nargs="+", default=["demo", "smollm2"], choices=("demo", "smollm2"))
    m = sub.add_parser("mfu")
    m.add_argument("--matmul-n", type=int, default=2048)
    m.add_argument("--repeats", type=int, default=3)
    m.add_argument("run_dirs", nargs="*")
    args = ap.parse_args(argv)
    emit({"sandbox": sandbox, "weight_sync": weight_sync, "mfu": mfu}[args.kind](args))


if __name__ == "__main__":
    sys.exit(main())
