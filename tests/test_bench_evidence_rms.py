"""benchmarks/evidence_rms.py and benchmarks/vepo_image_vis.py's seed comparison: the best-of-N pick, the
label-noise metric blocks (values, drops, paired differences by hand) and a selection's summary by hand; the
compare-JSON files they write from a hand-made per-seed record (no training: the runs are the scripts' job)."""
from __future__ import annotations

import json
import random
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import evidence_rms  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import vepo_image_vis  # noqa: E402


def test_best_of_n_picks_the_top_score_per_prompt_and_ties_go_first():
    correct = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    # prompt 0 picks sample 1 (correct), prompt 1 a tie between samples 0 and 2 -> sample 0 (correct),
    # prompt 2 picks sample 0 (wrong): 2 of 3
    scores = torch.tensor([0.1, 0.9, 0.2, 0.5, 0.1, 0.5, 0.7, 0.3, 0.6])
    assert evidence_rms.best_of_n_acc(correct, scores) == pytest.approx(2 / 3)
    assert evidence_rms.best_of_n_acc(correct, -scores) == pytest.approx(0.0)  # 0 of 3: (0,0), (1,1), (2,1)


def _raw():
    """Two seeds, two noise rates, arms bt and crm: made-up numbers with hand-computable summaries."""
    def arm(p, b):
        return {"pairwise_acc": p, "bon_acc": b}

    return {"0": {"bon": {"logprob": 0.30, "random": 0.2, "oracle": 0.5, "birm_linear": 0.1, "birm_logratio": 0.4},
                  "noise": {"0.0": {"bt": arm(0.80, 0.20), "crm": arm(0.70, 0.25)},
                            "0.4": {"bt": arm(0.60, 0.10), "crm": arm(0.65, 0.20)}}, "wall_s": 10.0},
            "1": {"bon": {"logprob": 0.40, "random": 0.3, "oracle": 0.6, "birm_linear": 0.2, "birm_logratio": 0.5},
                  "noise": {"0.0": {"bt": arm(0.90, 0.30), "crm": arm(0.80, 0.35)},
                            "0.4": {"bt": arm(0.50, 0.20), "crm": arm(0.60, 0.30)}}, "wall_s": 12.0}}


def test_label_noise_metrics_values_drops_and_paired_differences():
    m = evidence_rms.label_noise_metrics(_raw(), [0, 1], ["bt", "crm"], "bt")
    assert set(m) == {"pairwise_acc/noise0.0@final", "bon_acc/noise0.0@final", "pairwise_acc/noise0.4@final",
                      "bon_acc/noise0.4@final", "pairwise_drop/0.0->0.4@final"}
    acc = m["pairwise_acc/noise0.4@final"]
    assert acc["arms"]["crm"]["values"] == [0.65, 0.60]
    assert acc["arms"]["bt"]["mean"] == pytest.approx(0.55)
    assert acc["vs_baseline"]["crm"]["mean"] == pytest.approx(0.075)  # (0.05 + 0.10) / 2
    drop = m["pairwise_drop/0.0->0.4@final"]
    assert drop["arms"]["bt"]["values"] == pytest.approx([0.20, 0.40])  # 0.8 - 0.6, 0.9 - 0.5
    assert drop["arms"]["crm"]["values"] == pytest.approx([0.05, 0.20])  # 0.7 - 0.65, 0.8 - 0.6
    assert drop["vs_baseline"]["crm"]["mean"] == pytest.approx(-0.175)  # (-0.15 - 0.20) / 2
    bon = m["bon_acc/noise0.0@final"]  # the log-prob selector rides along as an arm
    assert bon["arms"]["logprob"]["values"] == [0.30, 0.40]
    assert bon["vs_baseline"]["logprob"]["mean"] == pytest.approx(0.10)  # (0.1 + 0.1) / 2 above bt


def test_write_all_writes_compare_json_files_with_their_baselines(tmp_path):
    args = Namespace(steps=60, pairs=1000, prompts=100, n=8, teacher_steps=300, birm_steps=60, birm_prompts=100,
                     noise=[0.0, 0.4], idrm_noise=[0.0])
    raw = _raw()
    for s in raw.values():
        for rate in s["noise"].values():
            rate["crm"]["crm_dropped_flipped"] = 0.5
    paths = evidence_rms.write_all(raw, [0, 1], tmp_path, "python benchmarks/evidence_rms.py", args)
    # no idrm arm, no idrm file
    assert [p.name for p in paths] == ["crm_label_noise.json", "birm_best_of_n.json", "birm_vs_orm.json"]
    crm = json.loads((tmp_path / "crm_label_noise.json").read_text())
    assert crm["baseline"] == "bt" and crm["seeds"] == [0, 1] and crm["crm_dropped_flipped"]["0.4"] == [0.5, 0.5]
    bon = json.loads((tmp_path / "birm_best_of_n.json").read_text())
    block = bon["metrics"]["bon_acc@final"]
    assert bon["baseline"] == "logprob"
    assert set(block["arms"]) == {"logprob", "random", "oracle", "birm_linear", "birm_logratio", "bt", "crm"}
    assert block["arms"]["bt"]["values"] == [0.20, 0.30]  # the clean labels' pool picks
    assert block["vs_baseline"]["birm_logratio"]["mean"] == pytest.approx(0.10)
    orm = json.loads((tmp_path / "birm_vs_orm.json").read_text())["metrics"]["bon_acc@final"]
    assert orm["vs_baseline"]["birm_logratio"]["diffs"] == pytest.approx([0.20, 0.20])  # 0.4 - 0.2, 0.5 - 0.3


