"""DVPO's distributional critic: per-token loss terms and distributional GAE (docs/algorithms/dvpo.md).

N heads x M quantiles, tau_j = j / M (j = 1..M); q = (1/N) sum_h q^(h) is the head mean; y are the quantile
targets (``distributional_gae``'s q + A). Sources: arXiv 2512.03847 (Eqs. 2-11) and the unofficial port
``Reachariramanan/verl-recipe`` @e69d8d7 ``dvpo/dvpo_core_algos.py`` (its pure tensor functions).

Readings implemented (each documented in ``docs/algorithms/dvpo.md``):
- **Per token.** The paper's and port's "per batch element b" is a state; in credo every response token is a
  state, so every term returns a (B, T) per-token loss, and the caller aggregates it over ``response_mask``
  with credo's aggregation (the loss is then invariant to micro-batching). Means over i, j are per token.
- **Eq. 4 [derived].** The port multiplies w_j = exp(-gamma_r (1 - tau_j)) into an already-averaged QR loss,
  which is mean(w) * L_QR (``risk_weighting="scalar"``). credo's default (``"per_quantile"``) weights the
  predicted quantile i's terms by w_i inside the QR mean; ``"none"`` is plain L_QR. w grows with tau
  (w_1 ~ e^-gamma_r, w_M = 1), so the lower quantiles get the smaller weight.
- **Tails.** The lower tail is the first k_low = max(1, floor(alpha M)) quantiles, the upper tail the last
  k_high = max(1, floor(beta M)), in quantile-index (tau) order for both q and y (no sorting). Eq. 9 takes
  second differences inside each tail (``tail_curvature="in_tail"``); ``"whole_axis"`` is the port's: over the
  whole axis, then the first max(1, floor(alpha (M - 2))) and last max(1, floor(beta (M - 2))) of them.
- **Tail guards.** Eq. 8 uses the unbiased variance, NaN for a 1-quantile tail: it raises ValueError when a
  tail has < 2 quantiles; Eq. 9 needs >= 3 quantiles per tail; Eq. 10 needs >= 2 heads.
  ``dvpo_critic_terms`` computes only terms with a nonzero weight, so a zero weight switches a guard off.
- **Targets are constants**: every term detaches ``targets``, so gradients reach only the predicted quantiles.
- q is the head mean everywhere except the consistency term (Eq. 10), which takes the heads.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from credo.algo.advantages.common import compute_dtype, token_rewards
from credo.algo.advantages.returns import gae

DVPO_TERMS: dict[str, float] = {"qr": 1.0, "cvar": 1.0, "upper": 1.0, "mean_shift": 1.0, "tail_shape": 1.0,
                                "curvature": 1.0, "consistency": 1.0}  # Eq. 11 weights; 0 switches a term off
RISK_WEIGHTINGS = ("per_quantile", "scalar", "none")


def quantile_levels(m: int, *, device: torch.device | None = None, dtype: torch.dtype = torch.float32
                    ) -> torch.Tensor:
    """tau_j = j / M for j = 1..M, shape (M,) (the port's ``linspace(1/M, 1, M)``)."""
    return torch.arange(1, m + 1, device=device, dtype=dtype) / m


def tail_size(fraction: float, m: int) -> int:
    """max(1, floor(fraction * M)); the 1e-9 absorbs round-off (0.57 * 100 = 56.99999...)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"DVPO tail fraction must be in (0, 1], got {fraction}")
    return max(1, math.floor(fraction * m + 1e-9))


def quantile_huber_loss(quantiles: torch.Tensor, targets: torch.Tensor, *, kappa: float = 1.0,
                        risk_weighting: str = "per_quantile", risk_gamma: float = 1.0) -> torch.Tensor:
    """Eqs. 3-4, QR-Huber with risk weighting, per token (B, T).

    u_ij = y_j - q_i; rho(u) = u^2 / 2 if |u| <= kappa else kappa (|u| - kappa / 2);
    L_QR = mean_{i,j} |tau_i - 1[u_ij < 0]| rho(u_ij); w_i = exp(-risk_gamma (1 - tau_i)).
    "per_quantile": mean_{i,j} w_i |tau_i - 1[u_ij < 0]| rho(u_ij); "scalar": mean(w) L_QR (the port);
    "none": L_QR.
    """
    if risk_weighting not in RISK_WEIGHTINGS:
        raise ValueError(f"risk_weighting must be one of {RISK_WEIGHTINGS}, got {risk_weighting!r}")
    tau = quantile_levels(quantiles.shape[-1], device=quantiles.device, dtype=quantiles.dtype)  # (M,)
    u = targets.detach().unsqueeze(-2) - quantiles.unsqueeze(-1)  # (B, T, M_i, M_j)
    abs_u = u.abs()
    huber = torch.where(abs_u <= kappa, 0.5 * u.square(), kappa * (abs_u - 0.5 * kappa))  # (B, T, M, M)
    level = (tau.unsqueeze(-1) - (u < 0).to(u.dtype)).abs()  # (B, T, M, M), |tau_i - 1[u_ij < 0]|
    per_i = (level * huber).mean(-1)  # (B, T, M_i)
    if risk_weighting == "none":
        return per_i.mean(-1)
    w = torch.exp(-risk_gamma * (1.0 - tau))  # (M,)
    if risk_weighting == "scalar":
        return w.mean() * per_i.mean(-1)
    return (w * per_i).mean(-1)  # (B, T)


def cvar_loss(quantiles: torch.Tensor, targets: torch.Tensor, *, alpha: float = 0.1) -> torch.Tensor:
    """Eq. 5, lower-tail CVaR, per token (B, T): k = max(1, floor(alpha M));
    (mean(q_{1:k}) - mean(y_{1:k}))^2."""
    k = tail_size(alpha, quantiles.shape[-1])
    return (quantiles[..., :k].mean(-1) - targets.detach()[..., :k].mean(-1)).square()  # (B, T)


def upper_gain_loss(quantiles: torch.Tensor, targets: torch.Tensor, *, beta: float = 0.1) -> torch.Tensor:
    """Eq. 6, upper-tail gain, per token (B, T): k = max(1, floor(beta M));
    (mean(q_{M-k+1:M}) - mean(y_{M-k+1:M}))^2."""
    k = tail_size(beta, quantiles.shape[-1])
    return (quantiles[..., -k:].mean(-1) - targets.detach()[..., -k:].mean(-1)).square()  # (B, T)


def mean_shift_loss(quantiles: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Eq. 7, mean shift, per token (B, T): ReLU(mean_j y_j - mean_j q_j); zero when q is optimistic."""
    return F.relu(targets.detach().mean(-1) - quantiles.mean(-1))  # (B, T)


def _tails(x: torch.Tensor, alpha: float, beta: float, need: int, term: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower tail, upper tail) of x along the quantile axis; ValueError if either has < ``need`` quantiles."""
    m = x.shape[-1]
    k_low, k_high = tail_size(alpha, m), tail_size(beta, m)
    if min(k_low, k_high) < need:
        raise ValueError(f"DVPO {term} needs >= {need} quantiles per tail, got lower {k_low} = floor({alpha} * {m})"
                         f" and upper {k_high} = floor({beta} * {m}); raise M, alpha / beta, or set its weight to 0")
    return x[..., :k_low], x[..., -k_high:]


def tail_shape_loss(quantiles: torch.Tensor, targets: torch.Tensor, *, alpha: float = 0.1, beta: float = 0.1
                    ) -> torch.Tensor:
    """Eq. 8, tail shape, per token (B, T), unbiased variances over each tail:
    ReLU(Var(q_low) - Var(y_low)) + ReLU(Var(y_high) - Var(q_high)) (contract the lower tail, expand the upper).
    Raises ValueError when a tail has < 2 quantiles (the variance would be NaN)."""
    q_low, q_high = _tails(quantiles, alpha, beta, 2, "tail_shape")  # (B, T, k_low), (B, T, k_high)
    y_low, y_high = _tails(targets.detach(), alpha, beta, 2, "tail_shape")
    return F.relu(q_low.var(-1) - y_low.var(-1)) + F.relu(y_high.var(-1) - q_high.var(-1))  # (B, T)


TAIL_CURVATURES = ("in_tail", "whole_axis")


def tail_curvature_loss(quantiles: torch.Tensor, *, alpha: float = 0.1, beta: float = 0.1,
                        tail_curvature: str = "in_tail") -> torch.Tensor:
    """Eq. 9, tail curvature, per token (B, T): ReLU(mean D2 q_low) + ReLU(-mean D2 q_high) with
    D2 x_j = x_{j+2} - 2 x_{j+1} + x_j.

    ``in_tail`` (default): D2 inside each tail of floor(alpha M) / floor(beta M) quantiles; raises ValueError
    when a tail has < 3 quantiles. ``whole_axis`` (the port's ``tail_curvature_loss``): D2 over the whole quantile
    axis (M - 2 values), then its first max(1, floor(alpha (M - 2))) and last max(1, floor(beta (M - 2))); needs
    M >= 3."""
    if tail_curvature not in TAIL_CURVATURES:
        raise ValueError(f"DVPO tail_curvature must be one of {', '.join(TAIL_CURVATURES)}, got {tail_curvature!r}")
    if tail_curvature == "whole_axis":
        m = quantiles.shape[-1]
        if m < 3:
            raise ValueError(f"DVPO curvature needs >= 3 quantiles, got {m}; set its weight to 0")
        d2 = quantiles[..., 2:] - 2 * quantiles[..., 1:-1] + quantiles[..., :-2]  # (B, T, M - 2)
        k_low, k_high = tail_size(alpha, m - 2), tail_size(beta, m - 2)
        return F.relu(d2[..., :k_low].mean(-1)) + F.relu(-d2[..., -k_high:].mean(-1))  # (B, T)
    q_low, q_high = _tails(quantiles, alpha, beta, 3, "curvature")  # (B, T, k_low), (B, T, k_high)
    d2_low = q_low[..., 2:] - 2 * q_low[..., 1:-1] + q_low[..., :-2]  # (B, T, k_low - 2)
    d2_high = q_high[..., 2:] - 2 * q_high[..., 1:-1] + q_high[..., :-2]  # (B, T, k_high - 2)
    return F.relu(d2_low.mean(-1)) + F.relu(-d2_high.mean(-1))  # (B, T)


def consistency_loss(head_quantiles: torch.Tensor) -> torch.Tensor:
    """Eq. 10, head consistency, per token (B, T): mean over head pairs h < h' of sum_j (q^(h)_j - q^(h')_j)^2.
    ``head_quantiles`` is (B, T, N, M); raises ValueError for N < 2 (no pairs)."""
    n = head_quantiles.shape[-2]
    if n < 2:
        raise ValueError(f"DVPO consistency needs >= 2 heads, got {n}; set its weight to 0")
    first, second = torch.triu_indices(n, n, offset=1, device=head_quantiles.device)  # (P,), (P,)
    diff = head_quantiles[..., first, :] - head_quantiles[..., second, :]  # (B, T, P, M)
    return diff.square().sum(-1).mean(-1)  # (B, T)


def dvpo_critic_terms(
    head_quantiles: torch.Tensor,  # (B, T, N, M) per-head predicted quantiles
    targets: torch.Tensor,  # (B, T, M) quantile targets (treated as constants)
    *,
    weights: dict[str, float] | None = None,
    risk_weighting: str = "per_quantile",
    kappa: float = 1.0,
    risk_gamma: float = 1.0,
    alpha: float = 0.1,
    beta: float = 0.1,
    tail_curvature: str = "in_tail",
) -> dict[str, torch.Tensor]:
    """Eq. 11: the weighted per-token terms {name: weight * term (B, T)}; the caller sums and aggregates them.

    ``weights`` overrides entries of :data:`DVPO_TERMS` (all 1.0); a term with weight 0 is neither computed
    nor returned (its guard is off too). q = the head mean for every term but ``consistency``.
    """
    w = dict(DVPO_TERMS)
    unknown = set(weights or {}) - set(w)
    if unknown:
        raise ValueError(f"unknown DVPO term(s) {sorted(unknown)}; terms: {', '.join(DVPO_TERMS)}")
    w.update(weights or {})
    q = head_quantiles.mean(-2)  # (B, T, M)
    compute = {
        "qr": lambda: quantile_huber_loss(q, targets, kappa=kappa, risk_weighting=risk_weighting,
                                          risk_gamma=risk_gamma),
        "cvar": lambda: cvar_loss(q, targets, alpha=alpha),
        "upper": lambda: upper_gain_loss(q, targets, beta=beta),
        "mean_shift": lambda: mean_shift_loss(q, targets),
        "tail_shape": lambda: tail_shape_loss(q, targets, alpha=alpha, beta=beta),
        "curvature": lambda: tail_curvature_loss(q, alpha=alpha, beta=beta, tail_curvature=tail_curvature),
        "consistency": lambda: consistency_loss(head_quantiles),
    }
    return {name: w[name] * fn() for name, fn in compute.items() if w[name] != 0}


def distributional_gae(rewards: torch.Tensor, value_quantiles: torch.Tensor, response_mask: torch.Tensor, *,
                       gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2, (advantages, targets), both (B, T, M), unwhitened, zero outside the mask.

    Per quantile j: delta_{t,j} = r_t + gamma q_{t+1,j} - q_{t,j}, A_{t,j} = delta_{t,j} + gamma lam A_{t+1,j};
    targets = q + A. Runs credo's scalar :func:`gae` with the quantile axis folded into the batch axis, so
    reward placement ((B,) score on the last loss token, or (B, T) token rewards) and masked (tool / padding)
    positions behave exactly as in scalar GAE: transparent, terminal value 0. The actor's advantage is mean_j A.
    Keeps the inputs' floating dtype (float64 quantiles give float64 targets).
    """
    b, t_len, m = value_quantiles.shape
    dtype = compute_dtype(rewards, value_quantiles)
    r = token_rewards(rewards, response_mask).to(dtype)  # (B, T)
    r_fold = r.unsqueeze(1).expand(b, m, t_len).reshape(b * m, t_len)  # (B M, T), row b M + j
    mask_fold = response_mask.to(dtype).unsqueeze(1).expand(b, m, t_len).reshape(b * m, t_len)  # (B M, T)
    v_fold = value_quantiles.detach().to(dtype).permute(0, 2, 1).reshape(b * m, t_len)  # (B M, T)
    adv, targets = gae(r_fold, v_fold, mask_fold, gamma=gamma, lam=lam)  # (B M, T) each
    return _unfold(adv, b, m), _unfold(targets, b, m)  # (B, T, M) each


def _unfold(x: torch.Tensor, b: int, m: int) -> torch.Tensor:
    """(B M, T) with row b M + j -> (B, T, M)."""
    return x.reshape(b, m, x.shape[-1]).permute(0, 2, 1).contiguous()
