"""One-step-off-policy mode (rollout.one_step_off): lag, behaviour-policy ratios, exact resume, the prefetch."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.tracking.metrics import read_metrics
from credo.collect.group import Prefetch
from credo.types import Rollouts
from credo.tracking.timer import Timer
from tests.conftest import TINY_RUN

RUN = [*TINY_RUN, "log.report=false", "log.tensorboard=false", "reward.name=tests.reward_fixtures:length_score",
       "rollout.one_step_off=true"]
VOLATILE = ("timing_s/", "perf/")


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_metrics(run / "metrics.jsonl")
            if "reward/mean" in r]


def test_one_step_off_trains_on_the_previous_policys_samples_with_behaviour_ratios(tmp_path: Path):
    assert main(["-q", "train", "--run-dir", str(tmp_path / "b"), *RUN, "train.steps=4", "eval.every=0"]) == 0
    rows = _rows(tmp_path / "b")
    # step 0 trains on its own samples (nothing was in flight); step t >= 1 on those policy t-1 generated while
    # step t-1 updated
    assert [r["rollout/policy_version"] for r in rows] == [0, 0, 1, 2]
    assert [r["rollout/policy_lag"] for r in rows] == [0, 1, 1, 1]
    # the trainer's log-probs equal the sampler's on-policy, and differ once the policy has moved on
    assert rows[0]["rollout/logprob_abs_diff"] < 1e-5
    assert all(r["rollout/logprob_abs_diff"] > 1e-4 for r in rows[1:])
    # behaviour ratio: exp(logprobs - rollout_logprobs) is 1 only where the sampling policy is the current one
    assert rows[0]["actor/ratio"] == pytest.approx(1.0, abs=1e-5)
    assert any(abs(r["actor/ratio"] - 1.0) > 1e-5 for r in rows[1:])
    # recompute: the ratio's denominator is the trainer's pre-update pass, so it is exactly 1 in the first epoch
    assert main(["-q", "train", "--run-dir", str(tmp_path / "r"), *RUN, "train.steps=3", "eval.every=0",
                 "rollout.off_policy_ratio=recompute"]) == 0
    assert all(r["actor/ratio"] == pytest.approx(1.0, abs=1e-6) for r in _rows(tmp_path / "r"))


def test_prefetch_runs_in_the_background_and_hands_over_result_timings_and_errors():
    release = threading.Event()

    def collect(timer: Timer) -> Rollouts:
        with timer("gen"):
            release.wait(5)
        return Rollouts([], [], {"x": 1.0})

    job = Prefetch(collect)
    release.set()  # the constructor returned while the collection was still waiting
    timer = Timer()
    assert job.wait(timer).metrics == {"x": 1.0}
    assert timer.seconds["gen"] > 0
    assert job.wait(Timer()).metrics == {"x": 1.0}  # a second wait returns the same result, timings counted once

    def broken(timer: Timer) -> Rollouts:
        raise ValueError("engine failed")

    with pytest.raises(ValueError, match="engine failed"):
        Prefetch(broken).wait()
    assert Prefetch(done=Rollouts([], [], {"y": 2.0})).wait().metrics == {"y": 2.0}
