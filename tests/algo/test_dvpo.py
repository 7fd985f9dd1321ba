"""DVPO's distributional critic terms and distributional GAE: hand-computed values (arithmetic in comments)."""
from __future__ import annotations

import inspect
import math

import pytest
import torch

from credo.algo import advantage_requirements, compute_advantages
from credo.algo.advantages import gae, masked_whiten
from credo.algo.dvpo import (
    DVPO_TERMS,
    consistency_loss,
    cvar_loss,
    distributional_gae,
    dvpo_critic_terms,
    mean_shift_loss,
    quantile_huber_loss,
    quantile_levels,
    tail_curvature_loss,
    tail_shape_loss,
    tail_size,
    upper_gain_loss,
)
from credo.algo.registry import ADVANTAGE_ESTIMATORS

close = torch.testing.assert_close

# M = 10 quantiles; with alpha = beta = 0.3 each tail holds floor(3.0) = 3 quantiles (index order 0-2 and 7-9)
Q = torch.tensor([0.0, 2, 3, 4, 4, 5, 5, 6, 8, 12])  # mean 49 / 10 = 4.9
Y = torch.tensor([1.0, 2, 3, 3, 4, 5, 6, 7, 8, 9])  # mean 48 / 10 = 4.8
QS = torch.stack([Q, Q - 1]).unsqueeze(0)  # (1, 2, 10): token 0 optimistic (4.9 > 4.8), token 1 pessimistic (3.9)
YS = torch.stack([Y, Y]).unsqueeze(0)  # (1, 2, 10)


def test_quantile_levels_and_tail_sizes():
    close(quantile_levels(4), torch.tensor([0.25, 0.5, 0.75, 1.0]))
    assert tail_size(0.1, 200) == 20  # the recipe: M = 200, alpha = beta = 0.1
    assert tail_size(0.3, 10) == 3 and tail_size(0.57, 100) == 57  # 0.57 * 100 = 56.99999... in floats
    assert tail_size(0.01, 50) == 1  # max(1, floor(0.5))
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="tail fraction"):
            tail_size(bad, 10)


def test_quantile_huber_hand_computed_with_risk_weightings():
    # M = 2: tau = [0.5, 1.0]; q = [0.5, 1.0], y = [0.0, 3.0]; u_ij = y_j - q_i, kappa = 1
    # i = 0 (tau 0.5): u = [-0.5, 2.5]; |tau - 1[u<0]| = [0.5, 0.5]; rho = [0.125, 2.5 - 0.5 = 2.0]
    #   -> terms [0.0625, 1.0], mean_j 0.53125
    # i = 1 (tau 1.0): u = [-1.0, 2.0]; |tau - 1[u<0]| = [0, 1]; rho = [0.5 (|u| = kappa: quadratic), 1.5]
    #   -> terms [0, 1.5], mean_j 0.75
    q = torch.tensor([[[0.5, 1.0]]])
    y = torch.tensor([[[0.0, 3.0]]])
    plain = (0.53125 + 0.75) / 2  # 0.640625
    close(quantile_huber_loss(q, y, risk_weighting="none"), torch.tensor([[plain]]))
    # w_i = exp(-(1 - tau_i)) = [e^-0.5, 1]; per quantile: mean_i w_i * (mean_j term_ij)
    per_quantile = (math.exp(-0.5) * 0.53125 + 1.0 * 0.75) / 2  # 0.53610...
    close(quantile_huber_loss(q, y), torch.tensor([[per_quantile]]))
    # the port's scalar form: mean(w) * L_QR = (e^-0.5 + 1) / 2 * 0.640625
    close(quantile_huber_loss(q, y, risk_weighting="scalar"), torch.tensor([[(math.exp(-0.5) + 1) / 2 * plain]]))
    # risk_gamma = 2: w = [e^-1, 1]
    close(quantile_huber_loss(q, y, risk_gamma=2.0), torch.tensor([[(math.exp(-1.0) * 0.53125 + 0.75) / 2]]))
    # kappa = 2: rho(2.5) = 2 * (2.5 - 1) = 3, rho(2) = 0.5 * 4 = 2, rho(-0.5) = 0.125, rho(-1) = 0.5
    # i = 0: [0.0625, 1.5] -> 0.78125; i = 1: [0, 2] -> 1.0; mean 0.890625
    close(quantile_huber_loss(q, y, kappa=2.0, risk_weighting="none"), torch.tensor([[0.890625]]))
    with pytest.raises(ValueError, match="risk_weighting"):
        quantile_huber_loss(q, y, risk_weighting="lower")


