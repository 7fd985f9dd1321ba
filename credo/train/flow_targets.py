"""The critic's no-grad pass at collection time, with DFPO's flow target pass (docs/algorithms/dfpo.md).

:func:`critic_pass` is what the RL step runs where a critic exists: :func:`credo.train.forward.batched_values`, or,
when the configured critic loss declares it needs flow targets (``needs`` of its registration includes
``flow_targets``: ``critic.loss=dfpo``), :func:`flow_target_pass`, which computes in one backbone forward per
micro-batch, with the critic as it is at the start of the step (the "old" target network, PPO's ``old_values``):

- per loss token t, K samples (eps_k, tau_k) and one eps'_t from ``Generator(seed, step, row)`` (independent of the
  micro-batching);
- s'_t = the state before the next loss token (masked spans skipped), m_t = 1 if one exists (:func:`next_loss_index`);
- channel ``bcfm_next`` = gamma m_t psi_bar^{(N)}(eps_k | s'_t) (the BCFM target is r_t + this);
- ``dcfm_next`` = gamma m_t psi_bar_{0 -> tau_k}(eps_k | s'_t) (DCFM's z_check = r_t + this);
- ``dcfm_velocity`` = m_t [gamma] v_bar(psi_bar_{0 -> tau_k}(eps_k | s'_t), tau_k | s'_t) (gamma if
  ``dcfm_gamma_scale``);
- ``endpoint`` = psi_bar^{(N)}(eps_k | s_t) at the current state (``geo: endpoint``; 0 otherwise);
- ``flow_weights`` w_t from sigma_t = |d psi_bar^{(N)}(eps'_t | s_t) / d eps| (``uw_std: jacobian``, the code) or
  std_j q_bar_{t,j} (``quantile_std``);
- ``value_quantiles`` q_bar (B, T, M) and ``values`` V_bar (B, T) (the readouts).

With several flows the targets are aggregated over the flows (``ret_agg``) and sigma too (``q_agg``); the rewards r_t
enter in the loss (the batch extra ``token_rewards``, known only after the reward / KL stage).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from credo.algo.dfpo import (aggregate, euler_jacobian, euler_map, next_loss_index, uncertainty_weight)
from credo.train.forward import VALUE_QUANTILES, batched_values, response_outputs
from credo.types import TrainBatch, declare_extra

FLOW_CHANNELS = ("eps", "tau", "bcfm_next", "dcfm_next", "dcfm_velocity", "endpoint")  # flow_targets' last axis
FLOW_TARGETS = declare_extra("flow_targets", "DFPO's flow target pass (credo.train.flow_targets): (B, T, K, C) the "
                             "flow critic's targets, channels FLOW_CHANNELS, 0 outside the loss mask")
FLOW_WEIGHTS = declare_extra("flow_weights", "DFPO's flow target pass (credo.train.flow_targets): (B, T) the "
                             "uncertainty weights w_t, 0 outside the loss mask")


@dataclass(frozen=True)
class FlowPassOptions:
    """The flow target pass's part of the ``dfpo`` critic loss's hyperparameters (``critic.loss_args``)."""

    samples: int = 4
    flow_steps: int = 10
    gamma: float = 1.0
    dcfm_gamma_scale: bool = False
    uw: str = "up"
    uw_temp: float = 0.3
    uw_std: str = "jacobian"
    jacobian: str = "jvp"
    ret_agg: str = "mean"
    q_agg: str = "mean"
    geo: str = "none"

    @classmethod
    def of_args(cls, loss_args: dict) -> "FlowPassOptions":
        from credo.algo.critic import CRITIC_LOSSES

        args = {**CRITIC_LOSSES["dfpo"].hparams, **loss_args}
        return cls(**{k: args[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class CriticPassOptions:
    """How the step's critic pass runs: micro-batch size, the seed, and the flow pass's options (None: no flow
    target pass, the plain :func:`batched_values`)."""

    micro_batch_size: int | None = None
    seed: int = 0
    flow: FlowPassOptions | None = None

    @classmethod
    def of(cls, cfg) -> "CriticPassOptions":
        from credo.algo.critic import critic_loss_requirements

        c = cfg.critic
        flow = FlowPassOptions.of_args(dict(c.loss_args)) if "flow_targets" in critic_loss_requirements(
            c.loss, c.loss_args) else None
        return cls(micro_batch_size=cfg.train.micro_batch_size, seed=cfg.seed, flow=flow)


def critic_pass(opts: CriticPassOptions, critic, batch: TrainBatch, *, step: int) -> None:
    """Fill the batch's collection-time critic fields: values and value quantiles, and the flow targets when the
    critic loss needs them."""
    if opts.flow is None:
        batch.values, quantiles = batched_values(critic, batch, micro_batch_size=opts.micro_batch_size)
        if quantiles is not None:
            batch.set_extra(VALUE_QUANTILES, quantiles)
        return
    flow_target_pass(opts.flow, critic, batch, seed=opts.seed, step=step, micro_batch_size=opts.micro_batch_size)


def flow_draws(seed: int, step: int, rows: int, t_len: int, k: int) -> tuple[torch.Tensor, ...]:
    """(eps (B, T, K), tau (B, T, K), eps' (B, T)): row b's draws from Generator(hash(seed, step, b))."""
    eps, tau, eps1 = [], [], []
    for b in range(rows):
        g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 100_003 + b)
        eps.append(torch.randn(t_len, k, generator=g))
        tau.append(torch.rand(t_len, k, generator=g))
        eps1.append(torch.randn(t_len, generator=g))
    return torch.stack(eps), torch.stack(tau), torch.stack(eps1)


@torch.no_grad()
def flow_targets_of(o: FlowPassOptions, out, response_mask: torch.Tensor, eps: torch.Tensor, tau: torch.Tensor,
                    eps1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(flow_targets (B, T, K, C), weights (B, T), old quantiles (B, T, M)) from one micro-batch's critic output
    (``out``: a CriticOutput sliced to the response, with its flow field)."""
    field, clip = out.flow, out.flow.head.clip
    n, f = o.flow_steps, out.flow.a.shape[0]
    index, m = next_loss_index(response_mask)  # (B, T) each
    m = m.to(eps.dtype).unsqueeze(-1)  # (B, T, 1)
    nxt = field.gather(index)
    full = lambda x: x.unsqueeze(0).expand(f, *x.shape).contiguous()  # noqa: E731  (F, B, T, K)
    psi_next = aggregate(euler_map(nxt.velocity, full(eps), steps=n, clip=clip), o.ret_agg)  # (B, T, K)
    z_tau = aggregate(euler_map(nxt.velocity, full(eps), steps=n, t1=full(tau), clip=clip), o.ret_agg)
    v_bar = aggregate(nxt.velocity(z_tau, tau), o.ret_agg)  # (B, T, K)
    scale = o.gamma if o.dcfm_gamma_scale else 1.0
    endpoint = aggregate(euler_map(field.velocity, full(eps), steps=n, clip=clip), o.ret_agg) \
        if o.geo == "endpoint" else torch.zeros_like(eps)
    targets = torch.stack([eps, tau, o.gamma * m * psi_next, o.gamma * m * z_tau, scale * m * v_bar, endpoint], -1)
    q_old = field.quantiles().mean(0)  # (B, T, M)
    if o.uw_std == "jacobian":
        jac = euler_jacobian(field.velocity, full(eps1.unsqueeze(-1)), steps=n, method=o.jacobian, clip=clip)
        sigma = aggregate(jac.abs(), o.q_agg).squeeze(-1)  # (B, T)
    elif o.uw_std == "quantile_std":
        sigma = q_old.std(-1, unbiased=False)  # (B, T)
    else:
        raise ValueError(f"DFPO uw_std must be jacobian or quantile_std, got {o.uw_std!r}")
    weights = uncertainty_weight(sigma, mode=o.uw, temp=o.uw_temp)
    return targets, weights, q_old


def flow_target_pass(o: FlowPassOptions, critic, batch: TrainBatch, *, seed: int, step: int,
                     micro_batch_size: int | None) -> None:
    """Sets batch.values and the extras value_quantiles, flow_targets and flow_weights (module docstring), in
    micro-batches of ``micro_batch_size`` rows (the result does not depend on it)."""
    was_training = critic.training
    critic.eval()
    b, t_len = batch.response_mask.shape
    eps, tau, eps1 = flow_draws(seed, step, b, t_len, o.samples)
    size = micro_batch_size or b
    dev = next(critic.parameters()).device
    parts: list[tuple[torch.Tensor, ...]] = []
    try:
        for s in range(0, b, size):
            rows = torch.arange(s, min(s + size, b))
            mb = batch.select(rows)
            with torch.no_grad():
                out = response_outputs(critic, mb)
                tgt, w, q = flow_targets_of(o, out, mb.response_mask.to(dev), eps[rows].to(dev), tau[rows].to(dev),
                                            eps1[rows].to(dev))
            parts.append((out.values.detach().cpu(), q.cpu(), tgt.cpu(), w.cpu()))
    finally:
        critic.train(was_training)
    mask = batch.response_mask
    real = batch.attention_mask[:, batch.prompt_len:].to(mask.dtype)  # 1 on response tokens, 0 on padding
    values, q, tgt, w = (torch.cat(x) for x in zip(*parts))
    batch.values = values * real
    batch.set_extra(VALUE_QUANTILES, q * mask.unsqueeze(-1))
    batch.set_extra(FLOW_TARGETS, tgt * mask.unsqueeze(-1).unsqueeze(-1))
    batch.set_extra(FLOW_WEIGHTS, w * mask)
