"""Code rewards on the sandbox (docs/sandbox.md#code-rewards-and-the-code-task), registered as batch verifiers.

Each scores a whole batch with one :meth:`Sandbox.judge_batch` call (parallel over the pool). The
example carries its tests in ``meta["tests"]`` (``{"stdin", "expected_stdout"}``, or ``{"args",
"expected_return"}`` with ``meta["fn_name"]``); the response's code is its first fenced block or the
whole text, its language ``meta["language"]``, else detected.

- ``code_pass_rate``: fraction of tests passed (verl ``prime_code``-style continuous reward).
- ``code_all_pass``: 1 if every test passes, else 0.
- ``code_klear``: Klear-Reasoner: up to ``max_tests`` (16) tests sampled at random (seeded by the
  problem, so every sample of a prompt is judged on the same tests), mean of +1 / -1 per test = 2 pass_rate - 1.
- ``code_mplsandbox``: MPLSandbox tiers by the worst verdict: 1 all correct, -0.3 wrong answer,
  -0.6 runtime error (TLE / MLE / OLE count as runtime errors), -1 compile or syntax error; the pass
  rate is in ``info``. [derived]: the reference scores the last test only; ``aggregate="last"``
  reproduces that, the default ``"worst"`` is credo's reading.

A sandbox infrastructure failure (SE) is never scored as a wrong answer: the submission is judged
again up to ``retries`` times, and if it still fails the result is a recorded verifier failure
(``failed=True``; the runner's failure score, counted in ``reward/verifier_failures``).
"""
from __future__ import annotations

import atexit
import random
import threading
from typing import Any

from credo.rewards.registry import register_reward
from credo.types import Example, RewardResult

_LOCK = threading.Lock()
_SANDBOXES: dict[tuple, Any] = {}


def shared_sandbox(workers: int | None = None, unsafe: bool = False):
    """One sandbox pool per (workers, unsafe) for the whole process, closed at exit."""
    from credo.sandbox import Sandbox

    key = (workers, unsafe)
    with _LOCK:
        if key not in _SANDBOXES:
            _SANDBOXES[key] = Sandbox(workers=workers, unsafe=unsafe)
            atexit.register(_SANDBOXES[key].close)
        return _SANDBOXES[key]


def _judge_all(responses: list[str], examples: list[Example], *, max_tests: int | None, time_s: float,
               memory_mb: int, workers: int | None, retries: int, unsafe: bool, seed: int):
    from credo.sandbox import JudgeRequest, Limits

    sandbox = shared_sandbox(workers, unsafe)
    limits = Limits(time_s=time_s, memory_mb=memory_mb)
    requests = []
    for response, ex in zip(responses, examples):
        tests = list(ex.meta.get("tests", []))
        if max_tests is not None and len(tests) > max_tests:
            tests = random.Random(f"{seed}/{ex.meta.get('problem', ex.uid)}").sample(tests, max_tests)
        requests.append(JudgeRequest(source=response, tests=tests, language=ex.meta.get("language"), limits=limits,
                                     fn_name=ex.meta.get("fn_name"), checker=ex.meta.get("checker", "tokens")))
    return retry_sandbox_errors(sandbox.judge_batch, requests, retries)


def retry_sandbox_errors(run_batch, requests: list, retries: int) -> list:
    """``run_batch(requests)``'s results, each sandbox failure (verdict SE) submitted again up to ``retries``
    times: an infrastructure failure is never scored as the program's."""
    results = list(run_batch(requests))
    for _ in range(retries):
        redo = [i for i, r in enumerate(results) if r.verdict == "SE"]
        if not redo:
            break
        for i, r in zip(redo, run_batch([requests[i] for i in redo])):
            results[i] = r
    return results


def _info(j) -> dict[str, Any]:
    return {"verdict": j.verdict, "passed": j.passed, "total": j.total, "pass_rate": j.pass_rate,
            "language": j.language}


def _scored(j, score: float) -> RewardResult:
    if j.verdict == "SE":
        return RewardResult(score=0.0, failed=True, error=f"sandbox error: {j.detail[:200]}", info=_info(j))
    return RewardResult(score=score, correct=j.total > 0 and j.passed == j.total, info=_info(j))


def _batch(scorer):
    def reward(responses: list[str], examples: list[Example], *, max_tests: int | None = None, time_s: float = 2.0,
               memory_mb: int = 256, workers: int | None = None, retries: int = 1, unsafe: bool = False,
               seed: int = 0, **kwargs: Any) -> list[RewardResult]:
        judged = _judge_all(responses, examples, max_tests=max_tests, time_s=time_s, memory_mb=memory_mb,
                            workers=workers, retries=retries, unsafe=unsafe, seed=seed)
        return [_scored(j, scorer(j, **kwargs)) for j in judged]

    reward.__doc__ = scorer.__doc__
    return reward


def _pass_rate(j) -> float:
    """Fraction of tests passed."""
    return j.pass_rate


def _all_pass(j) -> float:
    """1.0 if every test passes, else 0.0."""
    return 1.0 if j.total and j.passed == j.total else 0.0


def _klear(j) -> float:
    """Mean of +1 (pass) / -1 (fail) over the sampled tests = 2 * pass_rate - 1."""
    return 2.0 * j.pass_rate - 1.0 if j.total else -1.0


_TIERS = {"AC": 1.0, "WA": -0.3, "RE": -0.6, "TLE": -0.6, "MLE": -0.6, "OLE": -0.6, "CE": -1.0}


def _mplsandbox(j, aggregate: str = "worst") -> float:
    """MPLSandbox tiers: 1 / -0.3 (WA) / -0.6 (runtime) / -1 (compile), by the worst or the last test."""
    if aggregate not in ("worst", "last"):
        raise ValueError(f"aggregate must be 'worst' or 'last', got {aggregate!r}")
    if j.verdict == "CE" or not j.tests:
        return _TIERS.get(j.verdict, -1.0)
    if aggregate == "last":
        return _TIERS.get(j.tests[-1].verdict, -1.0)
    return 1.0 if j.passed == j.total else min(_TIERS.get(t.verdict, -1.0) for t in j.tests)


code_pass_rate = register_reward("code_pass_rate", batch=True)(_batch(_pass_rate))
code_all_pass = register_reward("code_all_pass", batch=True)(_batch(_all_pass))
code_mplsandbox = register_reward("code_mplsandbox", batch=True)(_batch(_mplsandbox))


@register_reward("code_klear", batch=True)
def code_klear(responses: list[str], examples: list[Example], *, max_tests: int | None = 16, time_s: float = 2.0,
               memory_mb: int = 256, workers: int | None = None, retries: int = 1, unsafe: bool = False,
               seed: int = 0) -> list[RewardResult]:
    """Klear-Reasoner: mean of +1 / -1 over up to 16 randomly sampled tests (seeded per example)."""
    judged = _judge_all(responses, examples, max_tests=max_tests, time_s=time_s, memory_mb=memory_mb,
                        workers=workers, retries=retries, unsafe=unsafe, seed=seed)
    return [_scored(j, _klear(j)) for j in judged]