def test_cvar_upper_and_mean_shift_hand_computed():
    # token 0: lower tail q [0, 2, 3] mean 5/3, y [1, 2, 3] mean 2 -> (5/3 - 2)^2 = 1/9
    #          upper tail q [6, 8, 12] mean 26/3, y [7, 8, 9] mean 8 -> (2/3)^2 = 4/9
    # token 1 (q - 1): lower (2/3 - 2)^2 = 16/9; upper (23/3 - 8)^2 = 1/9
    close(cvar_loss(QS, YS, alpha=0.3), torch.tensor([[1 / 9, 16 / 9]]))
    close(upper_gain_loss(QS, YS, beta=0.3), torch.tensor([[4 / 9, 1 / 9]]))
    # alpha 0.1 on M = 10: k = 1 -> (q_1 - y_1)^2 = (0 - 1)^2 and (-1 - 1)^2
    close(cvar_loss(QS, YS, alpha=0.1), torch.tensor([[1.0, 4.0]]))
    # mean shift ReLU(ybar - qbar): token 0 optimistic (4.8 - 4.9 < 0) -> 0; token 1: 4.8 - 3.9 = 0.9
    close(mean_shift_loss(QS, YS), torch.tensor([[0.0, 0.9]]))
    # tails follow the index order, not the values: a reversed q takes [12, 8, 6] as its "lower tail"
    close(cvar_loss(Q.flip(0).view(1, 1, 10), Y.view(1, 1, 10), alpha=0.3), torch.tensor([[(26 / 3 - 2) ** 2]]))


def test_tail_shape_both_branches():
    # token 0: Var(q_low = [0, 2, 3]) = (25 + 1 + 16) / 9 / 2 = 7/3, Var(y_low = [1, 2, 3]) = 1 -> ReLU(4/3);
    #          Var(y_high = [7, 8, 9]) = 1, Var(q_high = [6, 8, 12]) = (64 + 4 + 100) / 9 / 2 = 28/3 -> ReLU(-) = 0
    # token 1: q = y except q_high = [8, 8, 8]: lower ReLU(1 - 1) = 0, upper ReLU(1 - 0) = 1
    q1 = Y.clone()
    q1[-3:] = 8.0
    q = torch.stack([Q, q1]).unsqueeze(0)
    close(tail_shape_loss(q, YS, alpha=0.3, beta=0.3), torch.tensor([[4 / 3, 1.0]]))
    # a shift changes neither variance
    close(tail_shape_loss(q + 5, YS, alpha=0.3, beta=0.3), torch.tensor([[4 / 3, 1.0]]))


def test_tail_curvature_hand_computed():
    # alpha = beta = 0.4: tails of 4, two second differences each (D2 x_j = x_j - 2 x_{j+1} + x_{j+2})
    # token 0: lower [0, 0, 1, 3]: D2 = [1, 1], mean 1 -> ReLU(1) = 1;
    #          upper [5, 7, 8, 8]: D2 = [5 - 14 + 8, 7 - 16 + 8] = [-1, -1], mean -1 -> ReLU(1) = 1; total 2
    # token 1 (Q): lower [0, 2, 3, 4]: D2 = [-1, 0] -> ReLU(-0.5) = 0; upper [5, 6, 8, 12]: D2 = [1, 2]
    #          -> ReLU(-1.5) = 0; total 0
    bent = torch.tensor([0.0, 0, 1, 3, 4, 4, 5, 7, 8, 8])
    q = torch.stack([bent, Q]).unsqueeze(0)
    close(tail_curvature_loss(q, alpha=0.4, beta=0.4), torch.tensor([[2.0, 0.0]]))
    # alpha = beta = 0.3 (tails of 3, one D2 each): token 0 lower 0 - 0 + 1 = 1; upper 7 - 16 + 8 = -1 -> 1 + 1
    close(tail_curvature_loss(q, alpha=0.3, beta=0.3), torch.tensor([[2.0, 0.0]]))


def test_head_consistency_three_heads():
    # heads [0, 0], [1, 0], [1, 2]: pairs (0,1): 1 + 0 = 1; (0,2): 1 + 4 = 5; (1,2): 0 + 4 = 4 -> mean 10/3
    heads = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 2.0]]).view(1, 1, 3, 2)
    close(consistency_loss(heads), torch.tensor([[10 / 3]]))
    with pytest.raises(ValueError, match=">= 2 heads"):
        consistency_loss(heads[:, :, :1])


