"""Per-run control groups: memory and process limits, CPU time, peak memory, OOM kills, kill-all.

RLIMIT_NPROC counts per uid (and zombies) and RLIMIT_AS breaks runtimes that reserve address space
(JVM, node, Go), so memory and process limits are enforced by a cgroup per run. Both cgroup v2
(unified) and v1 (separate ``memory``, ``pids``, ``cpuacct``, ``freezer`` hierarchies) are
supported; the per-run groups are created below the current process's own cgroup.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpuacct", "freezer")


class CgroupError(RuntimeError):
    pass


def _own_paths() -> dict[str, str]:
    """controller name (or '' for v2) -> this process's cgroup path."""
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            out[c] = path
    return out


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_int(path: Path, default: int = 0) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def _keyed(path: Path) -> dict[str, int]:
    out = {}
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            out[k] = int(v) if v.strip().lstrip("-").isdigit() else 0
    except OSError:
        pass
    return out


class CgroupManager:
    """Creates per-run groups under a base group (``credo-sandbox``) of the right cgroup version."""

    def __init__(self, name: str = "credo-sandbox"):
        self.version = 2 if (ROOT / "cgroup.controllers").is_file() else 1
        own = _own_paths()
        if self.version == 1:
            missing = [c for c in ("memory", "pids", "cpuacct") if not (ROOT / c).is_dir()]
            if missing:
                raise CgroupError(f"cgroup v1 controllers not mounted: {', '.join(missing)}")
            self.bases = {}
            for c in V1_CONTROLLERS:
                if (ROOT / c).is_dir():
                    base = ROOT / c / own.get(c, "/").lstrip("/") / name
                    base.mkdir(parents=True, exist_ok=True)
                    self.bases[c] = base
        else:
            self.bases = {"": self._v2_base(ROOT / own.get("", "/").lstrip("/"), name)}
        self.sweep()

    def sweep(self) -> None:
        """Remove run groups left by dead processes (a worker killed mid-run cannot remove its own)."""
        for base in self.bases.values():
            for d in base.glob("run-*"):
                owner = d.name.split("-")[1]
                if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                    stale = RunCgroup.__new__(RunCgroup)
                    stale.version, stale.dirs = self.version, {c: b / d.name for c, b in self.bases.items()}
                    stale.remove()

    @staticmethod
    def _v2_base(own: Path, name: str) -> Path:
        """A v2 group with memory and pids enabled for its children (moving this process into a leaf if
        the 'no internal processes' rule requires it)."""
        base = own / name
        base.mkdir(exist_ok=True)
        wanted = {"memory", "pids"}
        for parent in (own, base):
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
            if wanted - enabled:
                try:
                    _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
                except OSError:
                    leaf = own / f"{name}-supervisor"
                    leaf.mkdir(exist_ok=True)
                    _write(leaf / "cgroup.procs", str(os.getpid()))
                    _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        return base

    def create(self, *, memory_bytes: int, pids: int) -> "RunCgroup":
        return RunCgroup(self, f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}", memory_bytes, pids)


class RunCgroup:
    def __init__(self, manager: CgroupManager, name: str, memory_bytes: int, pids: int):
        self.version = manager.version
        self.dirs = {c: base / name for c, base in manager.bases.items()}
        for d in self.dirs.values():
            d.mkdir()
        self.memory_limit = memory_bytes
        if self.version == 1:
            mem = self.dirs["memory"]
            _write(mem / "memory.limit_in_bytes", str(memory_bytes))
            if (mem / "memory.memsw.limit_in_bytes").exists():
                _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
            _write(self.dirs["pids"] / "pids.max", str(pids))
        else:
            d = self.dirs[""]
            _write(d / "memory.max", str(memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(pids))

    # -- called in the child between fork and exec (as root) ---------------------------------------
    def enter(self) -> None:
        pid = str(os.getpid())
        for d in self.dirs.values():
            _write(d / "cgroup.procs", pid)

    def add(self, pid: int) -> None:
        """Move the process ``pid`` (a warm run's first process, :mod:`credo.sandbox.zygote`) into this group."""
        for d in self.dirs.values():
            _write(d / "cgroup.procs", str(pid))

    # -- measurements --------------------------------------------------------------------------------
    def cpu_seconds(self) -> float:
        if self.version == 1:
            return _read_int(self.dirs["cpuacct"] / "cpuacct.usage") / 1e9
        return _keyed(self.dirs[""] / "cpu.stat").get("usage_usec", 0) / 1e6

    def memory_peak(self) -> int:
        if self.version == 1:
            return _read_int(self.dirs["memory"] / "memory.max_usage_in_bytes")
        d = self.dirs[""]
        return _read_int(d / "memory.peak", _read_int(d / "memory.current"))

    def oom_killed(self) -> bool:
        if self.version == 1:
            mem = self.dirs["memory"]
            return _keyed(mem / "memory.oom_control").get("oom_kill", 0) > 0
        return _keyed(self.dirs[""] / "memory.events").get("oom_kill", 0) > 0

    def pids(self) -> list[int]:
        d = self.dirs["pids"] if self.version == 1 else self.dirs[""]
        try:
            return [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    # -- teardown -------------------------------------------------------------------------------------
    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL every process of the run (frozen first so none can fork meanwhile)."""
        deadline = time.monotonic() + timeout
        if self.version == 2 and (self.dirs[""] / "cgroup.kill").exists():
            _write(self.dirs[""] / "cgroup.kill", "1")
        while self.pids() and time.monotonic() < deadline:
            self._freeze(True)
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._freeze(False)
            time.sleep(0.005)

    def _freeze(self, frozen: bool) -> None:
        try:
            if self.version == 1 and "freezer" in self.dirs:
                _write(self.dirs["freezer"] / "freezer.state", "FROZEN" if frozen else "THAWED")
            elif self.version == 2:
                _write(self.dirs[""] / "cgroup.freeze", "1" if frozen else "0")
        except OSError:
            pass

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # processes still exiting
                    time.sleep(0.01)
