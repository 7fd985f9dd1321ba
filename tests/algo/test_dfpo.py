"""DFPO's value-flow critic (seed-additions.md §A.3): Euler maps and readouts by hand, the Jacobian three ways, BCFM /
DCFM with the terminal drop, uncertainty weights, the tail terms against DVPO's, the estimator against credo's GAE,
gradient flow, the flow target pass, the A.2 toy (mean right, spread only from the multi-step readout), config
errors, and a tiny CLI run with save and resume."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from credo.algo import compute_advantages
from credo.algo.advantages import gae, masked_whiten, token_rewards
from credo.algo.critic import compute_critic_loss, critic_loss_requirements
from credo.algo.dfpo import (bcfm_loss, cvar_readout, dcfm_loss, dfpo_critic_terms, euler_jacobian, euler_map,
                             geo_endpoint_loss, geo_velocity_loss, next_loss_index, noise_grid, quantile_readout,
                             uncertainty_weight, value_readout)
from credo.algo import dvpo
from credo.algo.dvpo import distributional_gae
from credo.config import ConfigError, load_config
from credo.methods.dfpo.flow_head import FlowHead
from credo.models.value import CriticOutput, ValueModel
from credo.train.flow_targets import FLOW_CHANNELS, FlowPassOptions, flow_draws, flow_target_pass, flow_targets_of

close = torch.testing.assert_close
SIG = 1 / (1 + math.exp(0.3))  # sigmoid(-0.3) = 0.425557...


def linear_field(a: float):
    """v(z, tau) = a - z: Euler steps z_{k+1} = z_k + D (a - z_k), so psi(z0) = a + (z0 - a) (1 - D)^N."""
    return lambda z, tau: a - z


def critic_output(head: FlowHead, h: torch.Tensor) -> CriticOutput:
    """What ValueModel.outputs makes of a flow head's field: its value readout and the field."""
    field = head(h)
    return CriticOutput(values=field.values(), flow=field)


def random_head(seed: int = 0, **args) -> FlowHead:
    torch.manual_seed(seed)
    head = FlowHead(8, **args)
    for net in head.nets:  # away from the zero start so the field is not trivial
        torch.nn.init.normal_(net.out.weight, std=0.5)
    return head