def test_too_small_tails_raise_clear_errors():
    q = Q.view(1, 1, 10)
    y = Y.view(1, 1, 10)
    with pytest.raises(ValueError, match=r"tail_shape needs >= 2 quantiles per tail, got lower 1"):
        tail_shape_loss(q, y, alpha=0.1, beta=0.3)  # floor(0.1 * 10) = 1: the unbiased variance would be NaN
    with pytest.raises(ValueError, match=r"curvature needs >= 3 quantiles per tail, got lower 3 .* upper 2"):
        tail_curvature_loss(q, alpha=0.3, beta=0.2)
    heads = torch.stack([Q, Q, Q]).view(1, 1, 3, 10)
    with pytest.raises(ValueError, match="tail_shape"):
        dvpo_critic_terms(heads, y)  # defaults alpha = beta = 0.1 on M = 10: tails of 1
    # switching the two terms off switches their guards off too
    terms = dvpo_critic_terms(heads, y, weights={"tail_shape": 0.0, "curvature": 0})
    assert set(terms) == {"qr", "cvar", "upper", "mean_shift", "consistency"}


def test_critic_terms_weights_and_values():
    heads = torch.stack([QS - 1, QS, QS + 1], dim=-2)  # (1, 2, 3, 10), head mean = QS
    terms = dvpo_critic_terms(heads, YS, alpha=0.3, beta=0.3, weights={"cvar": 2.0, "curvature": 0.0})
    assert set(terms) == set(DVPO_TERMS) - {"curvature"}
    assert all(v.shape == (1, 2) for v in terms.values())
    close(terms["cvar"], 2 * torch.tensor([[1 / 9, 16 / 9]]))  # weight 2 x the hand values above
    close(terms["upper"], torch.tensor([[4 / 9, 1 / 9]]))
    close(terms["mean_shift"], torch.tensor([[0.0, 0.9]]))
    close(terms["tail_shape"], torch.tensor([[4 / 3, 4 / 3]]))  # token 1 is Q - 1: same variances
    close(terms["qr"], quantile_huber_loss(QS, YS))
    # pairs: (q-1, q): 10 x 1 = 10; (q-1, q+1): 10 x 4 = 40; (q, q+1): 10 -> mean 20 per token
    close(terms["consistency"], torch.tensor([[20.0, 20.0]]))
    scalar = dvpo_critic_terms(heads, YS, alpha=0.3, beta=0.3, risk_weighting="scalar")
    close(scalar["qr"], quantile_huber_loss(QS, YS, risk_weighting="scalar"))
    with pytest.raises(ValueError, match="unknown DVPO term"):
        dvpo_critic_terms(heads, YS, weights={"cvarr": 1.0})


def test_gradients_reach_the_head_quantiles_not_the_targets():
    heads = torch.stack([QS - 1, QS, QS + 1], dim=-2).requires_grad_(True)  # (1, 2, 3, 10)
    targets = YS.clone().requires_grad_(True)
    terms = dvpo_critic_terms(heads, targets, alpha=0.3, beta=0.3)
    sum(t.sum() for t in terms.values()).backward()
    assert targets.grad is None  # targets are constants
    assert heads.grad is not None and torch.isfinite(heads.grad).all() and heads.grad.abs().sum() > 0
    # mean shift alone on token 1 (pessimistic): d ReLU(ybar - qbar) / d q^(h)_j = -(1/M)(1/N) = -1/30
    heads.grad = None
    mean_shift_loss(heads.mean(-2), YS)[0, 1].backward()
    close(heads.grad[0, 1], torch.full((3, 10), -1 / 30))
    close(heads.grad[0, 0], torch.zeros(3, 10))  # token 0 is optimistic: ReLU is flat


def test_recipe_defaults_run():
    torch.manual_seed(0)
    heads = torch.randn(2, 4, 3, 200, requires_grad=True)  # N = 3 heads x M = 200 quantiles: tails of 20
    terms = dvpo_critic_terms(heads, torch.randn(2, 4, 200))
    assert set(terms) == set(DVPO_TERMS) and all(torch.isfinite(v).all() for v in terms.values())
    sum(v.sum() for v in terms.values()).backward()
    assert torch.isfinite(heads.grad).all()


def test_distributional_gae_hand_computed():
    # gamma 0.9, lam 0.8 (gamma lam = 0.72), reward 1 on the last token, two quantiles:
    # j = 0, q = [0.5, 0.6, 0.7]: t2: d = 1 - 0.7 = 0.3, A = 0.3; t1: d = 0.9 * 0.7 - 0.6 = 0.03,
    #   A = 0.03 + 0.72 * 0.3 = 0.246; t0: d = 0.9 * 0.6 - 0.5 = 0.04, A = 0.04 + 0.72 * 0.246 = 0.21712
    # j = 1, q = [0.0, 0.5, 1.0]: t2: d = 1 - 1 = 0, A = 0; t1: d = 0.9 * 1.0 - 0.5 = 0.4, A = 0.4;
    #   t0: d = 0.9 * 0.5 - 0 = 0.45, A = 0.45 + 0.72 * 0.4 = 0.738
    vq = torch.tensor([[[0.5, 0.0], [0.6, 0.5], [0.7, 1.0]]])  # (1, 3, 2)
    adv, targets = distributional_gae(torch.tensor([1.0]), vq, torch.ones(1, 3), gamma=0.9, lam=0.8)
    close(adv, torch.tensor([[[0.21712, 0.738], [0.246, 0.4], [0.3, 0.0]]]))
    close(targets, torch.tensor([[[0.71712, 0.738], [0.846, 0.9], [1.0, 1.0]]]))  # q + A


