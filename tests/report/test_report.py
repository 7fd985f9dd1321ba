"""write_report: plots + report.html from a run directory, robust to partial / short runs."""
from __future__ import annotations

import json
import math
import re

import pytest

from credo.report import write_report
from credo.report.page import merge_by_step, summarize
from credo.report.plots import ema, keys_with_prefix

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TRAINING_PNGS = {
    "reward_accuracy.png",
    "entropy.png",
    "clip_fractions.png",
    "response_length.png",
    "time_split.png",
    "kl_gradnorm.png",
    "loss_lr.png",
    "verifier_failures.png",
}


def _train_row(step: int) -> dict:
    """A plausible training row; `actor/kl` and `response_length/min` are never logged."""
    progress = step / 40
    return {
        "step": step,
        "reward/mean": 0.2 + 0.6 * progress + 0.05 * math.sin(step),
        "reward/std": 0.3,
        "acc/mean": 0.1 + 0.7 * progress,
        "actor/entropy": 1.5 - progress,
        "actor/pg_clipfrac": 0.02 + 0.01 * math.cos(step),
        "actor/pg_clipfrac_lower": 0.001,
        "actor/clipfrac_high": 0.01,
        "actor/clipfrac_low": 0.005,
        "actor/ppo_kl": 0.001 * step,
        "actor/grad_norm": 0.5 + 0.1 * math.sin(step),
        "actor/lr": 1e-6,
        "actor/pg_loss": -0.01 * math.sin(step),
        "response_length/mean": 200 + 3 * step,
        "response_length/max": 512,
        "response_length/clip_ratio": 0.01 * (step % 4),
        "timing_s/gen": 10.0 + step % 3,
        "timing_s/reward": 1.5,
        "timing_s/update": 4.0,
        "timing_s/step": 16.0,
        "perf/tokens_per_s": 1000.0 + step,
        "reward/verifier_failures": step % 5 == 0,
        "reward/verifier_timeouts": 0,
    }


def _write_jsonl(path, rows, tail: str = "") -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + tail)


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "countdown_grpo"
    run.mkdir()
    rows = [_train_row(step) for step in range(1, 41)]
    rows += [  # eval logged in a separate call at the same step
        {"step": s, "eval/greedy_acc": 0.1 + s / 80, "eval/avg@8": s / 90, "eval/pass@8": 0.3 + s / 100}
        for s in (1, 10, 20, 30, 40)
    ]
    rows[5]["reward/mean"] = None  # a NaN logged as null
    _write_jsonl(run / "metrics.jsonl", rows, tail='{"step": 41, "reward/me')  # killed mid-write
    warm_start = [{"step": s, "sft/loss": 2.0 / s, "sft/lr": 1e-5} for s in range(1, 21)]
    _write_jsonl(run / "warm_start.jsonl", warm_start)
    (run / "config.yaml").write_text("model: tiny\nalgo:\n  name: grpo  # <b>not html</b>\n")
    (run / "summary.json").write_text(json.dumps({"final_step": 40, "status": "completed", "best_acc": 0.61}))
    return run


def _assert_valid_png(path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), path
    assert len(data) > 10_000, f"{path} is suspiciously small ({len(data)} bytes)"


def test_full_report(run_dir):
    report = write_report(run_dir)
    assert report == run_dir / "report.html"
    page = report.read_text()

    pngs = {p.name for p in (run_dir / "plots").glob("*.png")}
    assert pngs == TRAINING_PNGS | {"warm_start.png"}
    for name in pngs:
        assert f'src="plots/{name}"' in page
        _assert_valid_png(run_dir / "plots" / name)
    assert set(re.findall(r'src="plots/([^"]+)"', page)) == pngs  # no reference to a missing image

    assert "countdown_grpo" in page
    assert "40 (step 1 to 40)" in page  # eval rows merged into their steps; truncated line skipped
    assert "0.1125 (step 1) → 0.6 (step 40), change +0.4875" in page
    assert "Final eval/avg@8" in page and "Final eval/pass@8" in page
    assert "Final reward/mean" in page
    assert "10m 40s" in page  # 40 steps x 16 s
    assert "Tokens / s (median)" in page
    assert "completed" in page and "best_acc" in page  # summary.json
    assert "name: grpo  # &lt;b&gt;not html&lt;/b&gt;" in page  # config verbatim, escaped
    assert not list(run_dir.glob("*.tmp"))


