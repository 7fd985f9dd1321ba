"""Misbehaving and well-behaved verifiers for the RewardRunner tests.

Referenced from tests as ``"tests.reward_fixtures:<name>"`` so that spawned workers import them.
"""
from __future__ import annotations

import os
import sys
import time

from credo.rewards import register_reward
from credo.types import Example, RewardResult


def normal(response: str, example: Example, **_: object) -> RewardResult:
    """1.0 iff the response equals the answer; echoes the response in info."""
    ok = response == example.answer
    return RewardResult(score=1.0 if ok else 0.0, correct=ok, info={"echo": response})


def hang(response: str, example: Example, **_: object) -> float:
    """Sleeps 30 s (far past any test timeout)."""
    time.sleep(30)
    return 1.0


def raises(response: str, example: Example, **_: object) -> float:
    raise ValueError("bad verifier " + "x" * 1000)


def exits(response: str, example: Example, **_: object) -> float:
    """Kills the worker process outright, as a segfault would."""
    os._exit(3)


def unpicklable(response: str, example: Example, **_: object) -> RewardResult:
    """Returns an info dict that cannot be sent back from a worker process."""
    return RewardResult(score=1.0, info={"fn": lambda: 0})


def by_response(response: str, example: Example, **kwargs: object) -> RewardResult | float:
    """Behaviour chosen by the response: "hang", "raise", "exit", "bad_type", else :func:`normal`."""
    actions = {"hang": hang, "raise": raises, "exit": exits, "bad_type": lambda *a, **k: "nope"}
    return actions.get(response, normal)(response, example, **kwargs)


def modules_loaded(response: str, example: Example, **kwargs: object) -> RewardResult:
    """Reports heavy modules present in the worker and the kwargs it received."""
    heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    return RewardResult(score=1.0, info={"heavy": heavy, "kwargs": dict(kwargs), "pid": os.getpid()})


@register_reward("fixture_shout")
def shout(response: str, example: Example, **_: object) -> bool:
    """Registered by name only: a worker must import this module to find it."""
    return response.upper() == example.answer


def length_score(response: str, example: Example, **_: object) -> float:
    """A dense score (response length / 8, capped at 1) so RL gets non-zero advantages from a random model."""
    return min(len(response), 8) / 8


def slow_length_score(response: str, example: Example, **_: object) -> float:
    """:func:`length_score` after a 20 ms pause, to make a run slow enough to be killed mid-way."""
    time.sleep(0.02)
    return length_score(response, example)


def flaky(response: str, example: Example, **_: object) -> float:
    """Raises on responses of odd length, hangs on length 3, else scores like :func:`length_score`."""
    if len(response) == 3:
        time.sleep(30)
    if len(response) % 2:
        raise RuntimeError("verifier bug")
    return length_score(response, example)


def verl_dict_score(response: str, example: Example, **_: object) -> dict:
    """verl's ``compute_score`` convention: a dict with "score", "acc" and two named components (GDPO's)."""
    length = min(len(response) / 10.0, 1.0)
    fmt = 1.0 if response[:1].isdigit() else 0.0
    return {"score": length + fmt, "acc": response.strip() == example.answer, "length_reward": length,
            "format_reward": fmt}