# ------------------------------------------------------------------------------------------ 1. the zero start
def test_zero_initialised_head_reads_out_v0_grid_quantiles_and_the_sigma_1_weight():
    head = FlowHead(8, quantiles=4, quantile_steps=3)
    out = critic_output(head, torch.randn(2, 3, 8))
    # v = 0: V = mean_j zeta_j = 0 (the grid is symmetric); psi(z) = z so q = zeta = Phi^-1([1, 3, 5, 7] / 8)
    close(out.values, torch.zeros(2, 3))
    grid = torch.tensor([-1.150349, -0.318639, 0.318639, 1.150349])
    close(noise_grid(4), grid, atol=1e-6, rtol=0)
    close(out.flow.quantiles(), grid.expand(1, 2, 3, 4), atol=1e-6, rtol=0)
    # the Jacobian of the identity map is 1: w = sigmoid(-0.3 / 1) + 1/2 = 0.925557
    mask = torch.ones(2, 3)
    eps, tau, eps1 = flow_draws(0, 0, 2, 3, 4)
    _, w, q = flow_targets_of(FlowPassOptions(), out, mask, eps, tau, eps1)
    close(w, torch.full((2, 3), SIG + 0.5))
    close(q, grid.expand(2, 3, 4), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------ 2. Euler by hand
def test_euler_maps_by_hand_for_a_linear_field():
    v = linear_field(1.0)
    z0 = torch.tensor([-1.0, 3.0])
    # N = 2, D = 1/2: z1 = -1 + 0.5 * 2 = 0, z2 = 0 + 0.5 * 1 = 0.5; and 1 + 2 * 0.25 = 1.5 for z0 = 3
    close(euler_map(v, z0, steps=2), torch.tensor([0.5, 1.5]))
    # to tau = 0.5 with N = 2: D = 0.25, psi = 1 + (z0 - 1) * 0.75^2 -> -0.125 and 2.125
    close(euler_map(v, z0, steps=2, t1=torch.tensor([0.5, 0.5])), torch.tensor([-0.125, 2.125]))
    # clipped to [0, 1]: z0 = -1: z1 = clip(0) = 0, z2 = 0.5; z0 = 3: z1 = clip(2) = 1, z2 = clip(1) = 1
    close(euler_map(v, z0, steps=2, clip=(0.0, 1.0)), torch.tensor([0.5, 1.0]))
    # a time-dependent field v = tau: psi = z0 + sum_k D * k D = z0 + 0.25 at N = 2 (taus 0 and 0.5)
    close(euler_map(lambda z, tau: tau, z0, steps=2), z0 + 0.25)
    # readouts: one step of v = 1 - z from each grid point lands on 1 exactly; N_q = 2 steps: 1 + (zeta - 1) / 4
    grid = noise_grid(4)
    close(value_readout(v, grid), torch.tensor(1.0))
    close(quantile_readout(v, grid, steps=2), 1 + (grid - 1) * 0.25)
    # the map's derivative (1 - D)^N = 0.25; with the clip active at step 1 for z0 = 3 it is 0
    for method in ("jvp", "autograd", "fd"):
        close(euler_jacobian(v, z0, steps=2, method=method), torch.tensor([0.25, 0.25]), atol=1e-4, rtol=0)
        close(euler_jacobian(v, torch.tensor([0.5, 3.0]), steps=2, method=method, clip=(0.0, 1.0)),
              torch.tensor([0.25, 0.0]), atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------ 3. Jacobian 3 ways
@pytest.mark.parametrize("flows", [1, 2])
def test_jvp_equals_autograd_and_finite_difference_on_a_trained_looking_head(flows):
    head = random_head(flows=flows, time_embed="fourier")
    field = head(torch.randn(3, 5, 8))
    z0 = torch.randn(3, 5, 2).expand(flows, 3, 5, 2)
    jvp = euler_jacobian(field.velocity, z0, steps=10, method="jvp")
    assert jvp.shape == (flows, 3, 5, 2) and float((jvp - 1).abs().max()) > 0.05  # not the identity's 1
    close(euler_jacobian(field.velocity, z0, steps=10, method="autograd"), jvp, atol=1e-5, rtol=1e-5)
    close(euler_jacobian(field.velocity, z0, steps=10, method="fd", delta=1e-3), jvp, atol=2e-3, rtol=0)


def test_uncertainty_weights_up_down_none_by_hand():
    sigma = torch.tensor([1.0, 0.5, 0.05, 0.0])
    # up: sigmoid(-0.3 / s) + 1/2: s = 1 -> 0.925557; s = 0.5 -> sigmoid(-0.6) + 0.5 = 0.354344 + 0.5;
    # s = 0.05 -> sigmoid(-6) + 0.5 = 0.502473; s = 0 -> 0.5 (floored, sigmoid(-3e11) = 0)
    up = torch.tensor([SIG + 0.5, 1 / (1 + math.exp(0.6)) + 0.5, 1 / (1 + math.exp(6)) + 0.5, 0.5])
    close(uncertainty_weight(sigma, mode="up", temp=0.3), up)
    close(uncertainty_weight(sigma, mode="down", temp=0.3), 1.5 - up)  # 1 - s = 1.5 - (s + 0.5)
    close(uncertainty_weight(sigma, mode="none"), torch.ones(4))
    with pytest.raises(ValueError, match="uw must be"):
        uncertainty_weight(sigma, mode="sideways")


# ------------------------------------------------------------------------------------------ 4. terminal drop
def test_next_loss_index_skips_masked_spans_and_marks_the_terminal():
    mask = torch.tensor([[1.0, 1, 0, 0, 1, 0], [0, 1, 1, 0, 0, 0]])
    index, m = next_loss_index(mask)
    assert index.tolist() == [[1, 4, 4, 4, 4, 5], [1, 2, 2, 3, 4, 5]]
    assert m.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]]


