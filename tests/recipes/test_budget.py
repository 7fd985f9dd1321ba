"""train.budget: a run ends at a sampled-token / trained-token / wall-time budget (credo.recipes.budget,
credo.rollout.counting)."""
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from credo.cli.main import main
from credo.config import ConfigError, load_run_config
from credo.recipes.budget import add_spend, finished
from credo.rollout.counting import SampledTokens
from credo.tracking.metrics import read_metrics
from tests.conftest import TINY_COLD, full_and_resumed_runs

ARGS = [*TINY_COLD, "eval.every=0", "checkpoint.every=1", "log.report=false", "log.tensorboard=false",
        "reward.name=tests.reward_fixtures:length_score", "train.steps=20"]


@dataclass
class _Cont:
    ids: list


@dataclass
class _Traj:
    response_ids: list = field(default_factory=list)


class _Engine:
    """generate calls its own continue_ids, as credo's HF engine does."""

    def continue_ids(self, prefixes, sampling=None):
        return [_Cont(ids=[1] * 3) for _ in prefixes]

    def generate(self, prompts, n, sampling=None):
        return [_Traj(response_ids=c.ids) for c in self.continue_ids([p for p in prompts for _ in range(n)])]


def test_sampled_tokens_counts_outer_calls_once_into_the_innermost_scope():
    counter = SampledTokens()
    engine = counter.attach(_Engine())
    with counter.scope() as step:
        engine.generate(["a", "b"], 2)  # 4 trajectories x 3 tokens, counted at generate only (not its continue_ids)
        with counter.scope() as batch:
            engine.continue_ids([[0], [1]])  # 2 x 3, to the inner scope only
        with counter.paused():
            engine.generate(["c"], 4)  # an evaluation: not counted
    assert (step.tokens, batch.tokens) == (12, 6)
    engine.continue_ids([[0]])  # no scope open on this thread: counted loose
    assert counter.take_loose() == 3 and counter.take_loose() == 0


def test_a_scope_counts_its_own_thread_only():
    import threading

    counter = SampledTokens()
    engine = counter.attach(_Engine())
    with counter.scope() as main_thread:
        worker = threading.Thread(target=lambda: engine.continue_ids([[0]] * 5))
        worker.start()
        worker.join()
    assert main_thread.tokens == 0 and counter.take_loose() == 15


def test_finished_by_unit():
    cfg = SimpleNamespace(train=SimpleNamespace(steps=10, budget="trained_tokens", budget_value=100.0))
    state = SimpleNamespace(step=3, sampled_tokens=0, trained_tokens=0.0, wall_s=0.0)
    add_spend(state, {"perf/response_tokens": 60.0, "perf/sampled_tokens_collect": 80.0}, sampled=10, wall_s=0.5)
    assert state.trained_tokens == 60.0 and state.sampled_tokens == 90 and not finished(cfg, state)
    add_spend(state, m := {"perf/response_tokens": 40.0}, sampled=50, wall_s=0.5)
    assert finished(cfg, state) and m["budget/trained_tokens"] == 100.0 and m["budget/sampled_tokens"] == 140.0
    cfg.train.budget = "sampled_tokens"
    cfg.train.budget_value = 141.0
    assert not finished(cfg, state)
    state.step = 10  # train.steps stays an upper bound
    assert finished(cfg, state)


def test_budget_config_checks():
    with pytest.raises(ConfigError, match="budget_value"):
        load_run_config(None, ["train.budget=trained_tokens"])
    with pytest.raises(ConfigError, match="several ranks"):
        load_run_config(None, ["train.budget=wall_s", "train.budget_value=5", "distributed.backend=torchrun"])


def test_trained_token_budget_stops_at_the_first_step_reaching_it_and_resumes_to_the_same_step(tmp_path,
                                                                                                monkeypatch):
    """The run stops after the first step whose total trained tokens reach the budget, with its final evaluation
    and checkpoint; killed and resumed, it counts on from the checkpoint and stops at the same step."""
    args = [*ARGS, "train.budget=trained_tokens", "train.budget_value=400"]
    full, cut = full_and_resumed_runs(tmp_path, monkeypatch, args, stop_at=2)
    rows = read_metrics(full / "metrics.jsonl")
    steps = [r for r in rows if "budget/trained_tokens" in r]
    totals = [r["budget/trained_tokens"] for r in steps]
    assert totals[-1] >= 400 > totals[-2] and len(steps) < 20  # stopped by the budget, not train.steps
    assert totals == [sum(r["perf/response_tokens"] for r in steps[:i + 1]) for i in range(len(steps))]
    assert "eval/greedy_acc" in rows[-1]  # the last step is evaluated...
    summary = json.loads((full / "summary.json").read_text())
    assert summary["steps"] == len(steps) and (full / "checkpoints" / f"step_{len(steps):06d}").is_dir()
    resumed = [r for r in read_metrics(cut / "metrics.jsonl") if "budget/trained_tokens" in r]
    assert [r["budget/trained_tokens"] for r in resumed] == totals
    assert [r["budget/sampled_tokens"] for r in resumed] == [r["budget/sampled_tokens"] for r in steps]


def test_sampled_token_budget_excludes_evaluation(tmp_path):
    run = tmp_path / "run"
    assert main(["-q", "train", "--run-dir", str(run), *ARGS, "eval.every=1", "train.budget=sampled_tokens",
                 "train.budget_value=300"]) == 0
    steps = [r for r in read_metrics(run / "metrics.jsonl") if "budget/sampled_tokens" in r]
    # one group collector call per step, no filtering: what it sampled is what the update trains on; the
    # evaluation after every step (greedy + eval.k samples) is left out
    assert [r["perf/sampled_tokens"] for r in steps] == [r["perf/response_tokens"] for r in steps]
    assert steps[-1]["budget/sampled_tokens"] >= 300 > steps[-2]["budget/sampled_tokens"]
