"""ScalingInter-RL horizon schedule (docs/agents.md#scalinginter-rl-credocollecthorizonpy).

With horizons [h_0, ..., h_{K-1}] and period N, training step s (1-indexed) uses

    h(s) = h_{min(floor((s - 1) / N), K - 1)}

so steps 1..N use h_0, steps N+1..2N use h_1, and every later step h_{K-1}. credo evaluates the formula at
every step instead of keeping a counter, so a resumed run switches at exactly the same step as an
uninterrupted one (the reference switches one step late after a resume).
"""
from __future__ import annotations


def horizon(step: int, *, schedule: str = "fixed", max_turns: int = 4, rounds: list[int] | tuple[int, ...] = (),
            period: int = 100) -> int:
    """Turn cap for 1-indexed training ``step``: ``fixed`` -> ``max_turns``; ``stepwise`` -> the formula above."""
    if schedule == "fixed":
        return max_turns
    if schedule != "stepwise":
        raise ValueError(f"horizon schedule must be 'fixed' or 'stepwise', got {schedule!r}")
    if not rounds or period < 1 or step < 1:
        raise ValueError("stepwise horizon needs non-empty rounds, period >= 1 and 1-indexed steps")
    return int(rounds[min((step - 1) // period, len(rounds) - 1)])
