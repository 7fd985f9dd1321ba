"""Method-blind mechanism diagnostics (``log.mechanism``): where a policy loss sends its gradient and how far the
policy moves, by clip region, entropy and probability, the same measure for every policy loss
(docs/algorithms/README.md, "Mechanism diagnostics").

Every quantity is a pure function of the tensors the update has at hand for one micro-batch: the per-token
gradient of the aggregated policy loss with respect to the log-probs (``grad``, :func:`logprob_grad`), the
current and old log-probs, the advantages, the per-token entropy and the response mask. The trainer logs them
token-weighted over the micro-batches of a step under ``mech/*`` (credo.train.update).

Notation, per loss token t (``valid``):  g_t = dL/dlogprobs_t,  delta_t = logprobs_t - old_logprobs_t,
r_t = exp(delta_t),  A_t the advantage,  p_t = exp(old_logprobs_t) (the probability the token had when sampled).

- The reference window is fixed (:data:`REF_CLIP` = 0.2 on both sides), whatever the loss's own clip range, so that
  every method is measured on the same window. ``C`` = tokens outside it on PPO's pessimistic side:
  (A > 0 and r > 1 + 0.2) or (A < 0 and r < 1 - 0.2). PPO-clip at 0.2 / 0.2 gives them zero gradient.
- High-entropy tokens: above their response's 0.8 quantile of entropy (ties go to low), the split Archer and
  ASPO use (credo.algo.losses.entropy_split.low_entropy_mask); low-entropy: the rest.
- High-probability tokens: p_t >= :data:`HIGH_PROB` (0.9: on the demo task after its warm start, 70-85% of the
  positive-advantage tokens).
"""
from __future__ import annotations

from typing import Callable

import torch

from credo.algo.losses.entropy_split import low_entropy_mask

REF_CLIP = 0.2  # the fixed reference window's half-width (PPO-clip / GRPO's 0.2 / 0.2)
ENTROPY_QUANTILE = 0.8  # the per-response entropy quantile of the high / low split (Archer, ASPO)
HIGH_PROB = 0.9  # a token is high-probability when its sampling-time probability is at least this


def logprob_grad(loss: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """g = dL/dlogprobs (same shape as ``logprobs``), detached: the gradient the loss sends to each token's
    log-prob, taken on the loss's own graph (``retain_graph``, so a later ``backward`` still works; only the part of
    the graph between ``logprobs`` and ``loss`` is walked, never the model). Zeros where ``logprobs`` does not
    reach ``loss`` (or carries no graph)."""
    if not (loss.requires_grad and logprobs.requires_grad):
        return torch.zeros_like(logprobs).detach()
    with torch.enable_grad():
        (g,) = torch.autograd.grad(loss, logprobs, retain_graph=True, allow_unused=True)
    return torch.zeros_like(logprobs).detach() if g is None else g.detach()


def detached_logprob_grad(loss_fn: Callable[[torch.Tensor], torch.Tensor], logprobs: torch.Tensor) -> torch.Tensor:
    """g = d loss_fn(x) / dx at x = a detached copy of ``logprobs``: the same gradient as :func:`logprob_grad` for a
    loss rebuilt from log-probs that have no graph (tests, offline analysis)."""
    x = logprobs.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        return logprob_grad(loss_fn(x), x)


def pessimistic_clip_mask(log_ratio: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
                          clip_low: float = REF_CLIP, clip_high: float = REF_CLIP) -> torch.Tensor:
    """Bool (B, T): C = valid and ((A > 0 and r > 1 + clip_high) or (A < 0 and r < 1 - clip_low)), r = exp(log_ratio):
    the tokens that PPO-clip at this window gives a zero gradient (its pessimistic side)."""
    r = log_ratio.detach().exp()
    outside = ((advantages > 0) & (r > 1.0 + clip_high)) | ((advantages < 0) & (r < 1.0 - clip_low))
    return response_mask.bool() & outside


def grad_share(grad: torch.Tensor, subset: torch.Tensor, within: torch.Tensor) -> float | None:
    """sum_{t in subset and within} |g_t| / sum_{t in within} |g_t|: the share of the gradient magnitude carried by
    ``subset``; None when ``within`` carries no gradient at all."""
    mag = grad.detach().abs().to(torch.float64) * within.bool()
    total = float(mag.sum())
    return None if total == 0.0 else float((mag * subset.bool()).sum()) / total


def subset_mean(x: torch.Tensor, subset: torch.Tensor) -> float | None:
    """Mean of ``x`` over the ``subset`` tokens; None for an empty subset."""
    n = int(subset.bool().sum())
    return None if n == 0 else float((x.detach().to(torch.float64) * subset.bool()).sum()) / n


def mechanism_metrics(*, grad: torch.Tensor, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                      advantages: torch.Tensor, response_mask: torch.Tensor,
                      entropy: torch.Tensor | None = None) -> dict[str, float]:
    """The ``mech/*`` metrics of one micro-batch (module docstring for C, the entropy and probability splits):

    mech/clip_frac              = |C| / |valid|
    mech/grad_share_clipped     = sum_C |g| / sum_valid |g|                  (GPPO, CE-GPPO: > 0; PPO-clip 0.2: 0)
    mech/grad_share_clipped_pos = sum_{C, A>0} |g| / sum_valid |g|           (CE-GPPO's beta2 side)
    mech/grad_share_clipped_neg = sum_{C, A<0} |g| / sum_valid |g|           (CE-GPPO's beta1 side)
    mech/drift                  = mean_valid |delta|
    mech/drift_high_entropy     = mean_{high entropy} |delta|                (Archer: reasoning tokens move)
    mech/drift_low_entropy      = mean_{low entropy} |delta|                 (Archer: knowledge tokens stay)
    mech/grad_share_pos_highprob = sum_{A>0, p>=0.9} |g| / sum_{A>0} |g|     (ASPO: high-probability positive
    mech/drift_pos_highprob     = mean_{A>0, p>=0.9} |delta|                  tokens get less weight, move less)
    mech/pos_highprob_frac      = |{A>0, p>=0.9}| / |{A>0}|

    A key whose denominator is empty (no gradient, no such token) is left out, so that the trainer's token-weighted
    mean over micro-batches only averages the micro-batches that define it. The entropy keys need ``entropy``."""
    valid = response_mask.bool()
    delta = (logprobs.detach() - old_logprobs.detach()).abs()
    clipped = pessimistic_clip_mask(logprobs.detach() - old_logprobs.detach(), advantages, response_mask)
    pos = valid & (advantages > 0)
    pos_high = pos & (old_logprobs.detach().exp() >= HIGH_PROB)
    values: dict[str, float | None] = {
        "mech/clip_frac": subset_mean(clipped.to(torch.float64), valid),
        "mech/grad_share_clipped": grad_share(grad, clipped, valid),
        "mech/grad_share_clipped_pos": grad_share(grad, clipped & (advantages > 0), valid),
        "mech/grad_share_clipped_neg": grad_share(grad, clipped & (advantages < 0), valid),
        "mech/drift": subset_mean(delta, valid),
        "mech/grad_share_pos_highprob": grad_share(grad, pos_high, pos),
        "mech/drift_pos_highprob": subset_mean(delta, pos_high),
        "mech/pos_highprob_frac": subset_mean(pos_high.to(torch.float64), pos),
    }
    if entropy is not None:
        low = low_entropy_mask(entropy, response_mask, ENTROPY_QUANTILE)
        values["mech/drift_high_entropy"] = subset_mean(delta, valid & ~low)
        values["mech/drift_low_entropy"] = subset_mean(delta, low)
    return {k: v for k, v in values.items() if v is not None}
