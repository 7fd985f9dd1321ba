"""AgentV-RL verdicts (docs/agentic_verifier.md): parsing an ``<answer>`` verdict and a correctness label, and the
+1 / -1 / 0 outcome reward. Pure; shared by the ``agentic_verifier`` reward and the ``verify`` environment."""
from __future__ import annotations

from typing import Any

_TRUE = ("true", "True")
_FALSE = ("false", "False")


def parse_verdict(text: str | None) -> bool | None:
    """The verdict inside an ``<answer>`` tag: ``true``/``True`` -> True, ``false``/``False`` -> False, else None
    (the reference's ``parse_bool_choice``: exact words after stripping whitespace)."""
    if text is None:
        return None
    s = str(text).strip()
    return True if s in _TRUE else False if s in _FALSE else None


def parse_label(label: Any) -> bool | None:
    """A ground-truth correctness label: a bool, or ``true``/``false`` text; anything else is unknown (None)."""
    if isinstance(label, bool):
        return label
    return parse_verdict(label) if isinstance(label, str) else None


def outcome_reward(answer: str | None, label: Any) -> float:
    """+1 / -1 / 0 of an ``<answer>`` body (None: no answer) against a label, in the reference's order: a missing
    answer is -1 before the label is looked at, an unknown label is 0, an unparseable verdict is wrong (-1)."""
    if answer is None:
        return -1.0
    truth = parse_label(label)
    if truth is None:
        return 0.0
    verdict = parse_verdict(answer)
    return 1.0 if verdict is not None and verdict == truth else -1.0
