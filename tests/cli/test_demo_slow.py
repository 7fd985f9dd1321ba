"""The default demo, as the README states it: `credo train` with no arguments learns (slow tier)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_default_demo_raises_greedy_accuracy_by_20_points(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "credo.cli.main", "-q", "train", "--run-dir", str(tmp_path / "demo")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["steps"] == 200
    assert summary["greedy_acc_gain_points"] >= 20, summary
    assert (tmp_path / "demo" / "report.html").is_file()
