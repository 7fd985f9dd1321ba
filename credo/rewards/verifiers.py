"""Built-in verifiers: ``exact_match``, ``number``, ``countdown`` and ``math``.

Each is registered by name on import. A malformed *response* is the model's fault and scores 0
(``failed=False``); a verifier only raises for problems on the task side (e.g. missing metadata),
which the :class:`~credo.rewards.runner.RewardRunner` turns into a failed result.
"""
from __future__ import annotations

import ast
import logging
import re
from collections import Counter
from fractions import Fraction
from typing import Any, Callable

from credo.rewards.registry import register_reward
from credo.types import Example, RewardResult


def _first_line(text: str) -> str:
    """``text`` stripped of surrounding whitespace, cut at the first newline, stripped again."""
    return text.strip().split("\n", 1)[0].strip()


@register_reward("exact_match", inline_safe=True)
def exact_match(response: str, example: Example, **_: Any) -> RewardResult:
    """Score 1.0 iff the response's first line (whitespace-stripped) equals ``example.answer.strip()``.

    Leading/trailing whitespace of the whole response is removed first, then everything from the
    first newline on is dropped. The comparison is exact and case-sensitive.
    """
    ok = _first_line(response) == example.answer.strip()
    return RewardResult(score=1.0 if ok else 0.0, correct=ok)


# ----------------------------------------------------------------------------------------- countdown

COUNTDOWN_MAX_CHARS = 200
_COUNTDOWN_CHARS = re.compile(r"[0-9+\-*/() \t]*")
_COUNTDOWN_OPS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class _Disallowed(ValueError):
    """The expression contains a node other than + - * / on integer literals."""


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@register_reward("number", inline_safe=True)
def number(response: str, example: Example, **_: Any) -> RewardResult:
    """Score 1.0 iff the last number in the response equals ``example.answer`` numerically.

    For chatty models: "12 + 35 = 47" and "The answer is 47." both score 1 for answer "47"; a response
    without a number scores 0. Numbers are integers or decimals with an optional minus sign; "1,000" reads
    as two numbers, so the last one (000) is compared.
    """
    found = _NUMBER.findall(response)
    if not found:
        return RewardResult(score=0.0, correct=False, info={"reason": "no number"})
    try:
        ok = Fraction(found[-1]) == Fraction(example.answer.strip())
    except (ValueError, ZeroDivisionError) as exc:
        raise ValueError(f"answer {example.answer!r} is not a number") from exc
    return RewardResult(score=float(ok), correct=ok, info={"parsed": found[-1]})


def _eval_countdown(node: ast.AST, used: list[int]) -> Fraction:
    """Evaluate an expression tree exactly; record every integer literal in ``used``.

    Raises ``_Disallowed`` for any other node and ``ZeroDivisionError`` for division by zero.
    """
    if isinstance(node, ast.Expression):
        return _eval_countdown(node.body, used)
    if isinstance(node, ast.BinOp) and type(node.op) in _COUNTDOWN_OPS:
        left = _eval_countdown(node.left, used)
        right = _eval_countdown(node.right, used)
        return _COUNTDOWN_OPS[type(node.op)](left, right)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    raise _Disallowed(type(node).__name__)


def _numbers_ok(used: list[int], numbers: list[int], use_all: bool) -> bool:
    """Whether ``used`` equals (``use_all``) or is a sub-multiset of ``numbers``."""
    have, need = Counter(used), Counter(numbers)
    if use_all:
        return have == need
    return all(need[n] >= c for n, c in have.items())


def _countdown_fail(reason: str, **info: Any) -> RewardResult:
    return RewardResult(score=0.0, correct=False, info={"reason": reason, **info})


