"""benchmarks/evidence_branching.py: the per-seed values it derives from the branching compare runs, by hand, on
hand-made metrics.jsonl and compare.json files (no training: the runs are credo compare's job)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import evidence_branching as eb  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)


def _write_runs(root: Path, arm: str, rows_by_seed: dict[int, list[dict]]) -> None:
    spec = root / eb.SPEC
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "compare.json").write_text(json.dumps({"seeds": sorted(rows_by_seed)}))
    for seed, rows in rows_by_seed.items():
        d = spec / arm / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(step, hb, hu, dhb, dhu, ab, au, cons=None, decisions=4, branches=2):
    row = {"step": step, "agent/branch/entropy_branched": hb, "agent/branch/entropy_unbranched": hu,
           "agent/branch/dH_branched": dhb, "agent/branch/dH_unbranched": dhu,
           "agent/branch/above_median_branched": ab, "agent/branch/above_median_unbranched": au,
           "agent/branch/decisions": decisions, "agent/branch/branches": branches}
    if cons is not None:
        row["agent/branch/consecutive_share"] = cons
    return row


def test_branched_against_unbranched_and_aepo_against_arpo(tmp_path):
    arpo = {0: [_row(1, 0.3, 0.2, 0.1, 0.0, 0.6, 0.4, cons=0.2), _row(2, 0.5, 0.2, 0.3, -0.1, 1.0, 0.2, cons=0.4),
                {"step": 2, "eval/greedy_acc": 0.5}],  # an eval row: no branch keys, skipped
            1: [_row(1, 0.2, 0.3, 0.0, 0.1, 0.5, 0.5, cons=0.1),
                {"step": 2, "agent/branch/entropy_unbranched": 0.1, "agent/branch/decisions": 1}]}  # no branch
    aepo = {0: [_row(1, 0.3, 0.2, 0.1, 0.0, 0.6, 0.4, cons=0.0), _row(2, 0.3, 0.2, 0.1, 0.0, 0.6, 0.4)],
            1: [_row(1, 0.2, 0.3, 0.0, 0.1, 0.5, 0.5, cons=0.05)]}
    _write_runs(tmp_path, "arpo", arpo)
    _write_runs(tmp_path, "aepo", aepo)
    out = tmp_path / "out"
    for method in ("arpo", "aepo"):
        eb.entropy_file(tmp_path, out, method)
    eb.consecutive_file(tmp_path, out)
    data = json.loads((out / "arpo_branch_entropy.json").read_text())
    ent = data["metrics"]["entropy@mean"]
    assert ent["arms"]["branched"]["values"] == pytest.approx([0.4, 0.2])  # seed 1's second step had no branch
    assert ent["arms"]["unbranched"]["values"] == pytest.approx([0.2, 0.2])  # (0.3 + 0.1) / 2
    assert ent["vs_baseline"]["branched"]["diffs"] == pytest.approx([0.2, 0.0])
    assert data["metrics"]["dH@mean"]["arms"]["branched"]["values"] == pytest.approx([0.2, 0.0])
    assert data["metrics"]["above_median@mean"]["arms"]["unbranched"]["values"] == pytest.approx([0.3, 0.5])
    assert data["decisions"] == {"0": 8, "1": 5} and data["branches"] == {"0": 4, "1": 2}
    cons = json.loads((out / "aepo_consecutive.json").read_text())["metrics"]["consecutive_share@mean"]
    assert cons["arms"]["arpo"]["values"] == pytest.approx([0.3, 0.1])
    assert cons["arms"]["aepo"]["values"] == pytest.approx([0.0, 0.05])
    assert cons["vs_baseline"]["aepo"]["diffs"] == pytest.approx([-0.3, -0.05])
