"""Run a command and report its wall time and the peak resident memory of its whole process tree (the sum over
the command and every descendant, sampled every 0.1 s from /proc), which ``/usr/bin/time -v`` cannot give for a
program that starts worker processes (vLLM's engine core and worker, verifier pools).

    python tools/tree_rss.py credo train rollout.engine=vllm
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def children_of() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(entry.name))
    return kids


def tree_rss(root: int) -> int:
    """Bytes resident in ``root`` and all its descendants now."""
    kids, total, todo = children_of(), 0, [root]
    while todo:
        pid = todo.pop()
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
        todo.extend(kids.get(pid, []))
    return total


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    start = time.perf_counter()
    proc = subprocess.Popen(argv)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.1)
    print(f"tree_rss: exit {proc.returncode}, wall {time.perf_counter() - start:.1f} s, "
          f"peak tree RSS {peak / 2**20:.0f} MiB", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
