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


def entropy_direction_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """D_t = S_k - C, the first-order entropy response to reinforcing the sampled token (B, T, V) -> (B, T).

    With pi = softmax(z), H its entropy and k the sampled token, a logit step dz = eta A (e_k - pi)
    changes the entropy by dH ~= -eta A (S_k - C), where S_k = pi_k (log pi_k + H) and
    C = sum_j pi_j^2 (log pi_j + H) = E_{j~pi}[S_j] (docs/algorithms/papo.md, [derived]).
    The entropy polarity of a token with advantage A is P = -A D: P > 0 predicts entropy expansion.
    """
    logits = _upcast(logits)
    logp = logits.log_softmax(-1)  # (B, T, V)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)  # (B, T)
    logp_k = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    s_k = logp_k.exp() * (logp_k + entropy)
    c = (p.square() * (logp + entropy.unsqueeze(-1))).sum(-1)
    return s_k - c


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum_v pi(v)^2 = exp(logsumexp(2 z) - 2 logsumexp(z)) of pi = softmax(z), (..., V) -> (...): the collision
    probability the Optimal Token Baseline's per-token energy 1 - 2 pi_k + sum pi^2 needs (verl
    ``calculate_sum_pi_squared``)."""
    logits = _upcast(logits)
    return (torch.logsumexp(2 * logits, -1) - 2 * torch.logsumexp(logits, -1)).exp()


# Per-position statistics of the full next-token distribution that a no-grad pass can return:
# name -> fn(logits (N, V) or (B, T, V), labels) -> (N,) or (B, T).
TOKEN_STATS = {
    "entropy": lambda logits, labels: entropy_from_logits(logits),
    "entropy_direction": entropy_direction_from_logits,
    "sum_pi_squared": lambda logits, labels: sum_pi_squared_from_logits(logits),
}


def check_token_stats(stats: tuple[str, ...]) -> None:
    unknown = set(stats) - set(TOKEN_STATS)
    if unknown:
        raise ValueError(f"unknown token statistics {sorted(unknown)}; available: {tuple(TOKEN_STATS)}")


def token_stats_from_logits(logits: torch.Tensor, labels: torch.Tensor,
                            stats: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The requested ``TOKEN_STATS`` of ``softmax(logits)``; an unknown name is a ValueError."""
    check_token_stats(stats)
    return {name: TOKEN_STATS[name](logits, labels) for name in stats}
