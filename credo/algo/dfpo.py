"""DFPO's distributional value-flow critic: Euler maps, readouts, targets and per-token loss terms
(docs/algorithms/dfpo.md: a [derived] reading of DFPO, arXiv 2602.05890, through Value Flows' public code
``chongyi-zheng/value-flows`` @0183335 ``agents/value_flows.py`` plus DVPO's tail terms).

Notation: ``v(z, tau)`` is a velocity field over virtual time tau in [0, 1] (the flow head at one state, or several
states at once: every function here broadcasts ``v`` over whatever leading shape ``z`` has); eps ~ N(0, 1) is the
noise at tau = 0 and the return sample is reached at tau = 1. The Euler flow map with N steps of size
Delta = (tau_1 - tau_0) / N is psi(z) = z_N, z_{k+1} = clip(z_k + Delta v(z_k, tau_0 + k Delta)) (``clip`` = the
optional return range, applied to every iterate as the code's ``clip_flow_returns``; the start z_0 is not clipped).

Everything is a pure tensor function; the no-grad target pass (:mod:`credo.train.flow_targets`) and the critic
loss registration (:mod:`credo.algo.critic`, ``critic.loss=dfpo``) compose them.
"""
from __future__ import annotations

from typing import Callable

import torch

from credo.algo.dvpo import tail_size

Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # v(z, tau) -> tensor of z's (broadcast) shape

UNCERTAINTY_WEIGHTS = ("up", "down", "none")
UNCERTAINTY_STDS = ("jacobian", "quantile_std")
JACOBIANS = ("jvp", "autograd", "fd")
AGGREGATES = ("mean", "min")
GEOS = ("none", "velocity", "endpoint")
VALUE_READOUTS = ("euler1_mean", "quantile_mean")


def _clip(z: torch.Tensor, clip: tuple[float, float] | None) -> torch.Tensor:
    return z if clip is None else z.clamp(clip[0], clip[1])


