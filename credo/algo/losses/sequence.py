"""Sequence-ratio and soft-gate losses: GSPO, GMPO (``geo_mean``), SAPO, CISPO (docs/algorithms/gspo.md,
docs/algorithms/gmpo.md, docs/algorithms/sapo.md, docs/algorithms/cispo.md)."""
from __future__ import annotations

import torch

from credo.algo.losses.common import log_ratio
from credo.algo.registry import TokenLoss, register_policy_loss


WEIGHT_REDUCES = ("token", "sequence")


def _seq_len(response_mask: torch.Tensor) -> torch.Tensor:
    return response_mask.sum(-1).clamp(min=1.0)  # (B,)


def geometric_mean_weights(token_weights: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) every token of row i gets exp(sum_t m log(w_it + 1e-10) / |y_i|), the geometric mean of the row's
    weights (verl ``geo_mean``'s reduction of token-level rollout-correction weights; 1e-10 as verl's)."""
    log_w = (token_weights + 1e-10).log() * response_mask  # (B, T)
    return (log_w.sum(-1) / _seq_len(response_mask)).exp().unsqueeze(-1).expand_as(token_weights)


@register_policy_loss("gspo", forced_agg="seq-mean-token-mean", zero_adv_inert=True)
def gspo_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,  # (B, T) detached rollout-correction weights
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    weight_reduce: str = "token",
) -> TokenLoss:
    """GSPO (verl ``gspo``): sequence-level ratio with per-token gradients.

    s_i = sum_t m delta / |y_i|  (delta not clamped);  rho_it = exp(min(sg[s_i] + logprobs - sg[logprobs], 10))
    L = max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high)); aggregation forced to seq-mean-token-mean.
    Weight: exp(s_i) on the unclipped side, 0 on the clipped side. Defaults 3e-4 / 4e-4 are the GSPO
    paper's clip ranges (Section 5.1 of its v2).
    Rollout-correction weights w (``token_weights``): ``weight_reduce="token"`` (default, verl) multiplies each
    token's loss by its own w_it; ``"sequence"`` multiplies every token of row i by the geometric mean
    exp(sum_t m log(w + 1e-10) / |y_i|), the sequence-level reduction that matches GSPO's geometric-mean ratio.
    See docs/algorithms/gspo.md.
    """
    if weight_reduce not in WEIGHT_REDUCES:
        raise ValueError(f"gspo weight_reduce must be one of {', '.join(WEIGHT_REDUCES)}, got {weight_reduce!r}")
    delta = logprobs - old_logprobs  # (B, T)
    seq_log_ratio = (delta * response_mask).sum(-1) / _seq_len(response_mask)  # (B,)
    exponent = seq_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()  # (B, T)
    rho = exponent.clamp(max=10.0).exp()
    pg1 = -advantages * rho
    pg2 = -advantages * rho.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(pg1, pg2)
    if token_weights is not None:
        w = token_weights if weight_reduce == "token" else geometric_mean_weights(token_weights, response_mask)
        loss = loss * w
    seq_kl = (-seq_log_ratio.detach()).unsqueeze(-1).expand_as(delta)
    metrics = {"pg_clipfrac": (pg2 > pg1).float(), "pg_clipfrac_lower": torch.zeros_like(delta),
               "ppo_kl": seq_kl, "ratio": rho.detach()}
    return TokenLoss(loss=loss, token_metrics=metrics)


@register_policy_loss("gmpo", forced_agg="seq-mean-token-sum", zero_adv_inert=True)
def gmpo_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,  # (B, T) detached rollout-correction weights
    clip_low: float = 0.4,
    clip_high: float = 0.4,
) -> TokenLoss:
    """GMPO (verl ``geo_mean``): geometric-mean sequence ratio, clipped per token in log space.

    d~ = sgn(A) min(sgn(A) delta, sgn(A) clip(delta, -clip_low, clip_high))  (delta not clamped)
    rho_i = exp(sum_t m d~ / |y_i|);  A_i = token-mean of A;  L_i = -A_i rho_i
    The loss is a plain mean of L_i over the sequences (verl ignores loss_agg_mode): credo writes
    L_i / |y_i| on each token and forces seq-mean-token-sum, which is that mean. Defaults 0.4 / 0.4:
    GMPO's clip range (e^-0.4, e^0.4).
    Rollout-correction weights w (``token_weights``) reduce per sequence to their geometric mean
    w_i = exp(sum_t m log(w + 1e-10) / |y_i|) and L_i = -A_i rho_i w_i (verl ``geo_mean``; a per-token product
    would give the arithmetic mean instead).
    Metrics (verl's): pg_clipfrac = delta outside [-clip_low, clip_high] and A > 0; pg_clipfrac_lower = the same
    and A < 0 (whether or not the clip binds in the advantage's direction).
    See docs/algorithms/gmpo.md.
    """
    delta = logprobs - old_logprobs  # (B, T)
    sgn = torch.sign(advantages)
    delta_clip = delta.clamp(-clip_low, clip_high)
    tilde = sgn * torch.minimum(sgn * delta, sgn * delta_clip)  # (B, T)
    seq_len = _seq_len(response_mask)  # (B,)
    rho = ((tilde * response_mask).sum(-1) / seq_len).exp()  # (B,)
    seq_adv = (advantages * response_mask).sum(-1) / seq_len  # (B,)
    seq_loss = -seq_adv * rho  # (B,)
    if token_weights is not None:
        seq_loss = seq_loss * geometric_mean_weights(token_weights, response_mask)[:, 0]
    loss = (seq_loss / seq_len).unsqueeze(-1).expand_as(delta)  # (B, T): sums to L_i over the valid tokens
    clipped = delta_clip != delta  # (B, T) outside [-clip_low, clip_high], binding or not (verl's geo_mean)
    metrics = {"pg_clipfrac": (clipped & (advantages > 0)).float(), "pg_clipfrac_lower": (clipped & (advantages < 0)).float(),
               "ppo_kl": -delta.detach(), "ratio": rho.detach().unsqueeze(-1).expand_as(delta)}
    return TokenLoss(loss=loss, token_metrics=metrics)


@register_policy_loss("sapo", forced_agg="seq-mean-token-mean", zero_adv_inert=True)
def sapo_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> TokenLoss:
    """SAPO (verl ``sapo``): soft sigmoid gate instead of a hard clip.

    f(r) = sigmoid(tau (r - 1)) 4 / tau, tau = tau_pos if A > 0 else tau_neg;  L = -A f(r)
    Weight w = 4 s (1 - s) r with s = sigmoid(tau (r - 1)); f'(1) = 1. Aggregation forced to
    seq-mean-token-mean; clip fractions are 0 by definition.
    See docs/algorithms/sapo.md.
    """
    delta = log_ratio(logprobs, old_logprobs)
    ratio = delta.exp()
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    zeros = torch.zeros_like(ratio)
    metrics = {"pg_clipfrac": zeros, "pg_clipfrac_lower": zeros, "ppo_kl": -delta.detach(), "ratio": ratio.detach()}
    return TokenLoss(loss=-advantages * gate, token_metrics=metrics)


@register_policy_loss("cispo", zero_adv_inert=True)
def cispo_loss(
    *,
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    clip_low: float = 1.0,
    clip_high: float = 4.0,
) -> TokenLoss:
    """CISPO (MiniMax-M1; verl ``cispo``): clipped, detached IS weight on the log-prob.

    L = -sg[clip(r, 1 - clip_low, 1 + clip_high)] A log pi;  w = clip(r, ...), never 0.
    Defaults: no effective lower bound (clip_low 1.0, as MiniMax-M1 did) and an IS-weight cap of
    1 + 4 = 5 (TRL's recommended epsilon_high 5.0). pg_clipfrac = mean 1[r != clip(r)].
    See docs/algorithms/cispo.md.
    """
    delta = log_ratio(logprobs, old_logprobs)
    ratio = delta.exp()
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    metrics = {"pg_clipfrac": (ratio.detach() != weight).float(), "ppo_kl": -delta.detach(), "ratio": ratio.detach()}
    return TokenLoss(loss=-weight * advantages * logprobs, token_metrics=metrics)
