"""DFPO's flow head (``critic.head: flow``; docs/algorithms/dfpo.md), registered into
:data:`credo.models.value.CRITIC_HEADS` (which names this module among its built-ins).

Per state (token position) with backbone hidden state h, each of ``flows`` networks computes
u = W_c h + b_c (d_c = ``proj_dim``) and the scalar velocity v(z, tau | h) = MLP([u, z, phi(tau)]), the MLP being
``layers`` hidden layers of width ``hidden``, each Linear -> GELU -> LayerNorm (Value Flows' ``MLP`` order), then a
zero-initialised Linear to 1 (so v = 0 at the start: psi(z) = z, V = 0, sigma = 1, the scalar head's start).
phi(tau) = tau (``time_embed: raw``, the code) or [sin(2 pi k tau), cos(2 pi k tau)]_{k=1..8} (``fourier``).
The first layer's u-part W_u u + b is computed once per state and reused for every (z, tau) point.

Readouts on the noise grid zeta_j = Phi^{-1}((j - 1/2) / M) (``quantiles`` M): the value
V = mean_j clip(zeta_j + v(zeta_j, 0)) (``value_readout: euler1_mean``, DFPO's single-step Euler) or the mean of
the quantiles (``quantile_mean``); the quantiles q_j = sort_j psi^{(N_q)}(zeta_j) (``quantile_steps`` N_q). With
``flows`` > 1 the value and quantiles are the mean over flows.
"""
from __future__ import annotations

import math

import torch

from credo.algo.dfpo import VALUE_READOUTS, noise_grid, quantile_readout, value_readout
from credo.models.value import CRITIC_HEADS, CriticOutput

TIME_EMBEDS = ("raw", "fourier")
FOURIER_FREQS = 8