def test_noise_must_start_clean():
    with pytest.raises(SystemExit):
        evidence_rms.parse(["--noise", "0.2,0.4"])
    assert evidence_rms.parse(["--noise", "0,0.2"]).noise == [0.0, 0.2]


def test_selection_rows_by_hand():
    sel = torch.tensor([[True, False, True], [False, True, False]])
    vis = torch.tensor([[0.4, 9.0, 0.2], [9.0, 0.6, 9.0]])
    ent = torch.tensor([[1.0, 9.0, 0.5], [9.0, 1.5, 9.0]])
    colour = torch.tensor([[True, False, False], [True, False, False]])
    eos = torch.tensor([[False, False, True], [False, False, True]])
    rows = vepo_image_vis.selection_rows(sel, vis, ent, {"colour": colour, "eos": eos})
    assert rows["vis_resample"] == pytest.approx(0.4)  # (0.4 + 0.2 + 0.6) / 3
    assert rows["entropy"] == pytest.approx(1.0)  # (1 + 0.5 + 1.5) / 3
    assert rows["colour_share"] == pytest.approx(1 / 3)  # only (0, 0)
    assert rows["eos_share"] == pytest.approx(1 / 3)  # only (0, 2)


def test_vepo_seed_comparison_writes_every_arm_per_seed(tmp_path):
    out = tmp_path / "vepo.json"
    vepo_image_vis.run_seeds([0, 1], sft_steps=2, examples=8, out=str(out), command="test")
    data = json.loads(out.read_text())
    assert data["baseline"] == "entropy" and data["seeds"] == [0, 1]
    block = data["metrics"]["selected/colour_share@mean"]
    assert set(block["arms"]) == {"entropy", "vepo", "vepo_grey"} and set(block["vs_baseline"]) == {"vepo",
                                                                                                   "vepo_grey"}
    for arm in block["arms"].values():
        assert len(arm["values"]) == 2 and all(0.0 <= v <= 1.0 for v in arm["values"])
    ent = data["metrics"]["selected/entropy@mean"]["arms"]
    # entropy-only selection keeps the top 20% by H: its tokens' mean H is at least any other selection's
    for k in range(2):
        assert ent["entropy"]["values"][k] >= max(ent["vepo"]["values"][k], ent["vepo_grey"]["values"][k]) - 1e-6


@pytest.mark.slow
def test_evidence_rms_end_to_end_tiny(tmp_path):
    evidence_rms.main(["--seeds", "0", "--noise", "0,0.4", "--steps", "2", "--pairs", "64", "--teacher-steps", "2",
                       "--prompts", "4", "-n", "2", "--birm-steps", "1", "--birm-prompts", "2", "--out-dir",
                       str(tmp_path)])
    raw = json.loads((tmp_path / "crm_idrm_birm_raw.json").read_text())
    assert set(raw["0"]["noise"]["0.0"]) == {"bt", "crm", "idrm"} and set(raw["0"]["noise"]["0.4"]) == {"bt", "crm"}
    assert {"logprob", "random", "oracle", "birm_linear", "birm_logratio"} <= set(raw["0"]["bon"])
    idrm = json.loads((tmp_path / "idrm_label_noise.json").read_text())
    assert set(idrm["metrics"]) == {"pairwise_acc/noise0.0@final", "bon_acc/noise0.0@final"}  # clean only
    crm = json.loads((tmp_path / "crm_label_noise.json").read_text())
    assert "pairwise_drop/0.0->0.4@final" in crm["metrics"]


def test_sandbox_evidence_scores_by_hand_and_the_reference_executor(tmp_path):
    import evidence_sandbox as es

    assert es.intended("AC_ws") == "AC" and es.intended("WA_subtle") == "WA" and es.intended("TLE") == "TLE"
    # labels AC AC WA RE; verdicts AC WA WA AC: accuracy 2/4, TPR 1/2 (one AC judged WA), TNR 1/2 (RE judged AC)
    assert es.scores(["AC", "WA", "WA", "AC"], ["AC", "AC", "WA", "RE"]) == {"verdict_acc": 0.5, "tpr": 0.5,
                                                                           "tnr": 0.5}
    tests = es.draw_tests("max", random.Random(3))
    assert tests == es.draw_tests("max", random.Random(3)) and len(tests) == 5
    for t in tests:  # the expected output is the maximum of the listed numbers
        n, xs = t["stdin"].split("\n")[:2]
        assert int(n) == len(xs.split()) and int(t["expected_stdout"]) == max(map(int, xs.split()))
    ref = es.Reference(tmp_path, time_s=0.5)
    exposing = [{"stdin": "-3 4\n", "expected_stdout": "1\n"}]  # abs(-3) + 4 = 7: the subtle bug shows
    for variant, src in es.PY["sum"].items():
        assert ref.judge(src, "python", exposing) == es.intended(variant), variant
    hiding = [{"stdin": "3 4\n", "expected_stdout": "7\n"}]  # a >= 0: the subtle bug passes
    assert ref.judge(es.PY["sum"]["WA_subtle"], "python", hiding) == "AC"
