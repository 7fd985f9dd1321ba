"""Reward-model losses and CRM's peer selection: pure tensor functions.

Bradley-Terry (pairwise preferences, the ORM / CRM base loss)::

    L_BT = mean_i  w_i * -log sigma(r(x_i, y_w) - r(x_i, y_l) - m)

Pointwise (verified labels y in {0, 1}): binary cross-entropy on the score as a logit.

CRM, "Two Minds Better Than One" (arXiv 2505.10597; docs/reward_models.md) [paper, secondary; derived reading]: two
reward models trained
side by side; on each mini-batch each model's margins ``r(y_w) - r(y_l)`` select the pairs its *peer* trains on
(:func:`peer_select`: the top ``keep_ratio`` fraction by margin, likely clean); the kept fraction follows
:func:`keep_ratio_schedule` (co-teaching's schedule, linear from 1 to ``final`` over the first ``warmup`` share of
training: the selection ratio and its schedule are unspecified in the paper); the curriculum orders pairs easy to
hard by the two models' mean margin (:func:`curriculum_order`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, *, margin: float = 0.0,
                       weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics). ``chosen``, ``rejected``: (B,) scores of the preferred and the other response; ``weights``
    (B,) per-pair weights (a 0 leaves a pair out; the mean is over the weights' sum)."""
    diff = chosen - rejected - margin  # (B,)
    per_pair = F.softplus(-diff)  # -log sigma(diff), stable
    w = torch.ones_like(per_pair) if weights is None else weights.to(per_pair.dtype)
    loss = (per_pair * w).sum() / w.sum().clamp(min=1e-12)
    with torch.no_grad():
        metrics = {"rm/accuracy": float((chosen > rejected).float().mean()),
                   "rm/margin": float((chosen - rejected).mean())}
    return loss, metrics


def pointwise_loss(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics): BCE of ``scores`` (B,) as logits against ``labels`` (B,) in {0, 1}."""
    loss = F.binary_cross_entropy_with_logits(scores, labels.to(scores.dtype))
    with torch.no_grad():
        acc = float(((scores > 0) == (labels > 0.5)).float().mean())
    return loss, {"rm/accuracy": acc}


def peer_select(margins: torch.Tensor, keep_ratio: float) -> torch.Tensor:
    """(B,) bool: the ``ceil(keep_ratio * B)`` pairs with the largest margins (ties: the earlier pair)."""
    b = margins.shape[0]
    k = min(b, max(1, math.ceil(keep_ratio * b)))
    order = torch.argsort(-margins.detach().float(), stable=True)
    keep = torch.zeros(b, dtype=torch.bool, device=margins.device)
    keep[order[:k]] = True
    return keep


def keep_ratio_schedule(step: int, total_steps: int, *, final: float, warmup: float) -> float:
    """Fraction of each mini-batch kept for the peer at ``step`` (0-based): 1.0 at the start, linearly down to
    ``final`` by ``warmup * total_steps``, then ``final``."""
    span = max(1.0, warmup * total_steps)
    return 1.0 - (1.0 - final) * min(step / span, 1.0)


def curriculum_order(margins_a: torch.Tensor, margins_b: torch.Tensor) -> torch.Tensor:
    """(N,) indices of the pairs easy to hard: descending mean margin of the two models."""
    return torch.argsort(-(margins_a + margins_b).float(), stable=True)
