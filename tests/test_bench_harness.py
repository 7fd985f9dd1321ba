"""benchmarks/harness.py: the ratio B / A, its bootstrap interval, the interleaving, the in-process and
out-of-process runners on injected timings (no wall-clock asserts)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import harness  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)


def test_quantile_interpolates_between_order_statistics():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4
    assert harness.quantile(xs, 0.5) == 2.5  # h = 0.5 * 3 = 1.5: 2 + 0.5 * (3 - 2)
    assert harness.quantile(xs, 0.25) == 1.75  # h = 0.75: 1 + 0.75 * (2 - 1)
    assert harness.quantile(xs, 0.0) == 1.0 and harness.quantile(xs, 1.0) == 4.0
    with pytest.raises(ValueError):
        harness.quantile([], 0.5)


def test_constant_series_give_a_zero_width_interval_at_the_exact_ratio():
    a, b = [2.0] * 7, [1.0] * 7
    for paired in (True, False):
        assert harness.median_ratio(a, b, paired) == 0.5  # 1 / 2
        assert harness.bootstrap_ci(a, b, paired, boot=200) == (0.5, 0.5)


def test_shifted_series():
    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    b = [x + 1.0 for x in a]  # 2 3 4 5 6
    # paired: per-pair ratios 2, 1.5, 4/3, 1.25, 1.2 -> median 4/3; independent: median(b) / median(a) = 4 / 3
    assert harness.median_ratio(a, b, True) == pytest.approx(4 / 3)
    assert harness.median_ratio(a, b, False) == pytest.approx(4 / 3)
    lo, hi = harness.bootstrap_ci(a, b, True, boot=500)
    assert 1.2 <= lo <= 4 / 3 <= hi <= 2.0  # a resampled median of the pair ratios lies between their min and max


def test_pairing_cancels_a_shared_drift_that_independent_resampling_keeps():
    a = [1.0, 2.0, 3.0, 4.0, 5.0]  # the machine slows down step after step, for both sides
    b = [2 * x for x in a]  # every pair ratio is exactly 2
    assert harness.bootstrap_ci(a, b, True, boot=500) == (2.0, 2.0)
    lo, hi = harness.bootstrap_ci(a, b, False, boot=500)
    assert lo < 2.0 < hi  # resampling each side alone mixes slow A steps with fast B ones


def test_bootstrap_is_deterministic_under_a_seed():
    a = [1.0 + 0.1 * (7 * i % 11) for i in range(15)]  # distinct values, so a new seed moves the interval
    b = [0.5 + 0.07 * (5 * i % 13) for i in range(15)]
    for paired in (True, False):
        first = harness.bootstrap_ci(a, b, paired, boot=300, seed=3)
        assert harness.bootstrap_ci(a, b, paired, boot=300, seed=3) == first
        assert harness.bootstrap_ci(a, b, paired, boot=300, seed=4) != first
        assert first[0] <= harness.median_ratio(a, b, paired) <= first[1]


def test_median_ratio_rejects_unequal_pairs():
    with pytest.raises(ValueError, match="differ in length"):
        harness.median_ratio([1.0, 2.0], [1.0], True)


def test_interleave_order():
    assert harness.interleave_order(3) == ["A", "B", "A", "B", "A", "B"]
    order = harness.interleave_order(20, "balanced", seed=1)
    pairs = [tuple(order[i:i + 2]) for i in range(0, 40, 2)]
    assert all(sorted(p) == ["A", "B"] for p in pairs)  # every pair runs each side once, back to back
    assert ("A", "B") in pairs and ("B", "A") in pairs  # both orders occur in 20 pairs
    assert harness.interleave_order(20, "balanced", seed=1) == order
    with pytest.raises(ValueError, match="unknown order"):
        harness.interleave_order(2, "random")


class FakeClock:
    """A clock that only the sides advance: A costs 1.0, B 0.5, and each side's first call 10 more (warm-up)."""

    def __init__(self):
        self.t, self.calls = 0.0, []

    def __call__(self) -> float:
        return self.t

    def side(self, s: str) -> None:
        self.t += (1.0 if s == "A" else 0.5) + (10.0 if s not in self.calls else 0.0)
        self.calls.append(s)


