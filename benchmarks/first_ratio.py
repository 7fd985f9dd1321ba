"""The first_ratio guard's measure, ``actor/first_ratio_dev``, on a few arms of a tiny run (docs/guards.md).

Each arm is ``credo train`` through :func:`credo.cli.main.main` on the test configuration (tests/conftest.py
TINY_RUN, 4 steps): on-policy with the old-log-prob pass fused (the default) and with it (mini-batches),
one-step-off and bounded staleness (lag >= 1 after step 0: not checked), LoRA, and an engine that samples at another temperature than the
trainer assumes (the rollout engine's ``generate`` wrapped). Prints per arm the per-step deviation, the policy
lag and the guard's counter after the last step.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/first_ratio.py     # from the repository root
"""
from __future__ import annotations

import dataclasses
import tempfile

from credo.cli.main import main
from credo.rollout import HFRolloutEngine
from credo.tracking.metrics import read_metrics
from tests.conftest import TINY_RUN

RUN = [*TINY_RUN, "warm_start.enabled=false", "eval.every=0", "log.progress=false", "log.report=false",
       "log.tensorboard=false", "reward.name=tests.reward_fixtures:length_score", "train.steps=4"]


def arm(name: str, extra: list[str]) -> None:
    run = tempfile.mkdtemp()
    rc = main(["-q", "train", "--run-dir", run, *RUN, *extra])
    rows = [r for r in read_metrics(f"{run}/metrics.jsonl") if "reward/mean" in r]
    devs = ", ".join(f"{r['actor/first_ratio_dev']:.1e}" for r in rows)
    lags = [r["rollout/policy_lag"] for r in rows]
    print(f"{name}: rc {rc}, actor/first_ratio_dev [{devs}], policy lag {lags}, "
          f"guard/first_ratio_trips {rows[-1].get('guard/first_ratio_trips')}", flush=True)


def hot_engine(temperature: float):
    """HFRolloutEngine.generate sampling at ``temperature`` whatever the run's sampling temperature is."""
    original = HFRolloutEngine.generate

    def generate(self, prompts, n, sampling, *args, **kwargs):
        return original(self, prompts, n, dataclasses.replace(sampling, temperature=temperature), *args, **kwargs)

    return original, generate


def run_all() -> None:
    arm("on-policy, pass fused", [])
    arm("on-policy, with the pass", ["train.mini_batch_size=8"])
    arm("one-step-off", ["rollout.one_step_off=true"])
    arm("bounded staleness 2, partial rollouts", ["rollout.max_staleness=2", "rollout.partial=true"])
    arm("LoRA r=4", ["model.lora={r: 4}"])
    for temperature in (1.1, 2.0):
        original, HFRolloutEngine.generate = hot_engine(temperature)
        try:
            arm(f"engine at T={temperature}, trainer at T=1.0", [])
        finally:
            HFRolloutEngine.generate = original


if __name__ == "__main__":  # the reward workers are processes: the guard keeps them from re-running this
    run_all()