def test_bcfm_and_dcfm_by_hand_and_dcfm_dropped_at_the_terminal_token():
    v = lambda z, tau: 0.5 + 0 * z  # noqa: E731  a constant field
    eps = torch.tensor([[[0.0, 1.0]]])  # (1, 1, K = 2)
    tau = torch.tensor([[[0.5, 0.25]]])
    # BCFM to the Dirac at r = 1: target velocity R - eps = [1, 0]; (0.5 - 1)^2 = 0.25, (0.5 - 0)^2 = 0.25
    close(bcfm_loss(v, eps, tau, torch.ones(1, 1, 2)), torch.tensor([[0.25]]))
    z_check, v_bar = torch.tensor([[[3.0, 4.0]]]), torch.tensor([[[2.0, 0.5]]])
    # DCFM: (0.5 - 2)^2 = 2.25, (0.5 - 0.5)^2 = 0 -> mean 1.125; m = 0 drops it
    close(dcfm_loss(v, z_check, tau, v_bar, torch.ones(1, 1)), torch.tensor([[1.125]]))
    close(dcfm_loss(v, z_check, tau, v_bar, torch.zeros(1, 1)), torch.tensor([[0.0]]))
    # through dfpo_critic_terms: 2 tokens, the second terminal (m = 0); bcfm_next = dcfm_next = 0 there
    mask = torch.ones(1, 2)
    _, m = next_loss_index(mask)
    targets = torch.zeros(1, 2, 2, len(FLOW_CHANNELS))
    targets[..., 0], targets[..., 1] = eps.expand(1, 2, 2), tau.expand(1, 2, 2)
    targets[0, 0, :, 2] = 0.2  # token 0's BCFM bootstrap gamma m psi_bar(eps | s')
    targets[0, :, :, 4] = 2.0  # v_bar = 2 at both tokens (meaningless at the terminal token)
    r = torch.tensor([[0.0, 1.0]])
    terms = dfpo_critic_terms(v, lambda: None, targets, torch.tensor([[1.0, 0.5]]), r, m,
                              coefs={"cvar": 0, "upper": 0, "tail_shape": 0})
    # token 0: R = 0 + 0.2 = 0.2; targets R - eps = [0.2, -0.8]; (0.3)^2 = 0.09, (1.3)^2 = 1.69 -> 0.89
    # token 1: R = r = 1 (CFM to the Dirac at 1), 0.25 as above, times w = 0.5 -> 0.125
    close(terms["bcfm"], torch.tensor([[0.89, 0.125]]))
    # DCFM: token 0: (0.5 - 2)^2 = 2.25 (w = 1); token 1 is terminal: 0
    close(terms["dcfm"], torch.tensor([[2.25, 0.0]]))
    assert set(terms) == {"bcfm", "dcfm"}


def test_geometric_terms_by_hand():
    v = linear_field(1.0)  # the straight field towards 1: u0 = 1 - eps, v(eps + tau u0) = 1 - eps - tau (1 - eps)
    eps, tau = torch.tensor([[[0.0]]]), torch.tensor([[[0.5]]])
    # u0 = 1; v(0.5, 0.5) = 0.5; (0.5 - 1)^2 = 0.25 (a v = a - z path decelerates: not straight at constant speed)
    close(geo_velocity_loss(v, eps, tau), torch.tensor([[0.25]]))
    close(geo_velocity_loss(lambda z, t: 0.7 + 0 * z, eps, tau), torch.tensor([[0.0]]))  # constant speed: 0
    # endpoint: eps + v(eps, 0) = 1 against psi_bar = 0.4 -> 0.36
    close(geo_endpoint_loss(v, eps, torch.tensor([[[0.4]]])), torch.tensor([[0.36]]))


# ------------------------------------------------------------------------------------------ 5. one-step mean
def test_one_step_readout_of_the_exact_field_is_the_mean_for_every_noise():
    # independent coupling's minimiser at tau = 0: v*(z, 0) = E Z - z; one Euler step lands on E Z = 0.3 from any eps
    v = linear_field(0.3)
    eps = torch.randn(1000)
    close(eps + v(eps, torch.zeros_like(eps)), torch.full((1000,), 0.3))
    close(value_readout(v, noise_grid(32)), torch.tensor(0.3))


