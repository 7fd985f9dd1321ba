"""Grounding sensitivity and VEPO token selection (docs/algorithms/vepo.md, paper only, [derived]).

The policy is run twice on the same response tokens: with the grounding input intact (next-token
distribution p_t) and with it perturbed (q_t). Per response position t, with natural logarithms:

    m_t     = (p_t + q_t) / 2
    JSD_t   = 1/2 KL(p_t || m_t) + 1/2 KL(q_t || m_t)                 in [0, ln 2]
    gap_t   = H(q_t) - H(p_t)                                          entropy gap (perturbed - intact)
    Vis_t   = w_jsd * n(JSD)_t + w_gap * n(max(gap, 0))_t              grounding ("visual") sensitivity
    score_t = Vis_t * H(p_t)                                           multiplicative coupling with entropy
    select  = the top ceil(fraction * n) valid tokens by score_t (per batch, or per sequence)

``n(x)`` is the identity (``normalize="none"``) or ``x`` divided by its mean over the valid tokens of the
batch (``"batch"``) or of each sequence (``"sequence"``), so both terms are on a common scale before they
are weighted. The combination, the clip of the gap at 0 (a perturbation that makes the policy *more* certain
is no evidence of reliance on the grounding), the normalisation and the selection size are credo's reading:
the paper leaves all of them open.

Two forms: from full logits ``(B, T, V)`` (:func:`jsd_from_logits`, :func:`entropy_gap_from_logits`), and
chunked from hidden states (:func:`chunked_grounding_stats`), which holds one ``(chunk, V)`` block of each
distribution at a time instead of two ``(N, V)`` logit tensors.
"""
from __future__ import annotations

import math

import torch

from credo.algo.chunked import _chunk_logits, auto_chunk_size
from credo.algo.logprobs import entropy_from_logits

NORMALIZE = ("none", "batch", "sequence")
SCOPES = ("batch", "sequence")


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return logits.to(dtype).log_softmax(-1)


