"""Shared sandbox fixture: one pool per test session; skipped only where isolation cannot exist here."""
from __future__ import annotations

import os
import shutil

import pytest

from credo.sandbox import Sandbox, SandboxUnavailable


def make_sandbox(workers: int = 2) -> Sandbox:
    try:
        return Sandbox(workers=workers)
    except SandboxUnavailable as exc:
        if os.geteuid() == 0 and shutil.which("bwrap"):
            raise  # root with bubblewrap installed: isolation must work, so this is a real failure
        pytest.skip(f"sandbox isolation unavailable on this machine: {exc}")