# ------------------------------------------------------------------------------------------ 6. tail terms
def test_tail_terms_on_sorted_flow_quantiles_equal_dvpos_functions():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 16, generator=g).sort(-1).values  # (F = 2, B = 3, T = 4, M = 16)
    y = torch.randn(3, 4, 16, generator=g).sort(-1).values
    zero = torch.zeros(3, 4, 4, len(FLOW_CHANNELS))
    coefs = {"bcfm": 0, "dcfm": 0, "cvar": 1.0, "upper": 0.5, "tail_shape": 2.0, "mean_shift": 1.0,
             "curvature": 1.0, "consistency": 3.0}
    terms = dfpo_critic_terms(linear_field(0.0), lambda: q, zero, torch.ones(3, 4), torch.zeros(3, 4),
                              torch.ones(3, 4), y, coefs=coefs, alpha=0.2, beta=0.2)
    qm = q.mean(0)
    close(terms["cvar"], dvpo.cvar_loss(qm, y, alpha=0.2))
    close(terms["upper"], 0.5 * dvpo.upper_gain_loss(qm, y, beta=0.2))
    close(terms["tail_shape"], 2.0 * dvpo.tail_shape_loss(qm, y, alpha=0.2, beta=0.2))
    close(terms["mean_shift"], dvpo.mean_shift_loss(qm, y))
    close(terms["curvature"], dvpo.tail_curvature_loss(qm, alpha=0.2, beta=0.2))
    close(terms["consistency"], 3.0 * dvpo.consistency_loss(q.permute(1, 2, 0, 3)))
    with pytest.raises(ValueError, match="need return_quantiles"):
        dfpo_critic_terms(linear_field(0.0), lambda: q, zero, torch.ones(3, 4), torch.zeros(3, 4), torch.ones(3, 4))


# ------------------------------------------------------------------------------------------ 7. the estimator
def test_dfpo_advantage_is_gae_on_the_value_readout_and_returns_quantile_targets():
    g = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1.0, 1, 0, 1, 0], [1, 1, 1, 1, 1]])
    q = torch.randn(2, 5, 8, generator=g).sort(-1).values * mask.unsqueeze(-1)
    values = torch.randn(2, 5, generator=g) * mask
    rewards = torch.tensor([1.0, 0.0])
    out = compute_advantages("dfpo", rewards=rewards, group_ids=torch.tensor([0, 0]), response_mask=mask,
                             values=values, value_quantiles=q, gamma=1.0, lam=0.95)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    close(out.advantages, masked_whiten(adv, mask))
    close(out.returns, ret)
    close(out.return_quantiles, distributional_gae(rewards, q, mask, gamma=1.0, lam=0.95)[1])
    # risk_readout cvar: GAE on CVaR_0.25 of q = mean of its first 2 of 8 quantiles
    cvar = compute_advantages("dfpo", rewards=rewards, group_ids=torch.tensor([0, 0]), response_mask=mask,
                              values=values, value_quantiles=q, risk_readout="cvar", alpha=0.25, whiten=False)
    close(cvar.advantages, gae(rewards, q[..., :2].mean(-1) * mask, mask, gamma=1.0, lam=0.95)[0])
    close(cvar_readout(q, 0.25), q[..., :2].mean(-1))
    # with value_readout: quantile_mean (V_bar = mean_j q_bar), DVPO's estimator on q_bar gives the same advantages
    same = compute_advantages("dfpo", rewards=rewards, group_ids=torch.tensor([0, 0]), response_mask=mask,
                              values=q.mean(-1), value_quantiles=q)
    dv = compute_advantages("dvpo", rewards=rewards, group_ids=torch.tensor([0, 0]), response_mask=mask,
                            value_quantiles=q)
    close(same.advantages, dv.advantages)


# ------------------------------------------------------------------------------------------ 8. gradient flow
def _loss_inputs(head: FlowHead, h: torch.Tensor, mask: torch.Tensor, seed: int = 0):
    """The target pass on ``head`` at ``h`` (no grad), then the critic-loss inputs with a fresh forward."""
    with torch.no_grad():
        old = critic_output(head, h)
        eps, tau, eps1 = flow_draws(seed, 0, *mask.shape, 4)
        targets, weights, q_old = flow_targets_of(FlowPassOptions(), old, mask, eps, tau, eps1)
    rewards = torch.zeros_like(mask)
    rewards[:, -1] = 1.0
    y = distributional_gae(rewards, q_old, mask, gamma=1.0, lam=0.95)[1]
    out = critic_output(head, h)
    return out, {"values": out.values, "flow": out.flow, "flow_targets": targets, "flow_weights": weights,
                 "token_rewards": rewards, "return_quantiles": y}