def test_inprocess_alternates_and_leaves_out_warmup():
    clock = FakeClock()
    cmp = harness.run_inprocess(lambda: clock.side("A"), lambda: clock.side("B"), repeats=4, warmup=1,
                                timer=clock, boot=100, name="fake")
    assert clock.calls == ["A", "B"] * 5 == cmp.order
    assert cmp.a == [1.0] * 4 and cmp.b == [0.5] * 4 and cmp.paired
    assert cmp.raw == {"warmup_a": [11.0], "warmup_b": [10.5]}
    assert (cmp.ratio, cmp.lo, cmp.hi) == (0.5, 0.5, 0.5)  # 0.5 / 1.0 on every pair
    assert cmp.line() == "fake: 0.50 x [0.50, 0.50]"
    assert cmp.meta["cpu_count"] >= 1 and "loadavg_before" in cmp.meta and "date" in cmp.meta


def test_inprocess_single_callable_takes_the_side_in_balanced_order():
    clock = FakeClock()
    cmp = harness.run_inprocess(clock.side, repeats=6, warmup=0, order="balanced", seed=2, timer=clock, boot=50)
    assert clock.calls == cmp.order == harness.interleave_order(6, "balanced", seed=2)
    assert sorted(cmp.a) == [1.0] * 5 + [11.0] and sorted(cmp.b) == [0.5] * 5 + [10.5]


def test_report_writes_series_and_metadata(tmp_path, capsys):
    cmp = harness.compare("credo / TRL step time", [2.0, 2.0], [1.0, 1.0], True, boot=10,
                          labels=("TRL", "credo"), proxy=harness.Proxy("tokens / step", 64, 64))
    path = harness.report(cmp, tmp_path / "r.json")
    out = capsys.readouterr().out
    assert "credo / TRL step time: 0.50 x [0.50, 0.50]   [tokens / step: A 64, B 64 (B / A 1.00x)]" in out
    assert "warning: 2 timed samples" in out  # fewer than 5 on a side
    data = json.loads(path.read_text())
    assert data["a"] == [2.0, 2.0] and data["median_b"] == 1.0 and data["convention"].startswith("ratio = credo / TRL")


def test_parse_times_finds_the_marked_json_line():
    out = "loading...\nTIMES {\"times\": [0.1, 0.2], \"reward\": [0.5]}\nTIMES not json\nbye\n"
    assert harness.parse_times(out, "TIMES ") == {"times": [0.1, 0.2], "reward": [0.5]}
    assert harness.parse_times("x\n[1, 2]\n") == {"times": [1, 2]}
    with pytest.raises(ValueError, match="no TIMES"):
        harness.parse_times("nothing here", "TIMES ")


def test_rounds_interleave_processes_on_injected_timings(tmp_path):
    log = tmp_path / "order.txt"

    def cmd(side: str, times: list[float]):  # each process logs its side, then prints fake step times
        def argv(i: int) -> list[str]:
            line = json.dumps({"times": times, "round": i})
            return [sys.executable, "-c", f"open({str(log)!r}, 'a').write({side!r}); print('noise'); "
                    f"print('T ' + {line!r})"]
        return argv

    cmp = harness.run_rounds(cmd("A", [9.0, 0.2, 0.2]), cmd("B", [9.0, 0.1, 0.1]), rounds=2, warmup=1,
                             warmup_rounds=1, marker="T ", timeout=30, boot=100, name="b over a")
    assert log.read_text() == "ABABAB" and cmp.order == list("ABABAB")
    assert cmp.a == [0.2] * 4 and cmp.b == [0.1] * 4 and not cmp.paired  # rounds 1-2, steps 1-2 of each
    assert (cmp.ratio, cmp.lo, cmp.hi) == (0.5, 0.5, 0.5)
    assert [r["round"] for r in cmp.raw["rounds_b"]] == [0, 1, 2]  # the command is a function of the round
    assert cmp.meta["mode"] == "rounds" and cmp.meta["warmup_rounds"] == 1


def test_rounds_report_a_failing_side():
    with pytest.raises(RuntimeError, match="B round 0 failed"):
        harness.run_rounds([sys.executable, "-c", "print([1.0])"], [sys.executable, "-c", "raise SystemExit(3)"],
                           rounds=1, timeout=30)
