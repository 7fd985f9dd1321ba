"""Per-position statistics of a categorical distribution given by logits.

    logprob_t = log softmax(z_t)[y_t]
    entropy_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_{t,v}

``z`` are the temperature-scaled logits. Computation is in float32 (or float64 if given).
"""
from __future__ import annotations

import torch


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-prob of ``labels`` under ``softmax(logits)``: (B, T, V), (B, T) -> (B, T)."""
    logits = _upcast(logits)
    return logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` per position: (B, T, V) -> (B, T)."""
    logits = _upcast(logits)
    probs = logits.softmax(-1)
    return torch.logsumexp(logits, -1) - (probs * logits).sum(-1)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()