def test_gradients_reach_the_head_and_the_backbone_states_but_not_the_targets():
    head = random_head(quantiles=16, quantile_steps=4)
    h = torch.randn(2, 4, 8, requires_grad=True)
    mask = torch.ones(2, 4)
    out, inputs = _loss_inputs(head, h, mask)
    for name in ("flow_targets", "flow_weights", "token_rewards", "return_quantiles"):
        inputs[name] = inputs[name].clone().requires_grad_(True)
    loss = compute_critic_loss("dfpo", response_mask=mask, inputs=inputs, alpha=0.2, beta=0.2)
    loss.loss.backward()
    assert h.grad is not None and float(h.grad.abs().sum()) > 0
    for p in head.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()
    assert float(head.nets[0].out.weight.grad.abs().sum()) > 0 and float(head.nets[0].proj.weight.grad.abs().sum()) > 0
    for name in ("flow_targets", "flow_weights", "token_rewards", "return_quantiles"):
        assert inputs[name].grad is None, name  # every target is detached inside the loss
    # the aggregated loss is the token mean of the sum of the terms
    terms = {k: v for k, v in loss.metrics.items() if k.startswith("dfpo_") and k != "dfpo_weight"}
    assert set(terms) == {"dfpo_bcfm", "dfpo_dcfm", "dfpo_cvar", "dfpo_upper", "dfpo_tail_shape"}
    assert float(loss.loss.detach()) == pytest.approx(sum(terms.values()), rel=1e-5)


def test_flow_loss_requirements_follow_the_tail_coefficients():
    base = ("flow", "flow_targets", "flow_weights", "token_rewards")
    assert critic_loss_requirements("dfpo") == base + ("return_quantiles",)
    assert critic_loss_requirements("dfpo", {"cvar_coef": 0.0, "upper_coef": 0.0, "tail_shape_coef": 0.0}) == base
    with pytest.raises(ValueError, match="needs flow, flow_targets"):
        compute_critic_loss("dfpo", response_mask=torch.ones(1, 2), inputs={"values": torch.zeros(1, 2)})


# ------------------------------------------------------------------------------------------ the target pass
def _batch(tok, n: int = 6):
    from credo.models.batch import collate
    from credo.types import Example, RewardResult, Trajectory

    g = torch.Generator().manual_seed(0)
    trajs = []
    for i, (p, r) in enumerate([(3, 9), (7, 2), (1, 5), (5, 12), (4, 1), (6, 7)][:n]):
        mask = [1] * 4 + [0] * 5 + [1] * 3 if i == 3 else [1] * r
        trajs.append(Trajectory(example=Example(str(i), "", str(i)), group_id=i // 2,
                                prompt_ids=torch.randint(4, len(tok), (p,), generator=g).tolist(),
                                response_ids=torch.randint(4, len(tok), (r,), generator=g).tolist(),
                                rollout_logprobs=[0.0] * r, response_mask=mask, finish_reason="eos"))
    return collate(trajs, [RewardResult(float(i % 2)) for i in range(n)], pad_id=tok.pad_token_id)


