"""Sandbox throughput: runs/s of a trivial Python program, sandboxed vs a bare subprocess, and tests/s of a
10-test submission, measured in one invocation.

    python benchmarks/sandbox.py [--runs 100] [--workers 2]

The baseline is `python3 -c "print(1)"` started with subprocess.run (no isolation, no limits), timed
in the same process just before the sandbox figures. Must run as root with bubblewrap installed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from credo.sandbox import JudgeRequest, Limits, RunRequest, Sandbox

TRIVIAL = "print(1)"
ADD_PY = "a,b=map(int,input().split())\nprint(a+b)"
ADD_CPP = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}"
TESTS = [{"stdin": f"{i} {2 * i}\n", "expected_stdout": f"{3 * i}\n"} for i in range(10)]


def bare_runs_per_s(n: int, workers: int) -> tuple[float, float]:
    def one(_):
        subprocess.run(["/usr/bin/python3", "-c", TRIVIAL], capture_output=True, check=True)

    t0 = time.perf_counter()
    for i in range(n):
        one(i)
    serial = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(n)))
    return serial, n / (time.perf_counter() - t0)


def sandbox_runs_per_s(sb: Sandbox, n: int) -> tuple[float, float]:
    req = RunRequest(source=TRIVIAL, language="python", limits=Limits(time_s=2.0))
    t0 = time.perf_counter()
    for _ in range(n):
        assert sb.submit(req).result().verdict == "OK"
    serial = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    futures = [sb.submit(req) for _ in range(n)]
    assert all(f.result().verdict == "OK" for f in futures)
    return serial, n / (time.perf_counter() - t0)


def tests_per_s(sb: Sandbox, source: str, language: str, submissions: int) -> float:
    reqs = [JudgeRequest(source=source, tests=TESTS, language=language, limits=Limits(time_s=2.0))
            for _ in range(submissions)]
    sb.judge(source, language, TESTS[:1])  # compile (and cache) outside the timing
    t0 = time.perf_counter()
    results = sb.judge_batch(reqs)
    assert all(r.verdict == "AC" for r in results), [r.detail for r in results]
    return submissions * len(TESTS) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--submissions", type=int, default=10)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores; {args.runs} runs of python3 -c 'print(1)'; {args.workers} workers")
    bare_serial, bare_par = bare_runs_per_s(args.runs, args.workers)
    with Sandbox(workers=args.workers) as sb:
        sb.run(TRIVIAL, "python")  # start the workers
        sb_serial, sb_par = sandbox_runs_per_s(sb, args.runs)
        py_tests = tests_per_s(sb, ADD_PY, "python", args.submissions)
        cpp_tests = tests_per_s(sb, ADD_CPP, "cpp", args.submissions)
    print(f"{'':34}{'runs/s':>10}{'vs bare':>10}")
    print(f"{'bare subprocess, one at a time':34}{bare_serial:>10.1f}{1.0:>10.2f}")
    print(f"{'sandbox, one at a time':34}{sb_serial:>10.1f}{sb_serial / bare_serial:>10.2f}")
    print(f"{f'bare subprocess, {args.workers} threads':34}{bare_par:>10.1f}{1.0:>10.2f}")
    print(f"{f'sandbox, {args.workers} workers':34}{sb_par:>10.1f}{sb_par / bare_par:>10.2f}")
    print(f"10-test submission, python: {py_tests:.1f} tests/s ({py_tests / 10:.1f} submissions/s)")
    print(f"10-test submission, C++ (compiled once, cached): {cpp_tests:.1f} tests/s")


if __name__ == "__main__":
    main()
