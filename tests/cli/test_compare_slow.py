"""`credo compare` on 3 presets x 2 seeds with the default demo settings (slow tier; ~20 minutes on 2 cores).

The measured table of this command is in docs/algorithms/README.md.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from credo.cli.main import main


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_compare_three_presets_two_seeds(tmp_path: Path):
    out = tmp_path / "cmp"
    assert main(["-q", "compare", "--presets", "grpo,gppo,aspo", "--seeds", "2", "--out", str(out),
                 "log.progress=false"]) == 0
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert [r["preset"] for r in rows] == ["grpo", "gppo", "aspo"]
    for r in rows:
        assert 0.0 <= r["greedy_acc"] <= 1.0 and r["seeds"] == 2
        assert r["greedy_acc"] > r["start_greedy_acc"], r  # every preset improves on the warm start