def test_target_pass_is_independent_of_micro_batching_and_bootstraps_from_the_next_loss_token(tiny_model):
    model, tok = tiny_model
    critic = ValueModel.from_policy(model, "flow", quantiles=16, quantile_steps=4)
    for net in critic.value_head.nets:
        torch.nn.init.normal_(net.out.weight, std=0.3)
    whole, split = _batch(tok), _batch(tok)
    opts = FlowPassOptions()
    flow_target_pass(opts, critic, whole, seed=3, step=5, micro_batch_size=None)
    flow_target_pass(opts, critic, split, seed=3, step=5, micro_batch_size=2)
    close(split.values, whole.values, atol=1e-5, rtol=1e-5)
    for name in ("value_quantiles", "flow_targets", "flow_weights"):  # batch extras
        close(split.extra(name), whole.extra(name), atol=1e-5, rtol=1e-5)
    t = whole.extra("flow_targets")  # (B, T, K, C)
    assert t.shape == (6, 12, 4, len(FLOW_CHANNELS))
    # row 3: loss tokens 0-3 and 9-11; token 3 bootstraps from token 9 (the masked span is skipped); token 11 is
    # terminal, so its BCFM / DCFM bootstraps are 0; masked tokens carry nothing
    assert float(t[3, 3, :, 2].abs().sum()) > 0 and float(t[3, 11, :, 2:5].abs().sum()) == 0
    assert float(t[3, 4:9].abs().sum()) == 0
    # eps and tau are the (seed, step, row) draws
    eps, tau, _ = flow_draws(3, 5, 6, 12, 4)
    close(t[..., 0], eps * whole.response_mask.unsqueeze(-1))
    close(t[..., 1], tau * whole.response_mask.unsqueeze(-1))
    assert ((whole.extra("flow_weights") > 0.5) | (whole.response_mask == 0)).all()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_dfpo_critic_update_is_exact_under_gradient_accumulation(tiny_model, agg):
    from credo.train.optim import build_scheduler
    from credo.train.update import UpdateOptions, update_critic

    model, tok = tiny_model
    base = ValueModel.from_policy(model, "flow", quantiles=16, quantile_steps=4)
    for net in base.value_head.nets:
        torch.nn.init.normal_(net.out.weight, std=0.3)
    batch = _batch(tok)
    flow_target_pass(FlowPassOptions(), base, batch, seed=0, step=0, micro_batch_size=None)
    batch.set_extra("token_rewards", token_rewards(batch.scores, batch.response_mask))
    batch.set_extra("return_quantiles", distributional_gae(batch.scores, batch.extra("value_quantiles"),
                                                           batch.response_mask, gamma=1.0, lam=0.95)[1])
    results = []
    for micro in ("null", "2"):
        cfg = load_config(None, ["algo.advantage=dfpo", "critic.head=flow", "critic.loss=dfpo",
                                 "critic.head_args={quantiles: 16, quantile_steps: 4}", f"algo.agg={agg}",
                                 "critic.loss_args={alpha: 0.2, beta: 0.2}", "critic.grad_clip=0",
                                 f"train.micro_batch_size={micro}"])
        critic = copy.deepcopy(base)
        opt = torch.optim.SGD(critic.parameters(), lr=1.0)
        metrics = update_critic(UpdateOptions.of(cfg), critic, batch, opt,
                                build_scheduler(opt, warmup_steps=0, total_steps=1), step=0)
        results.append(([(p0 - p).detach() for p0, p in zip(base.parameters(), critic.parameters())], metrics))
    (g_whole, m_whole), (g_micro, m_micro) = results
    assert sum(float(g.abs().sum()) for g in g_whole) > 0
    for a, b in zip(g_whole, g_micro):
        close(b, a, atol=1e-5, rtol=1e-4)
    for key in m_whole:
        assert m_micro[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-6), key
    assert {"critic/dfpo_bcfm", "critic/dfpo_dcfm", "critic/dfpo_cvar", "critic/dfpo_weight"} <= set(m_whole)


# ------------------------------------------------------------------------------------------ the A.2 toy
def test_toy_mean_is_right_and_spread_comes_only_from_the_multi_step_readout():
    """seed-additions.md A.2: 4 one-hot states with Bernoulli outcomes p = (0.1, 0.3, 0.7, 0.9), CFM to Dirac
    samples (BCFM at m = 0) under independent coupling; the one-step readout recovers the mean with almost no
    spread, the 10-step readout recovers the spread sqrt(p (1 - p)) = (0.30, 0.46, 0.46, 0.30)."""
    torch.manual_seed(0)
    p = torch.tensor([0.1, 0.3, 0.7, 0.9])
    head = FlowHead(4, quantiles=32, quantile_steps=10)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    states = torch.eye(4)
    for _ in range(600):
        idx = torch.randint(0, 4, (64,))
        field = head.field(states[idx].unsqueeze(0))  # (F, 1, 64, hidden)
        target = (torch.rand(1, 64, 16) < p[idx].view(1, 64, 1)).float()  # K = 16 Dirac samples per state
        eps, tau = torch.randn(1, 64, 16), torch.rand(1, 64, 16)
        loss = bcfm_loss(field.velocity, eps, tau, target).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        field = head.field(states.unsqueeze(0))
        grid = field.grid()  # (1, 4, 32)
        one = (grid + field.velocity(grid, torch.zeros_like(grid)))[0, 0]  # (4, 32) one-step samples
        multi = euler_map(field.velocity, grid, steps=10)[0, 0]  # (4, 32)
        values = field.values()[0]
    assert (values - p).abs().max() < 0.1, values  # the value readout (one step, grid mean) is the mean
    assert (one.mean(-1) - p).abs().max() < 0.1
    assert one.std(-1).max() < 0.15, one.std(-1)  # one step: (almost) no spread
    true_std = (p * (1 - p)).sqrt()
    assert (multi.std(-1) - true_std).abs().max() < 0.12, multi.std(-1)  # ten steps: the spread
    assert (multi.std(-1) > 2 * one.std(-1)).all()


