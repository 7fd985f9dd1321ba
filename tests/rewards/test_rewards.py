"""Tests for credo.rewards: registry, built-in verifiers and the fault-tolerant RewardRunner."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from credo.rewards import RewardRunner, get_reward_fn, list_rewards, register_reward, to_result
from credo.rewards.verifiers import countdown, exact_match, math_verifier
from credo.types import Example, RewardResult
from tests import reward_fixtures

FIXTURES = "tests.reward_fixtures"


def ex(answer: str = "", **meta: object) -> Example:
    return Example(prompt="p", answer=answer, meta=dict(meta))


# ------------------------------------------------------------------------------------ registry


def test_builtins_registered():
    assert {"exact_match", "countdown", "math"} <= set(list_rewards())
    assert get_reward_fn("countdown") is countdown


def test_to_result_normalisation():
    assert to_result(True) == RewardResult(score=1.0, correct=True)
    assert to_result(False) == RewardResult(score=0.0, correct=False)
    assert to_result(1) == RewardResult(score=1.0, correct=True)
    assert to_result(0.5) == RewardResult(score=0.5, correct=False)
    r = RewardResult(score=0.3, info={"a": 1})
    assert to_result(r) is r
    with pytest.raises(TypeError):
        to_result("1.0")
    with pytest.raises(TypeError):
        to_result(None)


def test_register_conflict_and_idempotent_reregister():
    def first(response, example):
        return 1.0

    def other(response, example):
        return 0.0

    register_reward("test_conflict")(first)
    register_reward("test_conflict")(first)  # same function again: fine
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_conflict")(other)
    with pytest.raises(ValueError):
        register_reward("bad:name")


def test_unknown_name_suggests_close_match():
    with pytest.raises(KeyError, match="did you mean 'countdown'") as info:
        get_reward_fn("countdwn")
    assert "exact_match" in str(info.value)
    with pytest.raises(KeyError, match="countdwn"):
        RewardRunner("countdwn")  # resolved at construction: fails fast


def test_import_path():
    assert get_reward_fn(f"{FIXTURES}:normal") is reward_fixtures.normal
    with pytest.raises(KeyError):
        get_reward_fn(f"{FIXTURES}:missing")
    with pytest.raises(ImportError):
        get_reward_fn("no_such_module_xyz:fn")


# ------------------------------------------------------------------------------- exact_match


@pytest.mark.parametrize(
    "response, answer, ok",
    [
        ("42", "42", True),
        ("  42 \n because reasons", "42", True),
        ("\n\n42\nmore", " 42 ", True),
        ("42.", "42", False),
        ("4 2", "42", False),
        ("Paris", "paris", False),
        ("", "42", False),
    ],
)
def test_exact_match(response, answer, ok):
    r = exact_match(response, ex(answer))
    assert (r.score, r.correct, r.failed) == (float(ok), ok, False)


# --------------------------------------------------------------------------------- countdown

PUZZLE = dict(numbers=[1, 3, 4, 6], target=24)


@pytest.mark.parametrize(
    "response, use_all, reason",
    [
        ("6/(1-3/4)", True, "ok"),  # fractions on the way: exact arithmetic
        (" 6 / ( 1 - 3 / 4 ) \nthat's it", True, "ok"),
        ("(6/(1-3/4))", True, "ok"),
        ("6*4*1*(3-3)", True, "bad_numbers"),  # reuses 3
        ("6*4+1+3", True, "wrong_value"),
        ("6*4", True, "bad_numbers"),  # misses 1 and 3 ...
        ("6*4", False, "ok"),  # ... which is allowed with use_all=False
        ("6*4*4", False, "bad_numbers"),  # 4 twice is not a sub-multiset
        ("6*4+1", False, "wrong_value"),
        ("6/(4-4)", False, "div_zero"),
        ("1*3*4*6/(6-6)", False, "div_zero"),
        ("the answer is 24", True, "parse_error"),
        ("6*(4", True, "parse_error"),
        ("", True, "parse_error"),
        ("__import__('os')", True, "parse_error"),
        ("6*4**1*3", True, "disallowed"),
        ("2**10", True, "disallowed"),
        ("6//1*4", True, "disallowed"),
        ("-1+3*4*6", True, "disallowed"),  # no unary minus
        ("(" * 150 + "1" + ")" * 150, True, "too_long"),
    ],
)
def test_countdown(response, use_all, reason):
    r = countdown(response, ex(**PUZZLE), use_all=use_all)
    assert r.info["reason"] == reason
    assert r.correct is (reason == "ok") and r.score == float(reason == "ok")
    assert not r.failed


def test_countdown_accepts_any_valid_expression():
    puzzle = ex(numbers=[2, 3, 4], target=10)
    for expr in ("2*3+4", "4+3*2", "(4*3)-2", "3*2+4"):
        r = countdown(expr, puzzle)
        assert r.correct and r.info == {"reason": "ok", "value": "10"}


def test_countdown_records_value_and_missing_meta_raises():
    assert countdown("1+3+4+6", ex(**PUZZLE)).info == {"reason": "wrong_value", "value": "14"}
    with pytest.raises(KeyError):
        countdown("1+2", ex(target=3))


# -------------------------------------------------------------------------------------- math


@pytest.mark.parametrize(
    "response, answer, ok",
    [
        ("The answer is $\\boxed{0.5}$", "\\frac{1}{2}", True),
        ("So we get $\\frac{1}{2}$.", "0.5", True),
        ("Final answer: $\\boxed{\\frac{2}{4}}$", "$\\frac{1}{2}$", True),
        ("The answer is $\\boxed{3}$", "\\frac{1}{2}", False),
        ("I don't know", "7", False),
    ],
)
def test_math(response, answer, ok):
    r = math_verifier(response, ex(answer))
    assert (r.score, r.correct, r.failed) == (float(ok), ok, False)


# ------------------------------------------------------------------------------ RewardRunner


def test_process_runner_survives_hang_exception_and_crash():
    cases = ["a", "hang", "b", "raise", "wrong", "exit", "bad_type", "c"]
    examples = [ex("x" if c == "wrong" else c) for c in cases]
    with RewardRunner(f"{FIXTURES}:by_response", timeout_s=1.0, failure_score=-1.0, workers=2) as runner:
        start = time.monotonic()
        results = runner.score(cases, examples)
        elapsed = time.monotonic() - start
        assert elapsed < 1.0 + 2.0, elapsed

        by_case = dict(zip(cases, results))
        for c in ("a", "b", "c"):  # later items of the same batch are scored normally, in order
            assert by_case[c].correct and by_case[c].info["echo"] == c and not by_case[c].failed
        assert by_case["wrong"] == RewardResult(0.0, info=by_case["wrong"].info)
        hang, raised, died, bad = by_case["hang"], by_case["raise"], by_case["exit"], by_case["bad_type"]
        assert hang.failed and hang.score == -1.0 and hang.error.startswith("timeout")
        assert raised.failed and raised.score == -1.0 and raised.error.startswith("ValueError: bad verifier")
        assert len(raised.error) <= 300
        assert died.failed and died.score == -1.0 and died.error == "worker died"
        assert bad.failed and bad.error.startswith("TypeError")
        assert all("time_s" in r.info for r in results)
        assert runner.stats == {
            "calls": 8, "failures": 4, "timeouts": 1, "exceptions": 2, "worker_restarts": 2
        }

        # the replaced workers serve later calls
        again = runner.score(["d", "e", "nope"], [ex("d"), ex("e"), ex("x")])
        assert [r.correct for r in again] == [True, True, False]
        assert runner.stats["calls"] == 11 and runner.stats["worker_restarts"] == 2
        procs = [w.proc for w in runner._workers]
        assert len(procs) == 2 and all(p.is_alive() and p.daemon for p in procs)
    assert all(not p.is_alive() for p in procs)  # closed by the context manager


def test_process_workers_do_not_import_torch_and_get_kwargs():
    with RewardRunner(f"{FIXTURES}:modules_loaded", fn_kwargs={"k": 3}, workers=1) as runner:
        (r,) = runner.score(["x"], [ex("x")])
    assert r.info["heavy"] == [] and r.info["kwargs"] == {"k": 3}
    assert r.info["pid"] != os.getpid()


def test_unpicklable_result_becomes_failure_and_worker_lives_on():
    with RewardRunner(f"{FIXTURES}:unpicklable", workers=1, failure_score=-1.0) as runner:
        (r,) = runner.score(["x"], [ex("x")])
        assert r.failed and r.score == -1.0 and "pickle" in r.error.lower()
        assert runner.stats["worker_restarts"] == 0 and runner.stats["exceptions"] == 1


def test_registered_custom_name_resolves_in_worker():
    with RewardRunner("fixture_shout", workers=1) as runner:  # registered in tests/reward_fixtures.py
        results = runner.score(["hi", "no"], [ex("HI"), ex("YES")])
    assert [r.correct for r in results] == [True, False]


def test_process_runner_math_and_countdown():
    with RewardRunner("math", workers=1, timeout_s=10.0) as runner:
        (r,) = runner.score(["$\\boxed{0.5}$"], [ex("\\frac{1}{2}")])
    assert r.correct and not r.failed
    with RewardRunner("countdown", workers=2, fn_kwargs={"use_all": False}) as runner:
        results = runner.score(["6*4", "6*4*4"], [ex(**PUZZLE)] * 2)
    assert [r.info["reason"] for r in results] == ["ok", "bad_numbers"]


def test_inline_runner_catches_exceptions():
    runner = RewardRunner(f"{FIXTURES}:by_response", executor="inline", failure_score=-2.0)
    results = runner.score(["a", "raise", "b"], [ex("a"), ex("x"), ex("b")])
    assert [r.correct for r in results] == [True, False, True]
    assert results[1].failed and results[1].score == -2.0 and results[1].error.startswith("ValueError")
    assert all("time_s" in r.info for r in results)
    assert runner.stats == {"calls": 3, "failures": 1, "timeouts": 0, "exceptions": 1, "worker_restarts": 0}
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.score(["a"], [ex("a")])


def test_auto_executor_runs_only_inline_safe_verifiers_in_process():
    """exact_match / number are declared inline-safe: no worker process starts; anything else (math's parser,
    a user's function) goes to the process pool, where a hang is still cut off."""
    for name in ("exact_match", "number"):
        with RewardRunner(name, executor="auto") as runner:
            assert runner.executor == "inline"
            (r,) = runner.score(["7"], [ex("7")])
            assert r.correct and runner._workers == []
    for name in ("math", "countdown", f"{FIXTURES}:by_response"):
        with RewardRunner(name, executor="auto") as runner:
            assert runner.executor == "process"
    with RewardRunner(f"{FIXTURES}:by_response", executor="auto", timeout_s=0.5, workers=1) as runner:
        results = runner.score(["hang", "a"], [ex("x"), ex("a")])
    assert results[0].failed and "timeout" in results[0].error and results[1].correct


def test_runner_argument_checks():
    with pytest.raises(ValueError):
        RewardRunner("exact_match", executor="thread")
    with RewardRunner("exact_match", executor="inline") as runner:
        with pytest.raises(ValueError):
            runner.score(["a", "b"], [ex("a")])


def test_importing_rewards_does_not_import_torch():
    code = "import sys, credo.rewards; print('torch' in sys.modules, 'sympy' in sys.modules)"
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_builtin_reward_is_listed_and_found_without_importing_its_module_first():
    """The reward registry names its built-in modules (credo.registry.Registry builtins): the first listing or
    lookup imports them, so no caller imports a verifier's module to see its name."""
    code = ("import sys; from credo.rewards.registry import get_reward_fn, list_rewards; "
            "before = 'credo.rewards.humaneval' in sys.modules; names = list_rewards(); "
            "print(before, 'credo.rewards.humaneval' in sys.modules, 'humaneval' in names, "
            "get_reward_fn('humaneval').__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True", "credo.rewards.humaneval"]
