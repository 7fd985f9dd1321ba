"""The built-in code task (every reference solution passes its tests in the sandbox) and the code rewards."""
from __future__ import annotations

import pytest

from credo.data.code_task import load_problems
from credo.rewards import RewardRunner
from credo.sandbox import JudgeRequest, Limits
from credo.types import Example
from tests.sandbox_util import ONE_POOL_AT_A_TIME

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)


def test_task_has_at_least_40_problems_with_5_tests_each():
    problems = load_problems()
    assert len(problems) >= 40 and len({p["id"] for p in problems}) == len(problems)
    assert all(len(p["tests"]) >= 5 for p in problems)


def test_every_reference_solution_is_accepted(sandbox):
    problems = load_problems()
    results = sandbox.judge_batch([JudgeRequest(source=p["solution"], tests=p["tests"], language="python",
                                                limits=Limits(time_s=2.0)) for p in problems])
    failed = {p["id"]: (r.verdict, r.detail) for p, r in zip(problems, results) if r.verdict != "AC"}
    assert failed == {}


def _ex(problem_id: str) -> Example:
    p = next(p for p in load_problems() if p["id"] == problem_id)
    return Example(prompt=p["description"], answer=p["solution"], uid=f"code/train/{problem_id}",
                   meta={"tests": p["tests"], "language": "python", "problem": problem_id})


RESPONSES = {
    "correct": "a,b=map(int,input().split())\nprint(a+b)",
    "fenced": "Here you go:\n```python\na,b=map(int,input().split())\nprint(a+b)\n```",
    "half": "a,b=map(int,input().split())\nprint(a+b if a>0 else 1)",  # right exactly when a > 0
    "wrong": "print(999)",
    "crash": "raise SystemExit(3)",
    "syntax": "print(",
}


@pytest.fixture(scope="module")
def scored(sandbox):
    out = {}
    examples = [_ex("sum")] * len(RESPONSES)
    for name in ("code_pass_rate", "code_all_pass", "code_klear", "code_mplsandbox"):
        with RewardRunner(name) as runner:
            out[name] = dict(zip(RESPONSES, runner.score(list(RESPONSES.values()), examples)))
    return out


def test_code_rewards_by_verdict(scored):
    # "sum" has 6 tests: 1 2 | -5 5 | 100 23 | 0 0 | 7 8 | -3 -4; "half" passes a > 0 only: 3 of 6
    pr, ap, kl, mp = (scored[n] for n in ("code_pass_rate", "code_all_pass", "code_klear", "code_mplsandbox"))
    assert pr["correct"].score == pr["fenced"].score == 1.0 and pr["correct"].correct
    assert pr["half"].score == pytest.approx(3 / 6) and not pr["half"].correct
    assert pr["wrong"].score == 0.0 and pr["crash"].score == 0.0
    assert ap["correct"].score == 1.0 and ap["half"].score == 0.0
    assert kl["correct"].score == 1.0 and kl["half"].score == pytest.approx(0.0)  # 2 * 0.5 - 1
    assert kl["wrong"].score == -1.0
    # MPLSandbox tiers: all correct 1, wrong answer -0.3, runtime error -0.6, syntax error -1
    assert mp["correct"].score == 1.0 and mp["wrong"].score == -0.3 and mp["half"].score == -0.3
    assert mp["crash"].score == -0.6 and mp["syntax"].score == -1.0
    assert mp["half"].info["pass_rate"] == pytest.approx(0.5) and mp["syntax"].info["verdict"] == "CE"


def test_klear_samples_the_same_tests_for_every_sample_of_a_problem(sandbox):
    from credo.rewards.code import code_klear

    ex = _ex("sum")
    first = code_klear([RESPONSES["half"]] * 3, [ex] * 3, max_tests=2, seed=7)
    assert len({r.score for r in first}) == 1  # same 2 tests each time
    assert all(r.info["total"] == 2 for r in first)


def test_mplsandbox_last_test_aggregation_reproduces_the_reference():
    from credo.rewards.code import _mplsandbox
    from credo.sandbox.results import JudgeResult, TestResult

    j = JudgeResult(verdict="RE", passed=1, total=2, tests=[TestResult(0, "RE"), TestResult(1, "AC")])
    assert _mplsandbox(j, aggregate="worst") == -0.6
    assert _mplsandbox(j, aggregate="last") == 1.0  # the reference scores the last test only


def test_sandbox_failure_is_a_recorded_failure_not_a_wrong_answer(sandbox):
    ex = Example(prompt="x", answer="", uid="u", meta={"tests": [{"stdin": "", "expected_stdout": ""}],
                                                       "language": "cobol"})
    with RewardRunner("code_pass_rate", failure_score=-5.0) as runner:
        (result,) = runner.score(["print(1)"], [ex])
        assert result.failed and "sandbox error" in result.error and result.score == -5.0
        assert runner.stats["failures"] == 1


def test_code_rl_preset_runs_end_to_end_through_the_cli(sandbox, tmp_path):
    import json

    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics

    run = tmp_path / "code"
    assert main(["-q", "train", "--config", "code_grpo", "--run-dir", str(run), "train.steps=2", "warm_start.steps=5",
                 "eval.every=0", "task.train_size=40", "log.report=false", "log.tensorboard=false",
                 "model.hidden_size=32", "model.intermediate_size=64", "rollout.max_new_tokens=32"]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("reward/mean" in r and r["reward/verifier_failures"] == 0 for r in rows[1:])
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
