"""The credit-assignment inspector (``credo inspect RUN --step N``): replay a dumped rollout batch through
registered losses and estimators and show, per token, the advantage, ratio, gradient weight (autograd on the
registered loss), clip region, entropy, and where the methods disagree.

Modules: :mod:`.replay` (the dump as tensors; log-probs recomputed from checkpoints), :mod:`.methods` (losses and
estimators on it, disagreement counts), :mod:`.regions` (clip-region readings, registrable per loss),
:mod:`.core` (:func:`inspect_run`), :mod:`.page` (HTML and JSON), :mod:`.cli` (the subcommand). docs/inspect.md.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Inspection", "inspect_run", "register_regions"]


def __getattr__(name: str) -> Any:
    """Lazy exports: ``credo --help`` imports :mod:`.cli` without torch."""
    if name in ("Inspection", "inspect_run"):
        from credo.inspect import core

        return getattr(core, name)
    if name == "register_regions":
        from credo.inspect.regions import register_regions

        return register_regions
    raise AttributeError(f"module 'credo.inspect' has no attribute {name!r}")
