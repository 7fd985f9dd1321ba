"""Pieces shared by the policy losses."""
from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0


def log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, clamp: float | None = LOG_RATIO_CLAMP) -> torch.Tensor:
    """delta = logprobs - old_logprobs, clamped to [-clamp, clamp] before any exp (verl convention)."""
    delta = logprobs - old_logprobs  # (B, T)
    return delta.clamp(-clamp, clamp) if clamp is not None else delta


def grad_carrier(x: torch.Tensor) -> torch.Tensor:
    """x / sg(x): value 1, gradient d(log x). Multiplying a constant by it gives a constant-weight gradient."""
    return x / x.detach()


def log_carrier(delta: torch.Tensor) -> torch.Tensor:
    """exp(delta - sg(delta)): value exactly 1, gradient 1 w.r.t. logprobs (the r / sg(r) trick, overflow-free)."""
    return (delta - delta.detach()).exp()


def indicator(cond: torch.Tensor) -> torch.Tensor:
    return cond.to(torch.get_default_dtype())
