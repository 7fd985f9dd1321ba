"""MetricsLogger: JSONL rows, value conversion, crash tolerance, resume truncation, TensorBoard."""
from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest
import torch

from credo.tracking import metrics as metrics_mod
from credo.tracking.metrics import MetricsLogger, read_metrics


def _lines(path):
    return path.read_text().splitlines()


def _tb_scalars(log_dir):
    """{tag: [(step, value), ...]} as TensorBoard would show it (purged events removed)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _next_second() -> None:
    """Wait for the next wall-clock second. TensorBoard reads event files in name order,
    "...tfevents.<second>.<host>.<pid>.<writer counter>": within one second of one process the counter decides, as a
    string ("10" < "9" late in a long test session). A resumed run is a later process; here, a later second."""
    import time

    start = int(time.time())
    while int(time.time()) == start:
        time.sleep(0.05)


def test_log_writes_one_json_line_per_call(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"reward/mean": 0.5, "timing_s/gen": 2})
        logger.log(2, {"reward/mean": 0.75})
    lines = _lines(tmp_path / "metrics.jsonl")
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "reward/mean": 0.5, "timing_s/gen": 2},
        {"step": 2, "reward/mean": 0.75},
    ]
    assert list(json.loads(lines[0])) == ["step", "reward/mean", "timing_s/gen"]  # step first


def test_values_are_converted_and_nonfinite_written_as_null(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(
            np.int64(3),
            {
                "a": np.float32(0.25),
                "b": torch.tensor(1.5),
                "c": np.int64(7),
                "d": True,
                "nan": float("nan"),
                "inf": torch.tensor(float("inf")),
            },
        )
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert row == {"step": 3, "a": 0.25, "b": 1.5, "c": 7, "d": 1, "nan": None, "inf": None}
    assert isinstance(row["c"], int)


def test_rejects_bad_input(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    with pytest.raises(ValueError, match="step"):
        logger.log(1, {"step": 3})
    with pytest.raises(TypeError, match="'x'"):
        logger.log(1, {"x": "high"})
    with pytest.raises(TypeError, match="'v'"):
        logger.log(1, {"v": torch.ones(3)})
    with pytest.raises(ValueError, match="jsonl"):
        logger.log(1, {"x": 1.0}, file="../escape.jsonl")
    logger.close()
    logger.close()  # idempotent
    with pytest.raises(RuntimeError, match="close"):
        logger.log(1, {"x": 1.0})


def test_other_files_go_through_the_same_method(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"sft/loss": 2.0}, file="warm_start.jsonl")
        logger.log(1, {"reward/mean": 0.1})
    assert read_metrics(tmp_path / "warm_start.jsonl") == [{"step": 1, "sft/loss": 2.0}]
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "reward/mean": 0.1}]


def test_read_metrics_skips_truncated_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n\n{"step": 2, "x": 2.0}\n{"step": 3, "x": 3.')
    assert read_metrics(path) == [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}]
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2')
    assert read_metrics(path) == [{"step": 1, "x": 1.0}]
    path.write_text("")
    assert read_metrics(path) == []


def test_read_metrics_raises_on_corruption_before_the_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(path)
    with pytest.raises(FileNotFoundError):
        read_metrics(tmp_path / "missing.jsonl")


def test_appending_after_a_crash_drops_the_partial_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2')  # killed mid-write
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(2, {"x": 2.5})
    assert read_metrics(path) == [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.5}]
    assert path.read_text().endswith("\n")


def test_appending_completes_a_valid_last_line_without_newline(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}')
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(2, {"x": 2.0})
    assert read_metrics(path) == [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}]


def test_resume_truncates_step_indexed_jsonl_files(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(1, 6):
            logger.log(step, {"x": float(step)})
            logger.log(step, {"n": step}, file="rollouts.jsonl")
    notes = tmp_path / "notes.jsonl"  # no "step" field: must be left alone
    notes.write_text('{"note": "a"}\n{"note": "b"}\n')
    (tmp_path / "metrics.jsonl").write_text((tmp_path / "metrics.jsonl").read_text() + '{"step": 6, "x"')

    with MetricsLogger(tmp_path, tensorboard=False, resume_step=3) as logger:
        assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
        assert [r["step"] for r in read_metrics(tmp_path / "rollouts.jsonl")] == [1, 2, 3]
        logger.log(4, {"x": 40.0})
        logger.log(5, {"x": 50.0})

    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]
    assert notes.read_text() == '{"note": "a"}\n{"note": "b"}\n'
    assert not list(tmp_path.glob("*.tmp"))  # atomic rewrite left no temp files


def test_resume_keeps_warm_start_log_whole(tmp_path):
    """Warm-start SFT ran before RL step 1 and is not repeated: its steps 4..10 are not "after" step 3."""
    with MetricsLogger(tmp_path) as logger:
        for step in range(1, 11):
            logger.log(step, {"sft/loss": 1.0 / step}, file="warm_start.jsonl")
        for step in range(1, 6):
            logger.log(step, {"x": float(step)})
    _next_second()
    with MetricsLogger(tmp_path, resume_step=3) as logger:
        logger.log(4, {"x": 40.0})
    assert [r["step"] for r in read_metrics(tmp_path / "warm_start.jsonl")] == list(range(1, 11))
    tb_warm_start = _tb_scalars(tmp_path / "tb" / "warm_start")["warm_start/sft/loss"]
    assert [step for step, _ in tb_warm_start] == list(range(1, 11))
    assert _tb_scalars(tmp_path / "tb")["x"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]

    with MetricsLogger(tmp_path, tensorboard=False, resume_step=2, keep_on_resume=()):
        pass
    assert [r["step"] for r in read_metrics(tmp_path / "warm_start.jsonl")] == [1, 2]


def test_resume_without_existing_files_starts_fresh(tmp_path):
    with MetricsLogger(tmp_path / "new", tensorboard=False, resume_step=10) as logger:
        logger.log(11, {"x": 1.0})
    assert read_metrics(tmp_path / "new" / "metrics.jsonl") == [{"step": 11, "x": 1.0}]


def test_tensorboard_event_file_and_tags(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        assert logger.tensorboard_enabled
        logger.log(1, {"reward/mean": 0.5, "timing_s/gen": 1.0})
        logger.log(2, {"reward/mean": 0.75})
        logger.log(1, {"sft/loss": 3.0}, file="warm_start.jsonl")
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    scalars = _tb_scalars(tmp_path / "tb")
    assert scalars["reward/mean"] == [(1, 0.5), (2, 0.75)]
    assert scalars["timing_s/gen"] == [(1, 1.0)]
    assert _tb_scalars(tmp_path / "tb" / "warm_start") == {"warm_start/sft/loss": [(1, 3.0)]}


def test_tensorboard_purges_steps_after_resume_step(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        for step in range(1, 6):
            logger.log(step, {"x": float(step)})
    _next_second()
    with MetricsLogger(tmp_path, resume_step=3) as logger:
        logger.log(4, {"x": 40.0})
    assert _tb_scalars(tmp_path / "tb")["x"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_tensorboard_off_writes_jsonl_only(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        assert not logger.tensorboard_enabled
        logger.log(1, {"x": 1.0})
    assert not (tmp_path / "tb").exists()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "x": 1.0}]


def test_missing_tensorboard_warns_once_and_continues(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # makes the import fail
    monkeypatch.setattr(metrics_mod, "_tb_import_warned", False)
    with pytest.warns(RuntimeWarning, match="TensorBoard"):
        first = MetricsLogger(tmp_path / "a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = MetricsLogger(tmp_path / "b")  # no second warning
    for logger in (first, second):
        assert not logger.tensorboard_enabled
        logger.log(1, {"x": 1.0})
        logger.close()
    assert read_metrics(tmp_path / "a" / "metrics.jsonl") == [{"step": 1, "x": 1.0}]