class FlowNet(torch.nn.Module):
    """One velocity network: projection of h, then the MLP on [u, z, phi(tau)]."""

    def __init__(self, hidden_size: int, proj_dim: int, hidden: int, layers: int, time_dim: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, proj_dim)
        self.first = torch.nn.Linear(proj_dim + 2 + time_dim, hidden)  # [u, z, tau, fourier(tau)]
        self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(hidden) for _ in range(layers)])
        self.rest = torch.nn.ModuleList([torch.nn.Linear(hidden, hidden) for _ in range(layers - 1)])
        self.out = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)
        self.proj_dim = proj_dim

    def state_part(self, h: torch.Tensor) -> torch.Tensor:
        """(B, L, hidden) = W_u (W_c h + b_c) + b: the first layer's contribution of the state."""
        u = self.proj(h)
        return u @ self.first.weight[:, : self.proj_dim].T + self.first.bias

    def velocity(self, a: torch.Tensor, z: torch.Tensor, tau: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
        """a (B, L, hidden), z and tau (B, L, K), phi (B, L, K, Dt) -> v (B, L, K)."""
        w = self.first.weight[:, self.proj_dim:]  # (hidden, 2 + Dt): the columns of z, tau, fourier(tau)
        x = a.unsqueeze(-2) + z.unsqueeze(-1) * w[:, 0] + tau.unsqueeze(-1) * w[:, 1] + phi @ w[:, 2:].T
        x = self.norms[0](torch.nn.functional.gelu(x))
        for lin, norm in zip(self.rest, self.norms[1:]):
            x = norm(torch.nn.functional.gelu(lin(x)))
        return self.out(x).squeeze(-1)


class FlowField:
    """The velocity field of a flow head at a set of states: ``velocity(z, tau)`` for z, tau broadcastable to
    (B, L, K) (or (F, B, L, K), one slice per flow) returns (F, B, L, K). Differentiable w.r.t. the head and the
    backbone (through the cached state part ``a``, (F, B, L, hidden))."""

    def __init__(self, head: "FlowHead", a: torch.Tensor):
        self.head, self.a = head, a

    def velocity(self, z: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        f, b, l_len = self.a.shape[:3]
        dtype = self.a.dtype
        z, tau = torch.broadcast_tensors(z, tau)
        if z.dim() == 3:
            z, tau = z.unsqueeze(0), tau.unsqueeze(0)
        z = z.expand(f, b, l_len, z.shape[-1]).to(dtype)
        tau = tau.expand(f, b, l_len, tau.shape[-1]).to(dtype)
        outs = [net.velocity(self.a[i], z[i], tau[i], self.head.time_features(tau[i]))
                for i, net in enumerate(self.head.nets)]
        return torch.stack(outs).float()  # (F, B, L, K)

    def slice(self, start: int, stop: int) -> "FlowField":
        return FlowField(self.head, self.a[:, :, start:stop])

    def gather(self, index: torch.Tensor) -> "FlowField":
        """The field at positions ``index`` (B, L) long of each row (e.g. the next loss token's state)."""
        idx = index.to(self.a.device).unsqueeze(0).unsqueeze(-1).expand(self.a.shape[0], -1, -1, self.a.shape[-1])
        return FlowField(self.head, self.a.gather(2, idx))

    def grid(self) -> torch.Tensor:
        """(B, L, M) the noise grid broadcast over the states."""
        g = noise_grid(self.head.quantiles, device=self.a.device)
        return g.expand(*self.a.shape[1:3], g.shape[0])

    def quantiles(self) -> torch.Tensor:
        """(F, B, L, M) q_j = sort_j psi^{(N_q)}(zeta_j) per flow."""
        return quantile_readout(self.velocity, self.grid(), steps=self.head.quantile_steps, clip=self.head.clip)

    def values(self) -> torch.Tensor:
        """(B, L) the value readout, mean over flows."""
        if self.head.value_readout == "quantile_mean":
            return self.quantiles().mean(-1).mean(0)
        return value_readout(self.velocity, self.grid(), clip=self.head.clip).mean(0)

    def critic_output(self) -> CriticOutput:
        """What ``ValueModel.outputs`` returns for this head: the value readout, and the field itself."""
        return CriticOutput(values=self.values(), flow=self)


class FlowHead(torch.nn.Module):
    """DFPO's flow head (module docstring). ``forward(h)`` -> its FlowField at h's positions."""

    def __init__(self, hidden_size: int, *, proj_dim: int = 64, hidden: int = 64, layers: int = 2, flows: int = 1,
                 time_embed: str = "raw", quantiles: int = 32, quantile_steps: int = 10,
                 value_readout: str = "euler1_mean", return_clip: list | None = None):
        super().__init__()
        if min(proj_dim, hidden, layers, flows, quantiles, quantile_steps) < 1:
            raise ValueError(f"flow head needs proj_dim, hidden, layers, flows, quantiles, quantile_steps >= 1, got "
                             f"{proj_dim}, {hidden}, {layers}, {flows}, {quantiles}, {quantile_steps}")
        if time_embed not in TIME_EMBEDS:
            raise ValueError(f"flow head time_embed must be raw or fourier, got {time_embed!r}")
        if value_readout not in VALUE_READOUTS:
            raise ValueError(f"flow head value_readout must be one of {', '.join(VALUE_READOUTS)}, got "
                             f"{value_readout!r}")
        if return_clip is not None and (len(return_clip) != 2 or not float(return_clip[0]) < float(return_clip[1])):
            raise ValueError(f"flow head return_clip must be [low, high] with low < high, got {return_clip!r}")
        self.time_embed, self.quantiles, self.quantile_steps = time_embed, quantiles, quantile_steps
        self.value_readout = value_readout
        self.clip = None if return_clip is None else (float(return_clip[0]), float(return_clip[1]))
        time_dim = 0 if time_embed == "raw" else 2 * FOURIER_FREQS
        self.nets = torch.nn.ModuleList([FlowNet(hidden_size, proj_dim, hidden, layers, time_dim)
                                         for _ in range(flows)])

    def time_features(self, tau: torch.Tensor) -> torch.Tensor:
        """(..., K) -> (..., K, Dt): phi(tau) without the raw tau (which has its own weight column)."""
        if self.time_embed == "raw":
            return tau.new_zeros(*tau.shape, 0)
        k = torch.arange(1, FOURIER_FREQS + 1, device=tau.device, dtype=tau.dtype)
        ang = 2 * math.pi * tau.unsqueeze(-1) * k
        return torch.cat([ang.sin(), ang.cos()], dim=-1)

    def field(self, h: torch.Tensor) -> FlowField:
        return FlowField(self, torch.stack([net.state_part(h) for net in self.nets]))

    def forward(self, h: torch.Tensor) -> FlowField:
        """The field at every position of h (B, L, H); ``ValueModel.outputs`` wraps it with its value readout."""
        return self.field(h)


CRITIC_HEADS.add("flow", FlowHead)  # FlowHead(hidden_size, **critic.head_args)
