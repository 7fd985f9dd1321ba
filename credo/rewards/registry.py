"""Registry of reward verifiers, looked up by name.

A verifier is a plain function

    fn(response: str, example: Example, **kwargs) -> RewardResult | float | bool

registered under a short name with :func:`register_reward`. Besides registered names,
:func:`get_reward_fn` accepts ``"package.module:function"`` import paths, so a user can plug in a
verifier without touching this package; the same string works in a freshly spawned worker process.

This module does not import torch (reward worker processes must start fast).
"""
from __future__ import annotations

import importlib
import numbers
from typing import Any, Callable, Union

from credo.registry import Registry, UnknownName
from credo.types import RewardResult

VerifierOutput = Union[RewardResult, float, int, bool]
VerifierFn = Callable[..., VerifierOutput]

# The built-in verifiers' modules are named, not imported here: the registry sits below them (the agentic verifier,
# a method package, builds an engine and runs an agent loop), so they are imported on the first lookup or listing.
REWARDS: Registry[VerifierFn] = Registry("reward", builtins=(
    "credo.rewards.verifiers", "credo.rewards.code", "credo.rewards.reward_model",
    "credo.methods.agentic_verifier.reward", "credo.rewards.rg_score", "credo.rewards.humaneval",
    "credo.rewards.shapes"))


def register_reward(name: str, *, batch: bool = False, inline_safe: bool = False) -> Callable[[VerifierFn], VerifierFn]:
    """Decorator registering a verifier under ``name``; returns the function unchanged.

    ``inline_safe=True`` declares a verifier that cannot hang or take long (a bounded string comparison, no
    parser of arbitrary expressions, no third-party code): the runner's ``"auto"`` executor calls it in the
    calling process instead of sending each item to a worker process.

    ``batch=True`` marks a verifier that scores a whole batch at once,
    ``fn(responses, examples, **kwargs) -> list[RewardResult]``, and enforces its own isolation and
    time limits (the code rewards: they send the batch to the sandbox pool). :class:`RewardRunner`
    calls it in the calling process.

    Registering a *different* function under a name already taken raises ``ValueError``;
    re-registering the same definition (e.g. when its module is imported again) is a no-op.
    Names may not contain ``":"``, which marks import paths.
    """
    if not name or ":" in name:
        raise ValueError(f"invalid verifier name {name!r} (must be non-empty and contain no ':')")

    def decorator(fn: VerifierFn) -> VerifierFn:
        REWARDS.refuse_taken(name, fn)
        fn.credo_batch = batch
        fn.credo_inline_safe = inline_safe
        return REWARDS.add(name, fn)

    return decorator


def list_rewards() -> list[str]:
    """Sorted names of all registered verifiers (built-ins included)."""
    return REWARDS.names()


def _import_path(path: str) -> VerifierFn:
    """Resolve ``"package.module:function"`` (the attribute part may be dotted)."""
    module_name, _, attr_path = path.partition(":")
    if not module_name or not attr_path:
        raise KeyError(f"invalid import path {path!r}; expected 'package.module:function'")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise KeyError(f"{module_name!r} has no attribute {attr_path!r} (from {path!r})") from None
    if not callable(obj):
        raise TypeError(f"{path!r} resolved to a non-callable {type(obj).__name__}")
    return obj


def get_reward_fn(name: str) -> VerifierFn:
    """Return the verifier registered as ``name``, or import it from ``"package.module:function"``.

    An unknown name raises ``KeyError`` (:class:`credo.registry.UnknownName`) naming the closest match and the
    registered names. Import errors of a user module propagate unchanged.
    """
    if ":" in name:
        return _import_path(name)
    try:
        return REWARDS.get(name)
    except UnknownName as exc:
        raise UnknownName(f"{exc}; or pass an import path 'package.module:function'") from None


def to_result(value: Any) -> RewardResult:
    """Normalise a verifier's return value to a :class:`RewardResult`.

    ``bool`` -> score 1.0/0.0 with ``correct`` set to the bool; a real number -> that score,
    ``correct = score >= 1.0``; a ``RewardResult`` passes through; a dict with a ``"score"`` (verl's
    ``compute_score`` convention) -> that score, ``correct`` from its ``"acc"`` if present (else score >= 1.0), and
    its other real-valued keys as ``info["components"]`` (what ``algo.advantage=gdpo`` normalises one by one);
    anything else -> ``TypeError``.
    """
    if isinstance(value, RewardResult):
        return value
    if isinstance(value, dict):
        return _dict_result(value)
    if isinstance(value, bool):
        return RewardResult(score=1.0 if value else 0.0, correct=value)
    if isinstance(value, numbers.Real):  # int, float, numpy scalars
        score = float(value)
        return RewardResult(score=score, correct=score >= 1.0)
    raise TypeError(
        f"verifier returned {type(value).__name__}; expected RewardResult, float, int or bool"
    )


def _dict_result(value: dict) -> RewardResult:
    """A verl-style ``{"score": s, "acc": ..., "format_reward": ..., ...}`` as a :class:`RewardResult`."""
    if "score" not in value:
        raise TypeError(f"verifier returned a dict without a 'score' key (keys: {sorted(map(str, value))[:8]})")
    score = value["score"]
    if isinstance(score, bool):
        score = float(score)
    components = {str(k): float(v) for k, v in value.items()
                  if k != "score" and isinstance(v, numbers.Real) and not isinstance(v, bool)}
    correct = bool(value["acc"]) if "acc" in value else (isinstance(score, numbers.Real) and score >= 1.0)
    return RewardResult(score=score, correct=correct, info={"components": components} if components else {})
