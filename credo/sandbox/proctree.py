"""Accounting of one run without a cgroup (rootless and unsafe modes): the process tree read from ``/proc``.

:class:`ProcessTree` offers the measurements of :class:`~credo.sandbox.cgroups.RunCgroup` (CPU seconds,
peak memory, a memory-limit flag, kill-all) for the tree rooted at the process the executor started. The
watchdog calls :meth:`ProcessTree.sample` on every poll: CPU time is the sum over live processes of their own
and their reaped children's CPU time; memory is the tree's resident set (the proportional set size once the
plain sum passes the limit, so pages shared after ``fork`` count once). Between two samples a run can exceed
the limit; the address-space rlimit bounds by how much. After the run, :meth:`finish` folds in the exact
totals ``wait4`` reports for the whole tree.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _has_children_files() -> bool:
    return Path(f"/proc/self/task/{os.getpid()}/children").exists()


_CHILDREN_FILES = _has_children_files()  # CONFIG_PROC_CHILDREN; without it the tree is found by a /proc scan
_RESCAN_EVERY = 8  # samples between two searches for new processes (known ones are read on every sample)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all its threads'), [] if it is gone."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


def _parents() -> dict[int, list[int]]:
    """parent pid -> child pids of every process on the host (one pass over ``/proc``)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(root: int) -> list[int]:
    """``root`` and every live descendant (breadth first; bounded by the number of processes seen)."""
    lookup = children if _CHILDREN_FILES else _parents().get
    seen, queue = [root], [root]
    while queue and len(seen) < 1 << 16:
        for child in lookup(queue.pop(0)) or ():
            if child not in seen:
                seen.append(child)
                queue.append(child)
    return seen


def _stat(pid: int) -> tuple[float, int, int] | None:
    """(CPU seconds of ``pid`` and its reaped children, resident bytes, start time in ticks), None if it is gone
    or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # fields from 3 (state) on; comm may contain spaces
    if fields[0] in ("Z", "X"):
        return None
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / _TICK, int(fields[21]) * _PAGE, int(fields[19])


def _pss(pid: int) -> int:
    """Proportional set size of ``pid`` in bytes (0 if unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


class ProcessTree:
    """CPU time and memory of the process ``root`` and its descendants; kills them all on request."""

    def __init__(self, root: int, memory_limit: int):
        self.root = root
        self.memory_limit = memory_limit
        self.cpu = 0.0
        self.peak = 0
        self.memory_exceeded = False
        self.known = [root]
        self.seen: dict[int, int] = {}  # every pid of the run seen so far -> its start time (pids get reused)
        self.samples = 0

    def pids(self) -> list[int]:
        return [p for p in descendants(self.root) if _stat(p) is not None]

    def sample(self) -> None:
        """Read the tree's CPU time and memory now; sets ``memory_exceeded`` past the limit."""
        if self.samples < _RESCAN_EVERY or self.samples % _RESCAN_EVERY == 0:  # the run's first processes start now
            self.known = descendants(self.root)
        self.samples += 1
        cpu, rss, live = 0.0, 0, []
        for pid in self.known:
            stat = _stat(pid)
            if stat is not None:
                cpu, rss = cpu + stat[0], rss + stat[1]
                live.append(pid)
                self.seen.setdefault(pid, stat[2])
        if rss > self.memory_limit:
            rss = sum(_pss(p) for p in live)  # shared pages counted once
            self.memory_exceeded = self.memory_exceeded or rss > self.memory_limit
        self.cpu = max(self.cpu, cpu)
        self.peak = max(self.peak, rss)

    def finish(self, usage) -> None:
        """Fold in ``wait4``'s rusage of the whole (reaped) tree: exact CPU time, the largest process's RSS."""
        if usage is not None:
            self.cpu = max(self.cpu, usage.ru_utime + usage.ru_stime)
            self.peak = max(self.peak, usage.ru_maxrss << 10)

    # the RunCgroup interface the executor reads
    def cpu_seconds(self) -> float:
        return self.cpu

    def memory_peak(self) -> int:
        return self.peak

    def oom_killed(self) -> bool:
        return self.memory_exceeded

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL the tree and every process of the run seen before (leaves first), and wait up to ``timeout``
        until none is alive: a dying PID namespace can take a moment (freeing a tmpfs of many files), and
        processes whose parent died were reparented out of the tree. A reused pid (another start time) is
        left alone."""
        for pid in descendants(self.root):
            stat = _stat(pid)
            if stat is not None:
                self.seen.setdefault(pid, stat[2])
        deadline = time.monotonic() + timeout
        while True:
            alive = [pid for pid, start in self.seen.items() if (_stat(pid) or (0, 0, -1))[2] == start]
            if not alive or time.monotonic() > deadline:
                return
            for pid in reversed(alive):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.005)


def user_tasks(uid: int) -> int:
    """Tasks (threads) on the host whose real uid is ``uid``: what RLIMIT_NPROC counts for that user."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        try:
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (KeyError, ValueError, IndexError):
            continue
    return total
