"""KL estimators between the policy and a frozen reference
(docs/algorithms/recipe_pieces.md#kl-against-a-frozen-reference-in-the-loss-or-in-the-reward).

With ``x = logprobs - ref_logprobs`` per token:

    k1 (kl)        x
    abs            |x|
    k2 (mse)       x^2 / 2
    k3 (low_var_kl) u = clamp(ref_logprobs - logprobs, -20, 20);  e^u - u - 1, clamped to [-10, 10]

A ``+`` suffix (``k1+``, ``k3+``) is the straight-through variant: the value of the named estimator
with the gradient of k2, ``sg[fwd] + k2 - sg[k2]``. The suffix is stripped before the estimator is
looked up (verl 0.9.1's ``kl_penalty`` strips it too; verl b178a3cd56f5 passed it through and failed, a
hazard that page notes).
"""
from __future__ import annotations

import torch

_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
KL_ESTIMATORS = ("k1", "abs", "k2", "k3")


def canonical_kl(kind: str) -> tuple[str, bool]:
    """(estimator name, straight_through) for a config string such as ``"k3+"``."""
    straight = kind.endswith("+")
    base = _ALIASES.get(kind.rstrip("+"), kind.rstrip("+"))
    if base not in KL_ESTIMATORS:
        names = ", ".join(KL_ESTIMATORS + tuple(_ALIASES))
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {names} (optionally with a '+' suffix)")
    return base, straight


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate, shape (B, T) like the inputs."""
    base, straight = canonical_kl(kind)
    value = _forward(logprobs, ref_logprobs, base)  # (B, T)
    if not straight:
        return value
    k2 = _forward(logprobs, ref_logprobs, "k2")
    return value.detach() + k2 - k2.detach()


def _forward(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, base: str) -> torch.Tensor:
    x = logprobs - ref_logprobs  # (B, T)
    if base == "k1":
        return x
    if base == "abs":
        return x.abs()
    if base == "k2":
        return 0.5 * x.square()
    u = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (u.exp() - u - 1.0).clamp(-10.0, 10.0)
