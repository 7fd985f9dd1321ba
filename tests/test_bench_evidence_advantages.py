"""benchmarks/evidence_advantages.py: the per-seed values it derives from compare runs, by hand, on hand-made
metrics.jsonl files and compare.json files (no training: the runs are credo compare's job)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import evidence_advantages as ev  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)


def _write_runs(root: Path, spec: str, arm: str, rows_by_seed: dict[int, list[dict]]) -> None:
    (root / spec).mkdir(parents=True, exist_ok=True)
    (root / spec / "compare.json").write_text(json.dumps({"seeds": sorted(rows_by_seed)}))
    for seed, rows in rows_by_seed.items():
        d = root / spec / arm / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _evpo_row(step, ev, use, chosen, critic, batch, group):
    return {"step": step, "critic/vf_explained_var": ev, "evpo/use_critic": use, "evpo/resid_var_chosen": chosen,
            "evpo/resid_var_critic": critic, "evpo/resid_var_batch": batch, "evpo/resid_var_group": group,
            "evpo/picked_lower": float(chosen <= min(critic, group))}


def test_evpo_agreement_and_residual_variances(tmp_path):
    runs = {0: [_evpo_row(1, 0.2, 1.0, 0.3, 0.3, 0.4, 0.1), _evpo_row(2, -0.1, 0.0, 0.1, 0.5, 0.4, 0.1),
                _evpo_row(3, 0.1, 0.0, 0.2, 0.3, 0.35, 0.2),  # a gate that disagreed with EV > 0
                {"step": 3, "eval/greedy_acc": 0.5}],  # an eval row: no EVPO keys, skipped
            1: [_evpo_row(1, 0.3, 1.0, 0.2, 0.2, 0.3, 0.1), _evpo_row(2, -0.2, 0.0, 0.1, 0.4, 0.3, 0.1)]}
    _write_runs(tmp_path, "evpo_gate", "evpo", runs)
    ev.evpo_files(tmp_path, tmp_path / "out")
    agree = json.loads((tmp_path / "out" / "evpo_gate_agreement.json").read_text())
    block = agree["metrics"]["use_critic_share"]
    assert block["arms"]["ev_positive"]["values"] == pytest.approx([0.5, 1.0])  # seed 0: 1 of its 2 EV > 0 steps
    assert block["arms"]["ev_nonpositive"]["values"] == pytest.approx([0.0, 0.0])
    assert block["vs_baseline"]["ev_positive"]["diffs"] == pytest.approx([0.5, 1.0])
    assert agree["agreement"] == pytest.approx({"0": 2 / 3, "1": 1.0})
    assert agree["counts"]["0"] == {"steps": 3, "ev_positive": 2}
    resid = json.loads((tmp_path / "out" / "evpo_resid_var.json").read_text())["metrics"]["resid_var@mean"]
    assert resid["arms"]["chosen"]["values"] == pytest.approx([0.2, 0.15])
    assert resid["arms"]["group"]["values"] == pytest.approx([0.4 / 3, 0.1])
    assert resid["vs_baseline"]["critic"]["diffs"] == pytest.approx([1.1 / 3 - 0.2, 0.3 - 0.15])


def test_papo_shares_split_by_the_sign_of_the_phase(tmp_path):
    def row(step, phase, base, share):
        return {"step": step, "papo/phase": phase, "papo/expand_share_base": base, "papo/expand_share": share}
    runs = {0: [row(1, 0.0, 0.5, 0.5), row(2, -0.2, 0.4, 0.5), row(3, -0.1, 0.4, 0.45), row(4, 0.1, 0.5, 0.4)],
            1: [row(1, -0.3, 0.3, 0.4), row(2, 0.2, 0.6, 0.5)]}
    _write_runs(tmp_path, "papo_polarity", "papo", runs)
    ev.papo_file(tmp_path, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "papo_expand_share.json").read_text())
    falling = data["metrics"]["expand_share@falling_entropy_steps"]
    assert falling["arms"]["base"]["values"] == pytest.approx([0.4, 0.3])  # phase 0 counts in neither
    assert falling["arms"]["papo"]["values"] == pytest.approx([0.475, 0.4])
    rising = data["metrics"]["expand_share@rising_entropy_steps"]
    assert rising["vs_baseline"]["papo"]["diffs"] == pytest.approx([-0.1, -0.1])
    assert data["steps"]["falling"] == {"0": 2, "1": 1}


def test_noise_drop_is_paired_by_seed(tmp_path):
    def compare(seeds, ppo, dvpo):
        block = {"arms": {"ppo": {"values": ppo}, "dvpo": {"values": dvpo}}}
        return {"seeds": seeds, "metrics": {"eval/greedy_acc@final": block, "acc/mean@last:0.5": block}}
    for name, data in (("critic_noise_0", compare([0, 1, 2], [0.5, 0.6, 0.7], [0.5, 0.5, 0.6])),
                       ("critic_noise_40", compare([0, 2], [0.3, 0.6], [0.45, 0.5]))):  # seed 1 failed at 0.4
        (tmp_path / name).mkdir()
        (tmp_path / name / "compare.json").write_text(json.dumps(data))
    ev.noise_file(tmp_path, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "critic_noise_drop.json").read_text())
    block = data["metrics"]["drop_0_to_0.4/eval/greedy_acc@final"]
    assert data["seeds"] == [0, 2]
    assert block["arms"]["ppo"]["values"] == pytest.approx([0.2, 0.1])
    assert block["arms"]["dvpo"]["values"] == pytest.approx([0.05, 0.1])
    assert block["vs_baseline"]["dvpo"]["diffs"] == pytest.approx([-0.15, 0.0])
