"""tools/same_metrics.py (issue 34's behaviour-unchanged check): its comparison of metrics.jsonl rows (timing
fields aside; the first differing field named) and its guard that a checkout runs its own credo. No training."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "tools" / "same_metrics.py"
_spec = importlib.util.spec_from_file_location("same_metrics", _PATH)
sm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sm)  # tools/ is a folder of scripts, not a package

ROWS = [{"step": 0, "eval/greedy_acc": 0.25, "time": 1.0},
        {"step": 1, "loss": 0.5, "reward/mean": 0.125, "timing_s/gen": 0.3, "perf/tokens_per_s": 900.0},
        {"step": 2, "loss": 0.25, "reward/mean": 0.5, "timing_s/gen": 0.2}]


def _write(root: Path, case: str, rows: list[dict]) -> None:
    (root / case).mkdir(parents=True, exist_ok=True)
    (root / case / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_identical_rows_exit_0_and_timing_fields_are_ignored(tmp_path: Path, capsys):
    other = [dict(r) for r in ROWS]
    other[1]["timing_s/gen"], other[1]["perf/tokens_per_s"], other[0]["time"] = 9.0, 1.0, 7.0
    _write(tmp_path / "a", "demo", ROWS)
    _write(tmp_path / "b", "demo", other)
    assert sm.diff(tmp_path / "a", tmp_path / "b") == 0
    assert capsys.readouterr().out.split() == ["demo", "3", "rows", "identical"]


def test_a_changed_field_exits_1_and_is_named_with_both_values(tmp_path: Path, capsys):
    changed = [dict(r) for r in ROWS]
    changed[2]["reward/mean"] = 0.5000001
    _write(tmp_path / "a", "demo", ROWS)
    _write(tmp_path / "b", "demo", changed)
    _write(tmp_path / "a", "vepo", ROWS)
    _write(tmp_path / "b", "vepo", ROWS)
    assert sm.diff(tmp_path / "a", tmp_path / "b") == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["demo", "3", "rows"]
    assert out[0].endswith("row 2 (step 2): reward/mean: 0.5 vs 0.5000001")
    assert out[1].split() == ["vepo", "3", "rows", "identical"]


def test_a_field_on_one_side_only_a_missing_row_and_a_missing_case_each_fail(tmp_path: Path, capsys):
    extra = [dict(r) for r in ROWS]
    extra[1]["distill/reverse_kl"] = 0.1
    assert sm.compare(ROWS, extra) == "row 1 (step 1): distill/reverse_kl: '<missing>' vs 0.1"
    assert sm.compare(ROWS, ROWS[:2]) == "3 rows vs 2"
    assert sm.compare(ROWS, [dict(r) for r in ROWS]) is None
    _write(tmp_path / "a", "demo", ROWS)
    _write(tmp_path / "b", "demo", ROWS)
    _write(tmp_path / "a", "lora", ROWS)  # the new side lacks a case: not silently skipped
    assert sm.diff(tmp_path / "a", tmp_path / "b") == 1
    assert "lora" in capsys.readouterr().out.splitlines()[1]
    assert sm.diff(tmp_path / "a", tmp_path / "nothing") == 1


def test_unknown_case_names_are_refused_and_resume_cases_are_run_cases():
    with pytest.raises(SystemExit, match="unknown case.*demo_typo"):
        sm._select(sm.CASES, ["demo", "demo_typo"])
    assert sm._select(sm.RESUME, []) == list(sm.RESUME)
    assert set(sm.RESUME) <= set(sm.CASES)  # a resume case is one of the run cases, with more steps


def test_a_checkout_must_import_its_own_credo(tmp_path: Path):
    own = tmp_path / "own"
    (own / "credo").mkdir(parents=True)
    (own / "credo" / "__init__.py").write_text("")
    assert Path(sm.check_src(own)) == own / "credo" / "__init__.py"
    # a folder without credo would run the installed one: refused
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="credo is not imported from this checkout"):
        sm.check_src(tmp_path / "empty")