@register_reward("countdown")
def countdown(response: str, example: Example, *, use_all: bool = True, **_: Any) -> RewardResult:
    """Countdown game: an arithmetic expression over the given numbers that hits the target.

    Task data: ``example.meta["numbers"]`` (list of ints) and ``example.meta["target"]`` (int);
    a missing key raises (a task error, not the model's).

    Accepted response: its first line, stripped, at most 200 characters, made only of decimal
    integer literals, ``+ - * /``, parentheses and spaces/tabs. It is parsed with ``ast`` (never
    ``eval``): only binary ``+ - * /`` on integer literals are allowed -- no unary minus, no ``**``,
    no ``//``, no names or calls. Evaluation is exact (``fractions.Fraction``), so intermediate
    fractions are fine. Correct iff the value equals the target and the multiset of literals used
    equals ``numbers`` (``use_all=True``, default) or is a sub-multiset of it (``use_all=False``).
    Any such expression is accepted.

    ``info["reason"]`` is one of ``ok``, ``wrong_value``, ``bad_numbers``, ``div_zero``,
    ``parse_error``, ``disallowed``, ``too_long``; ``info["value"]`` holds the value when computed.
    Every malformed response scores 0 with ``failed=False``.
    """
    numbers = [int(n) for n in example.meta["numbers"]]
    target = Fraction(int(example.meta["target"]))
    expr = _first_line(response)
    if len(expr) > COUNTDOWN_MAX_CHARS:
        return _countdown_fail("too_long")
    if not expr or not _COUNTDOWN_CHARS.fullmatch(expr):
        return _countdown_fail("parse_error")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return _countdown_fail("parse_error")
    used: list[int] = []
    try:
        value = _eval_countdown(tree, used)
    except _Disallowed as e:
        return _countdown_fail("disallowed", node=str(e))
    except ZeroDivisionError:
        return _countdown_fail("div_zero")
    if not _numbers_ok(used, numbers, use_all):
        return _countdown_fail("bad_numbers", value=str(value))
    if value != target:
        return _countdown_fail("wrong_value", value=str(value))
    return RewardResult(score=1.0, correct=True, info={"reason": "ok", "value": str(value)})


# ---------------------------------------------------------------------------------------------- math


def _drop_timeout_disabled_warning(record: logging.LogRecord) -> bool:
    """Logging filter: math-verify warns once per process that its timeout is off; we know."""
    return not str(record.msg).startswith("Timeout is disabled")


def _load_math_verify() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Import ``math_verify`` lazily (it pulls in sympy, which is slow to import)."""
    from math_verify import parse, verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if _drop_timeout_disabled_warning not in logger.filters:
            logger.addFilter(_drop_timeout_disabled_warning)
    return parse, verify


def _gold_text(answer: str) -> str:
    """Wrap a bare reference answer in ``$...$`` so math-verify parses it as LaTeX."""
    answer = answer.strip()
    if "$" in answer or "\\boxed" in answer:
        return answer
    return f"${answer}$"


@register_reward("math")
def math_verifier(response: str, example: Example, **_: Any) -> RewardResult:
    """Mathematical equivalence of the response's final answer and ``example.answer`` (math-verify).

    The gold answer is ``example.answer``, wrapped in ``$...$`` unless it already contains ``$``
    or ``\\boxed``; an unparseable gold answer raises ``ValueError`` (a task error). The response
    is parsed by math-verify's default extraction (boxed answers first, then LaTeX / plain
    expressions). Score 1.0 if equivalent, else 0.0.

    math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are disabled here
    (``parsing_timeout=None``, ``timeout_seconds=None``); the
    :class:`~credo.rewards.runner.RewardRunner` enforces the time limit instead.
    """
    parse, verify = _load_math_verify()
    gold = parse(_gold_text(example.answer), parsing_timeout=None)
    if not gold:
        raise ValueError(f"could not parse gold answer {example.answer[:100]!r}")
    pred = parse(response, parsing_timeout=None)
    ok = bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
    info = {"pred": str(pred[-1])[:200] if pred else ""}
    return RewardResult(score=1.0 if ok else 0.0, correct=ok, info=info)


# Called once by each reward worker process before it reports ready, so the slow sympy import
# does not count against the first item's timeout.
math_verifier.warmup = _load_math_verify  # type: ignore[attr-defined]