def noise_grid(m: int, *, device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(M,) zeta_j = Phi^{-1}((j - 1/2) / M), j = 1..M: the midpoint quantiles of N(0, 1) (symmetric, mean 0)."""
    if m < 1:
        raise ValueError(f"DFPO noise grid needs M >= 1 points, got {m}")
    levels = (torch.arange(1, m + 1, dtype=torch.float64) - 0.5) / m
    return torch.special.ndtri(levels).to(device=device, dtype=dtype)


def euler_map(v: Velocity, z0: torch.Tensor, *, steps: int, t0: float = 0.0,
              t1: float | torch.Tensor = 1.0, clip: tuple[float, float] | None = None) -> torch.Tensor:
    """psi_{t0 -> t1}(z0) with ``steps`` Euler steps: z_{k+1} = clip(z_k + Delta v(z_k, t0 + k Delta)),
    Delta = (t1 - t0) / N. ``t1`` may be a tensor broadcastable to z0 (per-sample end times, DCFM's tau_k)."""
    if steps < 1:
        raise ValueError(f"DFPO Euler map needs steps >= 1, got {steps}")
    t1 = torch.as_tensor(t1, dtype=z0.dtype, device=z0.device)
    delta = (t1 - t0) / steps
    z = z0
    for k in range(steps):
        tau = torch.zeros_like(z) + (t0 + k * delta)  # z's shape (broadcast with per-sample end times)
        z = _clip(z + delta * v(z, tau), clip)
    return z


def euler_jacobian(v: Velocity, z0: torch.Tensor, *, steps: int, method: str = "jvp",
                   clip: tuple[float, float] | None = None, delta: float = 1e-3) -> torch.Tensor:
    """d psi^{(N)}(z0) / d z0 per element (the head acts element-wise on z, so the Jacobian is diagonal), three ways:

    - ``jvp``: the code's flow-derivative ODE, J_0 = 1, J_{k+1} = c_k (J_k + Delta d_z v(z_k, tau_k) J_k) with
      ``torch.func.jvp`` of v at each step (c_k = 1 where the clip is inactive, 0 where it clamps);
    - ``autograd``: grad of sum(psi(z0)) w.r.t. z0 (valid because each output depends only on its own z0);
    - ``fd``: the central difference (psi(z0 + delta) - psi(z0 - delta)) / (2 delta).
    Runs with gradients enabled internally and returns a detached tensor."""
    if method not in JACOBIANS:
        raise ValueError(f"DFPO jacobian must be one of {', '.join(JACOBIANS)}, got {method!r}")
    z0 = z0.detach().clone()  # dense (an expanded z0 shares memory across the flow axis)
    if method == "fd":
        with torch.no_grad():
            return (euler_map(v, z0 + delta, steps=steps, clip=clip)
                    - euler_map(v, z0 - delta, steps=steps, clip=clip)) / (2 * delta)
    with torch.enable_grad():
        if method == "autograd":
            z = z0.clone().requires_grad_(True)
            out = euler_map(v, z, steps=steps, clip=clip)
            (grad,) = torch.autograd.grad(out.sum(), z)
            return grad.detach()
        step = 1.0 / steps
        z, jac = z0, torch.ones_like(z0)
        for k in range(steps):
            tau = torch.full_like(z, k * step)
            vel, dvel = torch.func.jvp(lambda x: v(x, tau), (z,), (jac,))
            z_new, jac = z + step * vel, jac + step * dvel
            if clip is not None:
                inside = ((z_new >= clip[0]) & (z_new <= clip[1])).to(jac.dtype)
                z_new, jac = _clip(z_new, clip), jac * inside
            z = z_new.detach()
            jac = jac.detach()
    return jac


def value_readout(v: Velocity, grid: torch.Tensor, *, clip: tuple[float, float] | None = None) -> torch.Tensor:
    """V = (1/M) sum_j clip(zeta_j + v(zeta_j, 0)): DFPO's single-step Euler readout averaged over the noise grid.
    ``v`` is called on (..., M) points (``grid`` broadcast over the states); returns (...,)."""
    return _clip(grid + v(grid, torch.zeros_like(grid)), clip).mean(-1)


def quantile_readout(v: Velocity, grid: torch.Tensor, *, steps: int,
                     clip: tuple[float, float] | None = None) -> torch.Tensor:
    """q_j = sort_j psi^{(N_q)}(zeta_j): the multi-step flow map of the noise grid, sorted (a differentiable
    permutation; it guards against a non-monotone discrete map). (..., M)."""
    return euler_map(v, grid, steps=steps, clip=clip).sort(-1).values


def aggregate(x: torch.Tensor, how: str) -> torch.Tensor:
    """Value Flows' ``ret_agg`` / ``q_agg`` over the leading flow axis (F, ...): mean or min -> (...)."""
    if how not in AGGREGATES:
        raise ValueError(f"DFPO flow aggregate must be mean or min, got {how!r}")
    return x.mean(0) if how == "mean" else x.min(0).values


def uncertainty_weight(sigma: torch.Tensor, *, mode: str = "up", temp: float = 0.3) -> torch.Tensor:
    """w from the spread estimate sigma (detached): ``up`` (the code) sigmoid(-kappa / sigma) + 1/2 in (1/2, 1),
    larger for uncertain states; ``down`` 1 - sigmoid(-kappa / sigma), smaller for them; ``none`` 1.
    sigma is floored at 1e-12 (sigma = 0 gives up 1/2, down 1)."""
    if mode not in UNCERTAINTY_WEIGHTS:
        raise ValueError(f"DFPO uw must be one of {', '.join(UNCERTAINTY_WEIGHTS)}, got {mode!r}")
    sigma = sigma.detach()
    if mode == "none":
        return torch.ones_like(sigma)
    s = torch.sigmoid(-temp / sigma.clamp(min=1e-12))
    return s + 0.5 if mode == "up" else 1.0 - s


def next_loss_index(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (B, T) long, nonterminal m (B, T) float): for each position t, the next loss token t' > t
    (masked tool / padding positions are skipped, as in ``gae``), and m_t = 1 if one exists. Where m_t = 0 the
    index points at t itself (a valid position whose value is multiplied by 0)."""
    mask = response_mask.bool()
    b, t_len = mask.shape
    positions = torch.arange(t_len, device=mask.device).expand(b, t_len)
    big = torch.full_like(positions, t_len)
    nxt = torch.where(mask, positions, big)  # (B, T) position if a loss token, else T
    # suffix minimum over positions > t: flip, cumulative min, flip, then shift left by one
    suffix = nxt.flip(-1).cummin(-1).values.flip(-1)  # (B, T) min over t' >= t
    later = torch.cat([suffix[:, 1:], big[:, :1]], dim=1)  # (B, T) min over t' > t
    nonterminal = later < t_len
    return torch.where(nonterminal, later, positions), nonterminal.to(response_mask.dtype if
                                                                      response_mask.is_floating_point() else
                                                                      torch.float32)


def bcfm_loss(v: Velocity, eps: torch.Tensor, tau: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Bootstrapped CFM (the anchor), mean over the last (sample) axis:
    mean_k (v(tau_k R_k + (1 - tau_k) eps_k, tau_k) - (R_k - eps_k))^2 with R the detached target
    r + gamma m psi_bar(eps | s'). eps, tau, target: (..., K) -> (...) (plus v's leading flow axis if any)."""
    target = target.detach()
    z = tau * target + (1 - tau) * eps
    return (v(z, tau) - (target - eps)).square().mean(-1)


def dcfm_loss(v: Velocity, z_check: torch.Tensor, tau: torch.Tensor, target_velocity: torch.Tensor,
              nonterminal: torch.Tensor) -> torch.Tensor:
    """Distributional CFM, mean over samples, dropped at terminal transitions:
    m_t mean_k (v(z_check_k, tau_k) - v_bar_k)^2 with z_check = r + gamma m psi_bar_{0 -> tau}(eps | s') and
    v_bar = v_bar(psi_bar_{0 -> tau}(eps | s'), tau | s') (detached). m: (...) broadcast against the result."""
    err = (v(z_check.detach(), tau) - target_velocity.detach()).square().mean(-1)
    return nonterminal * err


def geo_velocity_loss(v: Velocity, eps: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Straightness: u0 = v(eps, 0), mean_k (v(eps_k + tau_k u0_k, tau_k) - u0_k)^2 (zero iff the trajectory from
    eps is a straight line at constant speed; gradients through both evaluations)."""
    u0 = v(eps, torch.zeros_like(eps))
    return (v(eps + tau * u0, tau) - u0).square().mean(-1)


def geo_endpoint_loss(v: Velocity, eps: torch.Tensor, endpoint: torch.Tensor) -> torch.Tensor:
    """One step onto the N-step endpoint: mean_k (eps_k + v(eps_k, 0) - sg[psi_bar^{(N)}(eps_k | s)])^2."""
    return (eps + v(eps, torch.zeros_like(eps)) - endpoint.detach()).square().mean(-1)


def cvar_readout(quantiles: torch.Tensor, alpha: float) -> torch.Tensor:
    """CVaR_alpha of sorted quantiles (..., M): the mean of the first max(1, floor(alpha M)) -> (...)."""
    return quantiles[..., : tail_size(alpha, quantiles.shape[-1])].mean(-1)


# Per-token critic loss terms and their default coefficients (0 switches a term off; docs/algorithms/dfpo.md, Defaults)
DFPO_TERMS: dict[str, float] = {"bcfm": 1.0, "dcfm": 1.0, "geo": 0.0, "cvar": 1.0, "upper": 1.0, "tail_shape": 1.0,
                                "mean_shift": 0.0, "curvature": 0.0, "consistency": 0.0}
TAIL_TERMS = ("cvar", "upper", "tail_shape", "mean_shift", "curvature", "consistency")


def dfpo_critic_terms(
    v: Velocity,  # the critic's velocity field at the batch's states: v(z (B, T, K), tau) -> (F, B, T, K)
    quantiles: Callable[[], torch.Tensor],  # () -> (F, B, T, M) sorted multi-step quantiles, with gradient
    targets: torch.Tensor,  # (B, T, K, 6) the target pass's channels (credo.train.flow_targets.FLOW_CHANNELS)
    weights: torch.Tensor,  # (B, T) uncertainty weights w_t
    rewards: torch.Tensor,  # (B, T) token rewards r_t
    nonterminal: torch.Tensor,  # (B, T) m_t
    return_quantiles: torch.Tensor | None = None,  # (B, T, M) tail targets y = q_bar + A (distributional GAE)
    *,
    coefs: dict[str, float] | None = None,
    geo: str = "none",
    alpha: float = 0.1,
    beta: float = 0.1,
) -> dict[str, torch.Tensor]:
    """The weighted per-token terms {name: coef * term (B, T)} of

    L_t = w_t (lam_B BCFM_t + lam_D m_t DCFM_t) + lam_geo L^geo_t + lam_cvar L^cvar_t + lam_up L^up_t
          + lam_tail L^tail_t [+ mean shift, curvature, consistency],

    each flow's squared errors summed over the flows (Value Flows sums its two critics' losses); the tail terms
    (DVPO Eqs. 5-10, :mod:`credo.algo.dvpo`) on the flow-mean quantiles against ``return_quantiles``; consistency
    (Eq. 10) between the flows' quantiles. A term whose coefficient is 0 is neither computed nor returned."""
    from credo.algo import dvpo

    c = dict(DFPO_TERMS)
    unknown = set(coefs or {}) - set(c)
    if unknown:
        raise ValueError(f"unknown DFPO term(s) {sorted(unknown)}; terms: {', '.join(DFPO_TERMS)}")
    c.update(coefs or {})
    if geo not in GEOS:
        raise ValueError(f"DFPO geo must be one of {', '.join(GEOS)}, got {geo!r}")
    eps, tau, bcfm_next, dcfm_next, dcfm_vel, endpoint = targets.detach().unbind(-1)  # (B, T, K) each
    r = rewards.detach().to(eps.dtype).unsqueeze(-1)  # (B, T, 1)
    w = weights.detach()
    out: dict[str, torch.Tensor] = {}
    if c["bcfm"]:
        out["bcfm"] = c["bcfm"] * w * _flow_sum(bcfm_loss(v, eps, tau, r + bcfm_next))
    if c["dcfm"]:
        out["dcfm"] = c["dcfm"] * w * _flow_sum(dcfm_loss(v, r + dcfm_next, tau, dcfm_vel, nonterminal))
    if c["geo"] and geo != "none":
        term = geo_velocity_loss(v, eps, tau) if geo == "velocity" else geo_endpoint_loss(v, eps, endpoint)
        out["geo"] = c["geo"] * _flow_sum(term)
    tails = [name for name in TAIL_TERMS if c[name]]
    if not tails:
        return out
    if return_quantiles is None and set(tails) - {"curvature", "consistency"}:
        raise ValueError("DFPO tail terms need return_quantiles (algo.advantage=dfpo); set their coefficients to 0")
    q_flows = quantiles()  # (F, B, T, M)
    q = q_flows.mean(0)
    y = None if return_quantiles is None else return_quantiles.detach().to(q.dtype)
    compute = {
        "cvar": lambda: dvpo.cvar_loss(q, y, alpha=alpha),
        "upper": lambda: dvpo.upper_gain_loss(q, y, beta=beta),
        "tail_shape": lambda: dvpo.tail_shape_loss(q, y, alpha=alpha, beta=beta),
        "mean_shift": lambda: dvpo.mean_shift_loss(q, y),
        "curvature": lambda: dvpo.tail_curvature_loss(q, alpha=alpha, beta=beta),
        "consistency": lambda: dvpo.consistency_loss(q_flows.permute(1, 2, 0, 3)),
    }
    for name in tails:
        out[name] = c[name] * compute[name]()
    return out


def _flow_sum(x: torch.Tensor) -> torch.Tensor:
    """(F, B, T) -> (B, T): the sum over the flows' losses ((B, T) passes through)."""
    return x.sum(0) if x.dim() == 3 else x



def check_dfpo_config(loss: str, hparams: dict, advantage: str, advantage_gamma: float | None,
                      quantiles: int = 32) -> None:
    """ValueError (a one-line "key: reason") when ``critic.loss`` / ``algo.advantage`` = dfpo cannot run: the
    estimator without the loss (its old quantiles come from the loss's target pass), tail terms without the
    estimator (their targets), unknown choices, a target other than ``old``, or the loss's gamma != the estimator's
    (``advantage_gamma``: None for an estimator without one), or tails too small for Eq. 8 (< 2 of the head's
    ``quantiles`` M per tail). ``hparams``: the loss's, defaults filled in."""
    if advantage == "dfpo" and loss != "dfpo":
        raise ValueError(f"algo.advantage=dfpo: needs critic.loss=dfpo (its flow target pass computes the old "
                         f"quantiles the estimator reads), got {loss!r}")
    if loss != "dfpo":
        return
    h = hparams
    if any(h[f"{k}_coef"] for k in ("cvar", "upper", "tail_shape", "mean_shift")) and advantage != "dfpo":
        raise ValueError(f"critic.loss=dfpo: its tail terms need algo.advantage=dfpo (the quantile targets), got "
                         f"{advantage!r}; or set cvar_coef, upper_coef, tail_shape_coef, mean_shift_coef to 0")
    choices = {"uw": UNCERTAINTY_WEIGHTS, "uw_std": UNCERTAINTY_STDS, "jacobian": JACOBIANS, "ret_agg": AGGREGATES,
               "q_agg": AGGREGATES, "geo": GEOS}
    for key, allowed in choices.items():
        if h[key] not in allowed:
            raise ValueError(f"critic.loss_args: dfpo {key} must be one of {', '.join(allowed)}, got {h[key]!r}")
    if h["target"] != "old":
        raise ValueError(f"critic.loss_args: dfpo target={h['target']!r} is not implemented (an EMA target needs a "
                         "second critic copy kept and checkpointed across steps); use target=old")
    if h["samples"] < 1 or h["flow_steps"] < 1:
        raise ValueError(f"critic.loss_args: dfpo samples and flow_steps must be >= 1, got {h['samples']}, "
                         f"{h['flow_steps']}")
    if h["tail_shape_coef"] and min(tail_size(h["alpha"], quantiles), tail_size(h["beta"], quantiles)) < 2:
        raise ValueError(f"critic.loss_args: dfpo tail_shape needs >= 2 quantiles per tail: floor(alpha / beta * M)"
                         f" with alpha={h['alpha']}, beta={h['beta']}, M={quantiles}; raise critic.head_args "
                         "quantiles or alpha / beta, or set tail_shape_coef to 0")
    if advantage_gamma is not None and float(advantage_gamma) != float(h["gamma"]):
        raise ValueError(f"critic.loss_args: dfpo gamma={h['gamma']} differs from algo.advantage_args gamma="
                         f"{advantage_gamma} (the targets and the advantages would discount differently)")
