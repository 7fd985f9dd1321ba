"""Robust critics under noisy rewards: `credo compare` of PPO, GRPO, DVPO and VRPO on the demo task with 0% and
20% of the training rewards flipped, 40 RL steps each (slow tier). The measured table is in docs/reward_models.md
("Noisy rewards")."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.tracking.metrics import read_metrics

PRESETS = ["ppo", "grpo", "dvpo", "vrpo"]


@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_ppo_grpo_dvpo_vrpo_at_0_and_20_percent_noise(tmp_path: Path):
    for noise in (0.0, 0.2):
        out = tmp_path / f"noise{noise}"
        assert main(["-q", "compare", "--presets", ",".join(PRESETS), "--seeds", "1", "--out", str(out),
                     f"reward.noise={noise}", "train.steps=40", "eval.every=20", "log.progress=false"]) == 0
        data = json.loads((out / "compare.json").read_text())
        assert list(data["arms"]) == PRESETS
        for arm, summary in data["metrics"]["eval/greedy_acc@final"]["arms"].items():
            assert all(0.0 <= v <= 1.0 for v in summary["values"]), arm
        for preset in PRESETS:
            steps = [m for m in read_metrics(out / preset / "seed0" / "metrics.jsonl") if "reward/mean" in m]
            noised = [m.get("reward/noised_frac", 0.0) for m in steps]
            mean = sum(noised) / len(noised)
            assert (mean == 0.0) if noise == 0.0 else abs(mean - noise) < 0.05, (preset, mean)