def jsd_from_logits(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence (nats) between softmax(logits_p) and softmax(logits_q) per position:
    (..., V) x2 -> (...).  JSD = 1/2 sum_v p (log p - log m) + 1/2 sum_v q (log q - log m), m = (p + q) / 2."""
    logp, logq = _log_softmax(logits_p), _log_softmax(logits_q)  # (..., V)
    logm = torch.logaddexp(logp, logq) - math.log(2.0)  # log((p + q) / 2), stable
    p, q = logp.exp(), logq.exp()
    # 0 * log 0 terms: p = 0 gives p * (-inf - logm) = nan; xlogy-style zeroing
    kl_p = torch.where(p > 0, p * (logp - logm), torch.zeros_like(p)).sum(-1)  # (...)
    kl_q = torch.where(q > 0, q * (logq - logm), torch.zeros_like(q)).sum(-1)  # (...)
    return (0.5 * (kl_p + kl_q)).clamp(min=0.0)


def entropy_gap_from_logits(logits_intact: torch.Tensor, logits_perturbed: torch.Tensor) -> torch.Tensor:
    """H(softmax(logits_perturbed)) - H(softmax(logits_intact)) per position: (..., V) x2 -> (...)."""
    return entropy_from_logits(logits_perturbed) - entropy_from_logits(logits_intact)


@torch.no_grad()
def chunked_grounding_stats(
    hidden_intact: torch.Tensor,  # (N, H)
    hidden_perturbed: torch.Tensor,  # (N, H), the same N response positions
    weight: torch.Tensor,  # (V, H) output projection
    *,
    bias: torch.Tensor | None = None,  # (V,)
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> dict[str, torch.Tensor]:
    """``{"jsd", "entropy", "entropy_perturbed"}``, each (N,), from the two forwards' final hidden states,
    computing the logits ``(W h + b) / temperature`` ``chunk_size`` rows at a time (peak O(chunk_size * V))."""
    if hidden_intact.shape != hidden_perturbed.shape or hidden_intact.dim() != 2:
        raise ValueError(f"expected two (N, H) hidden-state tensors of one shape, got "
                         f"{tuple(hidden_intact.shape)} and {tuple(hidden_perturbed.shape)}")
    chunk_size = auto_chunk_size(weight.shape[0]) if chunk_size is None else chunk_size
    out: dict[str, list[torch.Tensor]] = {"jsd": [], "entropy": [], "entropy_perturbed": []}
    for s in range(0, hidden_intact.shape[0], chunk_size):
        zp = _chunk_logits(hidden_intact[s : s + chunk_size], weight, bias, temperature)  # (n_c, V)
        zq = _chunk_logits(hidden_perturbed[s : s + chunk_size], weight, bias, temperature)  # (n_c, V)
        out["jsd"].append(jsd_from_logits(zp, zq))
        out["entropy"].append(entropy_from_logits(zp))
        out["entropy_perturbed"].append(entropy_from_logits(zq))
    dtype = torch.float64 if hidden_intact.dtype == torch.float64 else torch.float32
    empty = hidden_intact.new_zeros(0, dtype=dtype)
    return {k: (torch.cat(v) if v else empty) for k, v in out.items()}


def masked_scope_mean(x: torch.Tensor, mask: torch.Tensor, scope: str) -> torch.Tensor:
    """Mean of ``x`` over the True entries of ``mask`` (B, T): a scalar (``"batch"``) or (B, 1) (``"sequence"``);
    0 where there is no valid entry."""
    m = mask.to(x.dtype)
    if scope == "batch":
        return (x * m).sum() / m.sum().clamp(min=1.0)
    if scope == "sequence":
        return (x * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")


def _normalized(x: torch.Tensor, mask: torch.Tensor, normalize: str, eps: float) -> torch.Tensor:
    if normalize == "none":
        return x
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be one of {NORMALIZE}, got {normalize!r}")
    return x / (masked_scope_mean(x, mask, normalize) + eps)


def grounding_sensitivity(
    jsd: torch.Tensor,  # (B, T)
    gap: torch.Tensor,  # (B, T) H(perturbed) - H(intact)
    mask: torch.Tensor,  # (B, T) valid response tokens
    *,
    jsd_weight: float = 1.0,
    gap_weight: float = 1.0,
    normalize: str = "none",
    eps: float = 1e-8,
) -> torch.Tensor:
    """Vis_t = jsd_weight * n(JSD)_t + gap_weight * n(max(gap, 0))_t, zero outside ``mask``: (B, T).

    ``normalize``: ``"none"`` (both terms in nats), ``"batch"`` or ``"sequence"`` (each term divided by its
    mean over the batch's / the sequence's valid tokens, plus ``eps``)."""
    valid = mask.bool()
    j = _normalized(jsd * valid, valid, normalize, eps)  # (B, T)
    g = _normalized(gap.clamp(min=0.0) * valid, valid, normalize, eps)  # (B, T)
    return (jsd_weight * j + gap_weight * g) * valid


def vepo_scores(vis: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """score_t = Vis_t * H_t on the valid tokens, 0 elsewhere: (B, T) x2 -> (B, T)."""
    return vis * entropy * mask.to(vis.dtype)


def top_fraction_mask(scores: torch.Tensor, mask: torch.Tensor, *, fraction: float,
                      scope: str = "batch") -> torch.Tensor:
    """The ``k = ceil(fraction * n)`` valid tokens with the highest score, bool (B, T).

    ``scope="batch"``: n = the batch's valid tokens, one ranking over all of them; ``"sequence"``: per row,
    n = the row's valid tokens. Exactly k tokens are selected; equal scores are broken by position (earlier row,
    then earlier token first), so the fraction holds exactly up to the rounding of k."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    valid = mask.bool()
    if scope == "batch":
        flat = _top_k_flat(scores.reshape(-1), valid.reshape(-1), fraction)
        return flat.reshape(valid.shape)
    if scope == "sequence":
        return torch.stack([_top_k_flat(s, v, fraction) for s, v in zip(scores, valid)]) if len(valid) else valid
    raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")


def _top_k_flat(scores: torch.Tensor, valid: torch.Tensor, fraction: float) -> torch.Tensor:
    """(N,) scores and valid flags -> (N,) bool, the top ceil(fraction * n_valid) valid entries."""
    n = int(valid.sum())
    k = min(n, math.ceil(fraction * n - 1e-9))
    keep = torch.zeros_like(valid)
    if k <= 0:
        return keep
    ranked = torch.where(valid, scores.double(), torch.tensor(-math.inf, dtype=torch.float64))
    order = torch.sort(ranked, descending=True, stable=True).indices  # ties: lower index first
    keep[order[:k]] = True
    return keep


def score_weights(scores: torch.Tensor, mask: torch.Tensor, *, scope: str = "batch",
                  max_weight: float = 3.0) -> torch.Tensor:
    """Soft credit instead of a hard selection: w_t = clamp(score_t / mean(score), 0, max_weight) over the
    valid tokens of the scope (1 where the mean is 0), 0 outside ``mask``: (B, T)."""
    valid = mask.bool()
    mean = masked_scope_mean(scores, valid, scope)
    w = torch.where(mean > 0, scores / torch.where(mean > 0, mean, torch.ones_like(mean)), torch.ones_like(scores))
    return w.clamp(0.0, max_weight) * valid
