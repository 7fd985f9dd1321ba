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
    data = json.loads((out / "compare.json").read_text())
    assert list(data["arms"]) == ["grpo", "gppo", "aspo"] and data["seeds"] == [0, 1]
    final = data["metrics"]["eval/greedy_acc@final"]["arms"]
    for arm in data["arms"]:
        start = [r["start/eval/greedy_acc"] for r in _summaries(out, arm)]
        assert all(0.0 <= v <= 1.0 for v in final[arm]["values"])
        assert all(v > s for v, s in zip(final[arm]["values"], start)), arm  # every preset improves on its warm start


def _summaries(out: Path, arm: str) -> list[dict]:
    return [json.loads((out / arm / f"seed{k}" / "summary.json").read_text()) for k in (0, 1)]
