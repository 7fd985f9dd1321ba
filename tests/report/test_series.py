"""credo.report.series: one number per run, hand-computed."""
import pytest

from credo.report.series import check_reduce, reduce_series

ROWS = [{"step": 0, "acc": 0.2}, {"step": 1, "h": 3.0, "n": 10.0}, {"step": 2, "h": 2.0, "n": 30.0, "acc": 0.5},
        {"step": 3, "h": 1.0, "n": 0.0}, {"step": 4, "h": 0.0, "acc": 0.7, "n": 10.0}]


@pytest.mark.parametrize("reduce,expected", [
    ("final", 0.0), ("first", 3.0), ("mean", 1.5),  # h over steps 1..4: (3 + 2 + 1 + 0) / 4
    ("min", 0.0), ("max", 3.0),
    ("last:0.5", 0.5),  # the last ceil(4 * .5) = 2 values: (1 + 0) / 2
    ("last:0.1", 0.0),  # ceil(.4) = 1 value
    ("slope", -1.0),  # h falls by exactly 1 per step
])
def test_plain_reductions(reduce, expected):
    assert reduce_series(ROWS, "h", reduce) == pytest.approx(expected)


def test_steps_to_counts_a_run_that_never_reaches_as_censored():
    assert reduce_series(ROWS, "acc", "steps_to:0.5") == 2.0  # first step with acc >= .5
    assert reduce_series(ROWS, "acc", "steps_to:0.1") == 0.0
    assert reduce_series(ROWS, "acc", "steps_to:0.9") == 5.0  # never: the last step (4) + 1


def test_ratio_sums_over_rows_that_log_both():
    # h / n over steps 1..4: (3 + 2 + 1 + 0) / (10 + 30 + 0 + 10) = 6 / 50
    assert reduce_series(ROWS, "h", "ratio:n") == pytest.approx(0.12)


def test_errors_name_the_key_or_the_reduction():
    with pytest.raises(ValueError, match="never logged 'nope'"):
        reduce_series(ROWS, "nope", "final")
    for bad in ("median", "last:0", "last:2", "steps_to:x", "last:"):
        with pytest.raises(ValueError, match="unknown reduction"):
            check_reduce(bad)
