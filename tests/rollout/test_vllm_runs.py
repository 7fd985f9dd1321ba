"""`credo train rollout.engine=vllm` through the real CLI: the default collector, tree (AttnRL) and agent
collectors, and a Ray pool of vLLM workers with a worker death (`python -m pytest -m vllm`; see tests/rollout/test_vllm.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

FAST = ["train.threads=1", "log.progress=false", "log.tensorboard=false", "log.report=false", "task.train_size=64",
        "task.eval_size=8", "eval.size=8", "eval.k=2", "reward.workers=1", "rollout.group_size=4",
        "train.prompts_per_step=8", "rollout.max_new_tokens=8", "warm_start.steps=80", "checkpoint.every=0"]


def _need_vllm():
    from credo.rollout.vllm_engine import vllm_problem

    problem = vllm_problem()
    assert problem is None, f"the vllm tests need vLLM: {problem}"


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_three_step_train_through_the_cli(tmp_path):
    _need_vllm()
    from credo.cli.main import main

    run = tmp_path / "run"
    assert main(["-q", "train", "--run-dir", str(run), "rollout.engine=vllm", "rollout.vllm.dtype=float32",
                 "train.steps=3", "eval.every=3", *FAST]) == 0
    rows = [r for r in _rows(run) if "rollout/logprob_abs_diff" in r]
    assert len(rows) == 3
    # the engine served each step's fresh policy: its log-probs are the trainer's (float32 both sides)
    assert all(r["rollout/logprob_abs_diff"] < 1e-5 for r in rows)
    assert all("rollout_corr/is_mean" in r for r in rows)  # rollout correction is on by default with vllm
    # the weight_sync guard's probe (credo.guards.weights) checked vLLM after each sync and passed (counter present)
    assert all(r.get("guard/weight_sync_trips") == 0.0 for r in rows)


@pytest.mark.parametrize("preset,extra", [("attnrl", []), ("agent_calc", ["eval.size=4"])])
def test_tree_and_agent_rollouts_through_the_engine(tmp_path, preset, extra):
    _need_vllm()
    from credo.cli.main import main

    run = tmp_path / preset
    assert main(["-q", "train", "-c", preset, "--run-dir", str(run), "rollout.engine=vllm",
                 "rollout.vllm.dtype=float32", "train.steps=2", "eval.every=2", *FAST, *extra]) == 0
    rows = [r for r in _rows(run) if "rollout/logprob_abs_diff" in r]  # steps that updated (reward spread)
    assert len([r for r in _rows(run) if "reward/mean" in r]) == 2
    assert rows and all(r["rollout/logprob_abs_diff"] < 1e-5 for r in rows)


def test_ray_pool_of_two_vllm_workers_replaces_a_dead_one(tmp_path):
    """Two vLLM rollout workers; worker 1 dies at the start of its second call (an injected fault): it is
    replaced, primed with the current weights, its share re-run, and the run ends normally, leaving no model
    folder behind (the dead worker's included)."""
    _need_vllm()
    import tempfile

    from credo.cli.main import main

    folders = lambda: set(Path(tempfile.gettempdir()).glob("credo-vllm-*"))  # noqa: E731
    before = folders()

    run = tmp_path / "ray"
    assert main(["-q", "train", "--run-dir", str(run), "rollout.engine=vllm", "rollout.vllm.dtype=float32",
                 "distributed.backend=ray", "distributed.rollout_workers=2", "distributed.reward_workers=1",
                 "distributed.inject_faults=[rollout:1:2]", "train.steps=2", "eval.every=2", *FAST]) == 0
    rows = [r for r in _rows(run) if "rollout/logprob_abs_diff" in r]
    assert len(rows) == 2 and all(r["rollout/logprob_abs_diff"] < 1e-5 for r in rows)
    assert max(r.get("dist/rollout_restarts", 0) for r in _rows(run)) == 1
    assert folders() <= before  # the workers' (under the pool's scratch folder) are gone with it