# ------------------------------------------------------------------------------------------ config, CLI
@pytest.mark.parametrize("overrides,match", [
    (["critic.loss=dfpo", "algo.advantage=dfpo"], "needs critic.head=flow"),
    (["algo.advantage=dfpo", "critic.head=flow"], "algo.advantage=dfpo: needs critic.loss=dfpo"),
    (["critic.loss=dfpo", "critic.head=flow", "algo.advantage=gae"], "tail terms need algo.advantage=dfpo"),
    (["--config=dfpo", "critic.loss_args={target: ema}"], "target='ema' is not implemented"),
    (["--config=dfpo", "critic.loss_args={uw: sideways}"], "uw must be one of up, down, none"),
    (["--config=dfpo", "critic.loss_args={gamma: 0.9, alpha: 0.2, beta: 0.2}"], "differs from algo.advantage_args"),
    (["--config=dfpo", "critic.head_args={time_embed: learned}"], "time_embed must be raw or fourier"),
    (["--config=dfpo", "critic.loss_args={bcfm: 1.0}"], "did you mean 'bcfm_coef'"),
    # M = 16 at alpha = 0.1: floor(1.6) = 1 quantile per tail, too few for Eq. 8's variance
    (["--config=dfpo", "critic.loss_args={alpha: 0.1, beta: 0.1}"], "tail_shape needs >= 2 quantiles per tail"),
])
def test_dfpo_config_errors(overrides, match):
    preset = None
    if overrides[0].startswith("--config="):
        preset, overrides = overrides[0].split("=", 1)[1], overrides[1:]
    with pytest.raises(ConfigError, match=match):
        load_config(preset, overrides)


def test_the_preset_and_a_gae_actor_with_a_tailless_flow_critic_load():
    cfg = load_config("dfpo", [])
    assert (cfg.critic.head, cfg.critic.loss, cfg.algo.advantage) == ("flow", "dfpo", "dfpo")
    load_config(None, ["critic.head=flow", "critic.loss=dfpo", "algo.advantage=gae",
                       "critic.loss_args={cvar_coef: 0, upper_coef: 0, tail_shape_coef: 0}"])


def test_flow_critic_save_load_round_trip(tmp_path: Path, tiny_model):
    model, _ = tiny_model
    critic = ValueModel.from_policy(model, "flow", flows=2, time_embed="fourier", quantiles=8, quantile_steps=3,
                                    return_clip=[-1.0, 2.0])
    for net in critic.value_head.nets:
        torch.nn.init.normal_(net.out.weight, std=0.3)
    critic.save(tmp_path / "critic")
    loaded = ValueModel.load(tmp_path / "critic")
    ids = torch.tensor([[5, 6, 7, 8]])
    args = (ids, torch.ones_like(ids), torch.arange(4).unsqueeze(0))
    a, b = critic.outputs(*args), loaded.outputs(*args)
    close(b.values, a.values)
    close(b.flow.quantiles(), a.flow.quantiles())
    assert loaded.value_head.clip == (-1.0, 2.0) and len(loaded.value_head.nets) == 2
    assert float((a.flow.quantiles() - a.flow.quantiles().clamp(-1.0, 2.0)).abs().max()) == 0  # clipped readout