def test_one_row_run(tmp_path):
    row = {"step": 1, "reward/mean": 0.5, "timing_s/gen": 2.0, "eval/greedy_acc": 0.25}
    _write_jsonl(tmp_path / "metrics.jsonl", [row])
    page = write_report(tmp_path).read_text()
    pngs = {p.name for p in (tmp_path / "plots").glob("*.png")}
    assert pngs == {"reward_accuracy.png", "time_split.png"}
    for name in pngs:
        assert f'src="plots/{name}"' in page
        _assert_valid_png(tmp_path / "plots" / name)
    assert "1 (step 1 to 1)" in page
    assert "0.25 (step 1)" in page

    def strip_time(text: str) -> str:
        return re.sub(r"generated [0-9: -]+", "", text)

    assert strip_time(write_report(tmp_path).read_text()) == strip_time(page)  # rewriting is idempotent


def test_run_with_no_plottable_metrics(tmp_path):
    _write_jsonl(tmp_path / "metrics.jsonl", [{"step": 1, "something/else": 3.0}])
    page = write_report(tmp_path).read_text()
    assert "No plottable metrics" in page
    assert not list((tmp_path / "plots").glob("*.png"))


def test_empty_metrics_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    assert "Steps logged" in write_report(tmp_path).read_text()


def test_stale_plots_are_removed(run_dir):
    write_report(run_dir)
    rows = [{"step": s, "reward/mean": 0.1 * s} for s in range(1, 4)]
    _write_jsonl(run_dir / "metrics.jsonl", rows)
    (run_dir / "warm_start.jsonl").unlink()
    write_report(run_dir)
    assert {p.name for p in (run_dir / "plots").glob("*.png")} == {"reward_accuracy.png"}


def test_invalid_summary_json_is_reported_not_fatal(tmp_path):
    _write_jsonl(tmp_path / "metrics.jsonl", [{"step": 1, "reward/mean": 0.5}])
    (tmp_path / "summary.json").write_text("{oops")
    assert "could not be parsed" in write_report(tmp_path).read_text()


def test_missing_metrics_raises_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl does not exist"):
        write_report(tmp_path)


def test_helpers():
    rows = merge_by_step([{"step": 2, "a": 1}, {"step": 1, "a": 0}, {"step": 2, "b": 5}, {"no_step": 1}])
    assert rows == [{"step": 1, "a": 0}, {"step": 2, "a": 1, "b": 5}]
    assert keys_with_prefix([{"eval/avg@16": 1, "eval/avg@4": 1, "eval/pass@2": 1}], "eval/avg@") == [
        "eval/avg@4",
        "eval/avg@16",
    ]
    assert ema([1.0, 1.0, 1.0], 0.9).tolist() == pytest.approx([1.0, 1.0, 1.0])  # debiased: no warm-up bias
    assert summarize([]) == [("Steps logged", "0")]


def test_agent_run_gets_the_agent_plot(tmp_path):
    rows = [{"step": s, "reward/mean": s / 20, "agent/success_rate": s / 20, "agent/calc/success_rate": s / 25,
             "agent/maze/success_rate": s / 30, "agent/turns_mean": 3 - s / 20, "agent/tool_calls_mean": 1.0,
             "agent/invalid_actions_mean": 0.5, "agent/max_turns": 4 if s <= 10 else 6, "agent/env_failures": s % 3,
             "agent/cut_by_horizon": 0.1, "agent/cut_by_length": 0.0, "agent/tokens_per_turn": 14.0,
             "agent/branch/global": 32, "agent/branch/branches": s % 5, "agent/branch/fill": 2}
            for s in range(1, 21)]
    rows += [{"step": s, "eval/greedy_acc": s / 20, "eval/calc/greedy_success": s / 25,
              "eval/maze/greedy_success": s / 30} for s in (1, 10, 20)]
    _write_jsonl(tmp_path / "metrics.jsonl", rows)
    page = write_report(tmp_path).read_text()
    assert 'src="plots/agent.png"' in page and "Agent episodes" in page
    _assert_valid_png(tmp_path / "plots" / "agent.png")
    # a single-turn run has no agent plot
    _write_jsonl(tmp_path / "metrics.jsonl", [{"step": 1, "reward/mean": 0.5}])
    write_report(tmp_path)
    assert not (tmp_path / "plots" / "agent.png").exists()


def test_report_and_atomic_files_get_the_umask_permissions_not_mkstemps_0600(tmp_path):
    # regression: atomic writes went through mkstemp, whose 0600 left report.html / inspect pages unreadable to
    # anyone but the owner; a plain open() gives 0666 & ~umask (0644 under the usual umask 022)
    import os

    from credo.tracking.atomic import atomic_write_text, current_umask

    old = os.umask(0o022)
    try:
        assert current_umask() == 0o022
        atomic_write_text(tmp_path / "page.html", "<p>x</p>")
        assert (tmp_path / "page.html").stat().st_mode & 0o777 == 0o644
        assert (tmp_path / "page.html").read_text() == "<p>x</p>"
    finally:
        os.umask(old)
