"""benchmarks/vs_trl_tta.py: the first crossing of a threshold, censoring, the paired ratio over seeds and its exact
bootstrap interval, the shared prompt order and the evaluation clock, on hand-computed values (no training)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import vs_trl_tta as tta  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

P = tta.Point


def test_first_crossing_is_the_first_evaluation_at_or_above_the_threshold_in_step_order():
    points = [P(4, 40.0, 0.9), P(0, 0.0, 0.5), P(2, 20.0, 0.8), P(3, 30.0, 0.6)]  # unsorted on purpose
    assert tta.first_crossing(points, 0.8) == P(2, 20.0, 0.8)  # >=, not >; step 2 before step 4
    assert tta.first_crossing(points, 0.85) == P(4, 40.0, 0.9)  # the dip at step 3 does not count
    assert tta.first_crossing(points, 0.95) is None


def test_seed_outcome_reached_and_censored():
    points = [P(0, 0.0, 0.5), P(1, 11.0, 0.7), P(2, 23.0, 0.9), P(3, 36.0, 0.8)]
    assert tta.seed_outcome(points, 0.85) == {"reached": True, "time_s": 23.0, "step": 2, "acc": 0.9,
                                              "final_step": 3, "final_acc": 0.8}
    # never reached: the time is the whole run's (a lower bound), at its last evaluation
    assert tta.seed_outcome(points, 0.95) == {"reached": False, "time_s": 36.0, "step": 3, "acc": 0.8,
                                              "final_step": 3, "final_acc": 0.8}
    with pytest.raises(ValueError):
        tta.seed_outcome([], 0.5)


def test_exact_bootstrap_enumerates_every_resample():
    # n = 2: resamples (1,1) (1,3) (3,1) (3,3) -> medians 1, 2, 2, 3; quantile 0.025: h = 0.075 -> 1.075,
    # quantile 0.975: h = 2.925 -> 2 + 0.925 = 2.925
    lo, hi = tta.exact_bootstrap_ci([1.0, 3.0])
    assert lo == pytest.approx(1.075) and hi == pytest.approx(2.925)
    # n = 3 of {1, 2, 3}: 27 resamples, median 1 in 7 (two or three 1s), 3 in 7, 2 in 13 -> [1, 3]
    assert tta.exact_bootstrap_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert tta.exact_bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    with pytest.raises(ValueError):
        tta.exact_bootstrap_ci([])


def test_exact_bootstrap_falls_back_to_the_seeded_one_beyond_six_seeds():
    ratios = [0.3, 0.4, 0.5, 0.45, 0.35, 0.6, 0.55]
    first = tta.exact_bootstrap_ci(ratios)
    assert first == tta.exact_bootstrap_ci(ratios)  # deterministic under its seed
    assert 0.3 <= first[0] <= 0.45 <= first[1] <= 0.6  # around the median 0.45, inside the range


def _o(time_s, reached=True):
    return {"reached": reached, "time_s": time_s}


def test_paired_ratio_is_the_median_of_per_seed_ratios():
    out = tta.paired_ratio([_o(10.0), _o(20.0), _o(30.0)], [_o(5.0), _o(10.0), _o(30.0)])
    assert out["ratios"] == [0.5, 0.5, 1.0] and out["ratio"] == 0.5 and out["n"] == 3
    # 27 resamples of the indices: median 1.0 iff index 2 drawn at least twice (7 of 27), else 0.5
    assert (out["lo"], out["hi"]) == (0.5, 1.0)
    assert out["censored"] == []


def test_paired_ratio_reports_censored_seeds_with_their_bound():
    trl = [_o(10.0), _o(20.0), _o(40.0, reached=False), _o(50.0, reached=False)]
    credo = [_o(4.0), _o(30.0, reached=False), _o(8.0), _o(60.0, reached=False)]
    out = tta.paired_ratio(trl, credo)
    assert out["ratios"] == [0.4] and out["ratio"] == 0.4 and out["n"] == 1
    assert out["censored"] == [
        {"seed_index": 1, "censored": "credo", "ratio_bound": 1.5, "relation": ">"},  # credo > 30 s, TRL 20 s
        {"seed_index": 2, "censored": "TRL", "ratio_bound": 0.2, "relation": "<"},  # credo 8 s, TRL > 40 s
        {"seed_index": 3, "censored": "both", "ratio_bound": None, "relation": None}]
    assert tta.ratio_line(0.8, out) == "credo / TRL time to 80% held-out accuracy: 0.40 x [0.40, 0.40]"
    none = tta.paired_ratio([_o(1.0, False)], [_o(1.0)])
    assert "ratio" not in none and tta.ratio_line(0.8, none).endswith("no seed where both reached it")
    with pytest.raises(ValueError, match="differ in number"):
        tta.paired_ratio([_o(1.0)], [])


def test_train_order_is_credos_sampler_order_across_epochs():
    from credo.data.sampler import PromptSampler
    from credo.types import Example

    train = [Example(f"{i}+0=", str(i), f"u{i}") for i in range(5)]
    order = tta.train_order(train, seed=3, prompts=2, steps=4)  # 8 prompts: one epoch of 5 and 3 of the next
    sampler = PromptSampler(train, seed=3)
    assert order == [ex for _ in range(4) for ex in sampler.next_batch(2)]
    assert sorted(ex.uid for ex in order[:5]) == [f"u{i}" for i in range(5)]  # an epoch visits each once
    assert order != tta.train_order(train, seed=4, prompts=2, steps=4)  # the seed changes the order


class FakeEvaluator:
    """Accuracies in turn; each call advances the fake clock by 100 s (an evaluation that must not count)."""

    def __init__(self, clock: list[float], accs: list[float]):
        self.clock, self.accs = clock, list(accs)

    def __call__(self, model):
        self.clock[0] += 100.0
        return self.accs.pop(0), ["r"]


def test_recorder_leaves_evaluations_out_of_the_clock_and_stops_at_the_threshold(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(tta.time, "perf_counter", lambda: clock[0])
    rec = tta.Recorder(FakeEvaluator(clock, [0.5, 0.6, 0.8, 0.9]), every=2, threshold=0.8)
    assert rec.evaluate(None, 0) is False  # step 0: before the clock, time 0, never a stop
    rec.clock.start()
    for step in (1, 2, 3, 4):
        clock[0] += 10.0  # a 10 s step
        stop = rec.evaluate(None, step)
        assert stop is (step == 4)  # evaluated at steps 2 and 4 only; 0.6 at step 2, 0.8 at step 4
    assert rec.points == [P(0, 0.0, 0.5), P(2, 20.0, 0.6), P(4, 40.0, 0.8)]  # the 100 s evaluations left out