def test_distributional_gae_equals_scalar_gae_for_equal_quantiles():
    torch.manual_seed(1)
    values = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [0, 1, 1, 1, 1]])
    for rewards in (torch.randn(3), torch.randn(3, 5)):
        adv, targets = distributional_gae(rewards, values.unsqueeze(-1).expand(3, 5, 4), mask, gamma=0.9, lam=0.8)
        ref_adv, ref_ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
        for j in range(4):
            close(adv[..., j], ref_adv)
            close(targets[..., j], ref_ret)


def test_distributional_gae_masked_middle_position_is_transparent():
    # mask [1, 0, 1], gamma = lam = 1; the middle (tool) token's values are skipped:
    # j = 0, q = [0.5, 9.9, 0.7]: t2 A = 1 - 0.7 = 0.3; t0: d = 0.7 - 0.5 = 0.2, A = 0.2 + 0.3 = 0.5
    # j = 1, q = [0.0, -5.0, 1.0]: t2 A = 1 - 1 = 0; t0: d = 1.0 - 0.0 = 1.0, A = 1.0
    vq = torch.tensor([[[0.5, 0.0], [9.9, -5.0], [0.7, 1.0]]])
    adv, targets = distributional_gae(torch.tensor([1.0]), vq, torch.tensor([[1, 0, 1]]), gamma=1.0, lam=1.0)
    close(adv, torch.tensor([[[0.5, 1.0], [0.0, 0.0], [0.3, 0.0]]]))
    close(targets, torch.tensor([[[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]]))


def _dvpo_inputs():
    vq = torch.tensor([[[0.5, 0.0], [0.6, 0.5], [0.7, 1.0]], [[0.2, 0.4], [0.1, 0.3], [0.0, 0.0]]])  # (2, 3, 2)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return torch.tensor([1.0, 0.0]), mask, vq


def test_dvpo_estimator_is_registered_with_mean_of_quantile_advantages():
    assert advantage_requirements("dvpo") == ("value_quantiles",)
    entry = ADVANTAGE_ESTIMATORS["dvpo"]
    assert entry.inputs == ("rewards", "response_mask", "value_quantiles")
    assert entry.hparams == {"gamma": 1.0, "lam": 0.95, "whiten": True}
    rewards, mask, vq = _dvpo_inputs()
    out = entry.fn(rewards=rewards[:1], response_mask=mask[:1].float(), value_quantiles=vq[:1], gamma=0.9, lam=0.8,
                   whiten=False)
    # row 0 is the hand example above: mean_j A = [(0.21712 + 0.738) / 2, (0.246 + 0.4) / 2, (0.3 + 0) / 2]
    close(out.advantages, torch.tensor([[0.47756, 0.323, 0.15]]))
    close(out.returns, torch.tensor([[(0.71712 + 0.738) / 2, (0.846 + 0.9) / 2, 1.0]]))
    close(out.return_quantiles, torch.tensor([[[0.71712, 0.738], [0.846, 0.9], [1.0, 1.0]]]))
    with pytest.raises(ValueError, match="needs value_quantiles"):
        compute_advantages("dvpo", rewards=rewards, group_ids=torch.tensor([0, 0]), response_mask=mask)


def test_dvpo_through_compute_advantages_matches_gae_on_the_mean_quantile():
    if "value_quantiles" not in inspect.signature(compute_advantages).parameters:
        pytest.skip("credo.algo.compute_advantages does not pass value_quantiles yet (the lead's edit)")
    rewards, mask, vq = _dvpo_inputs()
    groups = torch.tensor([0, 0])
    out = compute_advantages("dvpo", rewards=rewards, group_ids=groups, response_mask=mask, value_quantiles=vq,
                             gamma=0.9, lam=0.8)
    # mean_j A is linear in q, so it is scalar GAE on the mean quantile; then whitened over loss tokens
    ref = compute_advantages("gae", rewards=rewards, group_ids=groups, response_mask=mask, values=vq.mean(-1),
                             gamma=0.9, lam=0.8)
    close(out.advantages, ref.advantages)
    close(out.returns, ref.returns)
    adv_q, _ = distributional_gae(rewards, vq, mask, gamma=0.9, lam=0.8)
    close(out.advantages, masked_whiten(adv_q.mean(-1), mask.float()))
    assert out.return_quantiles.shape == (2, 3, 2)
