"""Reward shaping applied after verification."""
from __future__ import annotations


def overlong_penalty(length: int, *, max_len: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO soft overlong punishment (docs/algorithms/dapo.md): 0 up to ``max_len - buffer`` tokens, then
    falling linearly to ``-factor`` at ``max_len``: min(-(length - (max_len - buffer)) / buffer * factor, 0)."""
    if buffer <= 0:
        return 0.0
    return min(-(length - (max_len - buffer)) / buffer * factor, 0.0)
