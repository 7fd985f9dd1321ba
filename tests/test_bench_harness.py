"""benchmarks/harness.py: the ratio B / A, its bootstrap interval, the interleaving, the in-process and
out-of-process runners on injected timings (no wall-clock asserts); benchmarks/step_time.py --ab end to end."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import harness  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import step_time  # noqa: E402


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


# ---------------------------------------------------------------- benchmarks/step_time.py --ab

STEP_TIME = Path(__file__).resolve().parents[1] / "benchmarks" / "step_time.py"
TINY = ["warm_start.steps=1", "train.prompts_per_step=2", "rollout.group_size=2", "eval.size=1"]


def _fake_rounds() -> harness.Comparison:
    warm = {"timing_s/step": 9.0, "timing_s/gen": 8.0, "agent/prefill_tokens": 999.0}  # left out (warmup=1)
    rows_a = [warm, {"timing_s/step": 1.0, "timing_s/gen": 0.8, "agent/prefill_tokens": 300.0,
                     "agent/success_rate": 0.5, "agent/turns_mean": 3.0},
              {"timing_s/step": 3.0, "timing_s/gen": 2.0, "agent/prefill_tokens": 310.0,
               "agent/success_rate": 1.0, "agent/turns_mean": 4.0}]
    rows_b = [warm, {"timing_s/step": 0.5, "timing_s/gen": 0.4, "agent/prefill_tokens": 100.0,
                     "agent/success_rate": 0.5, "agent/turns_mean": 3.0},
              {"timing_s/step": 1.5, "timing_s/gen": 1.2, "agent/prefill_tokens": 120.0,
               "agent/success_rate": 0.5, "agent/turns_mean": 5.0}]
    return harness.compare("B / A step time", [1.0, 3.0], [0.5, 1.5], False, boot=10, labels=("off", "on"),
                           raw={"rounds_a": [{"rows": rows_a}], "rounds_b": [{"rows": rows_b}]})


def test_step_time_side_tables_and_proxy_leave_out_warmup():
    cmp = _fake_rounds()
    lines = step_time.side_tables(cmp, warmup=1)
    # gen: A median(0.8, 2.0) = 1.4, B median(0.4, 1.2) = 0.8, 0.8 / 1.4 = 0.571; step: A 2.0, B 1.0, ratio 0.50
    assert lines[1] == f"{'gen':<14}{1.4:>10.4f}{0.8:>10.4f}{'0.57':>8}"
    assert lines[2] == f"{'step':<14}{2.0:>10.4f}{1.0:>10.4f}{'0.50':>8}"
    # success: A median(0.5, 1.0) = 0.75, B 0.5; turns: A median(3, 4) = 3.5, B median(3, 5) = 4
    assert "agent/success_rate     median per step: A 0.75, B 0.5" in lines
    assert "agent/turns_mean       median per step: A 3.5, B 4" in lines
    proxy = step_time.proxy(cmp, warmup=1)  # prefill: A median(300, 310) = 305, B median(100, 120) = 110
    assert (proxy.unit, proxy.a, proxy.b) == ("agent/prefill_tokens (median per step)", 305.0, 110.0)


def _run_ab(tmp_path, *argv: str, timeout: float) -> tuple[str, dict]:
    out = tmp_path / "ab.json"
    proc = subprocess.run([sys.executable, str(STEP_TIME), "--steps", "2", "--warmup-steps", "1", "--rounds", "1",
                           "--json", str(out), *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(out.read_text())


def test_step_time_ab_runs_end_to_end(tmp_path):
    stdout, data = _run_ab(tmp_path, "--ab", "train.share_prompt=false", "--", *TINY, timeout=300)
    assert re.search(r"^B / A step time: \d+\.\d\d x \[\d+\.\d\d, \d+\.\d\d\]", stdout, re.M), stdout
    # share_prompt only changes the update's arithmetic: the same draws, so the same response tokens per step
    assert "perf/response_tokens (median per step)" in stdout and "(B / A 1.00x)" in stdout
    assert data["order"] == ["A", "B"] and len(data["raw"]["rounds_a"]) == len(data["raw"]["rounds_b"]) == 1
    assert len(data["a"]) == len(data["b"]) == 1  # 2 steps per process, the first left out
    assert data["labels"] == ["base config", "train.share_prompt=false"]
    assert re.search(r"^step +\d+\.\d{4} +\d+\.\d{4} +\d+\.\d\d$", stdout, re.M)


@pytest.mark.slow
def test_step_time_ab_agent_kv_reuse(tmp_path):
    stdout, data = _run_ab(tmp_path, "--config", "agent_maze", "--base", "rollout.collector.kv_reuse=false",
                           "--ab", "rollout.collector.kv_reuse=true", "--", *TINY, "rollout.collector.max_turns=3",
                           timeout=600)
    proxy = data["proxy"]
    assert proxy["unit"] == "agent/prefill_tokens (median per step)" and proxy["b"] < proxy["a"]
    # KV reuse is exact (tests/rollout/test_kv_reuse.py): the same episodes on both sides, so the same turns and success
    success = re.search(r"^agent/success_rate +median per step: A (\S+), B (\S+)$", stdout, re.M)
    turns = re.search(r"^agent/turns_mean +median per step: A (\S+), B (\S+)$", stdout, re.M)
    assert success and turns and success[1] == success[2] and turns[1] == turns[2], stdout
    assert re.search(r"^agent/kv_reused_frac +median per step: A 0, B 0\.\d+$", stdout, re.M), stdout
