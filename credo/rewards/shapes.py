"""``shapes``: the verifier of the synthetic visual question task :mod:`credo.data.shapes` (an exact match after
stripping, lower-casing and dropping a final ``"."``)."""
from __future__ import annotations

from typing import Any

from credo.rewards.registry import register_reward
from credo.types import Example, RewardResult


def normalize_answer(text: str) -> str:
    """Stripped, lower-cased, a final ``"."`` dropped."""
    text = text.strip().lower()
    return text[:-1].rstrip() if text.endswith(".") else text


@register_reward("shapes", inline_safe=True)
def shapes_match(response: str, example: Example, **_: Any) -> RewardResult:
    """Score 1.0 iff the normalised response equals the normalised answer (:func:`normalize_answer`)."""
    ok = normalize_answer(response) == normalize_answer(example.answer)
    return RewardResult(score=1.0 if ok else 0.0, correct=ok)
