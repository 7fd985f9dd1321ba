"""credo.report.stats: hand-computed bootstrap intervals, paired differences and sign-flip p-values."""
import json

import pytest

from credo.report.stats import (arm_summary, bootstrap_ci, metric_block, paired_difference, resample_means,
                                sign_flip_p, verdict, write_compare_json)


def test_two_values_exact_bootstrap():
    # resample means of (0, 1): (0,0)->0, (0,1)->.5, (1,0)->.5, (1,1)->1; sorted [0, .5, .5, 1] (positions 0..3)
    # q(.025) at position .025*3 = .075: 0 + .075*(.5-0) = .0375; q(.975) at 2.925: .5 + .925*(1-.5) = .9625
    assert sorted(resample_means([0.0, 1.0])) == [0.0, 0.5, 0.5, 1.0]
    lo, hi = bootstrap_ci([0.0, 1.0])
    assert lo == pytest.approx(0.0375) and hi == pytest.approx(0.9625)


def test_three_values_exact_bootstrap():
    # (0, 0, 3): a resample's mean is k, the number of draws of the 3 (Binomial(3, 1/3)): 27 resamples with
    # k=0 x8, k=1 x12, k=2 x6, k=3 x1. Sorted positions 0..26: q(.025) at .65 -> 0; q(.975) at 25.35: position 25
    # holds 2 (positions 20..25), position 26 holds 3 -> 2 + .35*(3-2) = 2.35
    assert len(resample_means([0.0, 0.0, 3.0])) == 27
    lo, hi = bootstrap_ci([0.0, 0.0, 3.0])
    assert lo == pytest.approx(0.0) and hi == pytest.approx(2.35)
    # a narrower level moves both ends inward: q(.25) at 6.5 -> 0, q(.75) at 19.5 -> between 1 (19) and 2 (20): 1.5
    assert bootstrap_ci([0.0, 0.0, 3.0], level=0.5) == pytest.approx((0.0, 1.5))


def test_constant_values_give_a_point_interval():
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert bootstrap_ci([4.0]) == (4.0, 4.0)


def test_many_seeds_use_seeded_draws():
    vals = [float(i) for i in range(10)]  # 10^10 resamples: drawn, not enumerated
    assert len(resample_means(vals, resamples=500)) == 500
    assert bootstrap_ci(vals, seed=3) == bootstrap_ci(vals, seed=3)
    lo, hi = bootstrap_ci(vals)
    assert lo < 4.5 < hi and hi - lo < 9


def test_sign_flip_p_hand_computed():
    # diffs (1, 2, 3), mean 2. The 8 sign patterns' |means|: +++ 2, --- 2, ++- 0, +-+ 2/3, -++ 4/3, +-- 4/3, -+- 2/3,
    # --+ 0: two of eight reach 2 -> p = .25
    assert sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(0.25)
    # five seeds all positive: only +++++ and ----- reach the observed mean -> 2 / 32; the smallest p at n = 5
    assert sign_flip_p([1.0, 1.0, 2.0, 1.5, 3.0]) == pytest.approx(2 / 32)
    assert sign_flip_p([0.0, 0.0]) == 1.0


def test_paired_difference_hand_computed():
    # diffs (3-1, 5-2) = (2, 3): mean 2.5; resample means [2, 2.5, 2.5, 3] -> (2.0375, 2.9625) excludes 0
    out = paired_difference([3.0, 5.0], [1.0, 2.0], min_n=2)
    assert out["diffs"] == [2.0, 3.0] and out["mean"] == 2.5
    assert out["ci95"] == pytest.approx([2.0375, 2.9625])
    assert out["verdict"] == "higher" and out["wins"] == 2 and out["ties"] == 0 and out["n"] == 2
    assert out["p_sign_flip"] == pytest.approx(0.5)  # ++ and -- reach |2.5| of 4 patterns
    down = paired_difference([0.0, 0.0], [1.0, 3.0], min_n=2)  # diffs (-1, -3): means [-3, -2, -2, -1] -> (-2.925, -1.075), below 0
    assert down["verdict"] == "lower" and down["wins"] == 0
    # diffs (1, -1): sorted means [-1, 0, 0, 1]; q(.025) = -1 + .075*1 = -.925, q(.975) = 0 + .925*1 = .925
    mixed = paired_difference([1.0, 0.0], [0.0, 1.0], min_n=2)
    assert mixed["verdict"] == "no difference" and mixed["ci95"] == pytest.approx([-0.925, 0.925])


def test_no_verdict_below_five_seeds():
    # four seeds, all above the baseline by 1: the interval (1, 1) excludes 0, but 4 < MIN_SEEDS
    assert paired_difference([2.0] * 4, [1.0] * 4)["verdict"] == "too few seeds"
    assert paired_difference([2.0] * 5, [1.0] * 5)["verdict"] == "higher"


def test_verdict_needs_the_interval_to_exclude_zero():
    assert verdict((0.1, 0.2)) == "higher" and verdict((-0.2, -0.1)) == "lower"
    assert verdict((0.0, 0.2)) == "no difference" and verdict((-0.1, 0.1)) == "no difference"


def test_paired_difference_refuses_unpaired_or_non_finite_values():
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="non-finite"):
        arm_summary([1.0, float("nan")])


def test_metric_block_and_json_shape(tmp_path):
    block = metric_block({"base": [0.0, 1.0], "new": [1.0, 2.0]}, "base", min_n=2)
    assert block["arms"]["base"]["ci95"] == pytest.approx([0.0375, 0.9625])
    assert set(block["vs_baseline"]) == {"new"} and block["vs_baseline"]["new"]["diffs"] == [1.0, 1.0]
    assert block["vs_baseline"]["new"]["verdict"] == "higher"  # constant diff 1: interval (1, 1)
    with pytest.raises(ValueError, match="baseline"):
        metric_block({"a": [1.0]}, "b")
    path = write_compare_json(tmp_path / "d" / "x.json", name="x", command="python b.py", baseline="base",
                              seeds=[0, 1], metrics={"acc@final": block}, extra={"note": "n"})
    data = json.loads(path.read_text())
    assert data["format"] == "credo.compare/1" and data["metrics"]["acc@final"] == block and data["note"] == "n"
