"""credo/faults.py: CREDO_KILL_AT's parsing, and a point that SIGKILLs its process at the hit it names (the
points in the real code are exercised by tests/resume/test_matrix.py)."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from credo.faults import parse


def test_parse_reads_points_steps_and_hits():
    assert parse("") == {}
    assert parse("generate@3, update@2#2,latest@4") == {"generate": {3: 1}, "update": {2: 2}, "latest": {4: 1}}


@pytest.mark.parametrize("spec", ["generate", "nowhere@1", "update@x", "update@1#0", "update@1#y", "@2"])
def test_parse_refuses_what_is_not_a_point(spec):
    with pytest.raises(ValueError, match="CREDO_KILL_AT"):
        parse(spec)


def _run(spec: str) -> subprocess.CompletedProcess:
    code = ("from credo.faults import kill_point\n"
            "for step in range(3):\n"
            "    for _ in range(3):\n"
            "        kill_point('update', step); print(step, flush=True)\n")
    return subprocess.run([sys.executable, "-c", code], env={"CREDO_KILL_AT": spec, "PATH": ""}, capture_output=True,
                          text=True, timeout=60)


def test_a_point_kills_its_process_at_the_named_hit_and_is_inert_otherwise():
    died = _run("update@1#2")
    assert died.returncode == -signal.SIGKILL and died.stdout.split() == ["0", "0", "0", "1"]
    assert _run("generate@1").returncode == 0  # another point's target: every hit passes
    assert _run("update@7").stdout.split() == ["0"] * 3 + ["1"] * 3 + ["2"] * 3
