"""Advantage estimators: hand-computed values (arithmetic in comments), EVPO gate, PAPO polarity and phase."""
from __future__ import annotations

import math

import pytest
import torch

from credo.algo import compute_advantages, entropy_direction_from_logits, entropy_from_logits
from credo.algo.advantages import explained_variance, gae, papo_phase, token_rewards


def test_reward_placement_on_last_loss_token():
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    out = token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert out.tolist() == [[0, 2, 0], [0, 0, 3], [0, 0, 0]]


def test_gae_hand_computed():
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    # gamma = lam = 1: TD = [0.6-0.5, 0.7-0.6, 1-0.7] = [0.1, 0.1, 0.3]; A = suffix sums [0.5, 0.4, 0.3]
    adv, ret = gae(torch.tensor([1.0]), values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.4, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]]))  # = R for outcome rewards
    # gamma 0.9, lam 0.8: t2: d=0.3, A=0.3; t1: d=0.9*0.7-0.6=0.03, A=0.03+0.72*0.3=0.246;
    # t0: d=0.9*0.6-0.5=0.04, A=0.04+0.72*0.246=0.21712; returns = A + V
    adv, ret = gae(torch.tensor([1.0]), values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.21712, 0.246, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[0.71712, 0.846, 1.0]]))


def test_gae_skips_masked_environment_tokens():
    # an environment token in the middle is transparent: V and the running advantage carry over it
    values = torch.tensor([[0.5, 9.9, 0.7]])
    adv, ret = gae(torch.tensor([1.0]), values, torch.tensor([[1, 0, 1]]), gamma=1.0, lam=1.0)
    # t2: A = 1 - 0.7 = 0.3; t1 skipped; t0: d = 0.7 - 0.5 = 0.2, A = 0.2 + 0.3 = 0.5
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 0.0, 1.0]]))


def test_gae_estimator_whitens_and_needs_values():
    values = torch.tensor([[0.5, 0.6, 0.7], [0.1, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = compute_advantages("gae", rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]),
                             response_mask=mask, values=values)
    valid = out.advantages[mask.bool()]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.var().item() == pytest.approx(1.0, abs=1e-4)  # unbiased variance, as verl's masked_whiten
    with pytest.raises(ValueError, match="needs values"):
        compute_advantages("gae", rewards=torch.ones(2), group_ids=torch.zeros(2), response_mask=mask)


def test_reinforce_pp_and_remax():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards = torch.tensor([1.0, 2.0])
    # gamma 0.5, reward on the last loss token: row 0 Ret = [0.25, 0.5, 1]; row 1 Ret = [1, 2, 0]
    out = compute_advantages("reinforce_pp", rewards=rewards, group_ids=torch.tensor([0, 1]), response_mask=mask,
                             gamma=0.5)
    torch.testing.assert_close(out.returns, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))
    vals = torch.tensor([0.25, 0.5, 1.0, 1.0, 2.0])  # whitened over the 5 loss tokens
    expected = (vals - vals.mean()) / torch.sqrt(vals.var() + 1e-8)
    torch.testing.assert_close(out.advantages[mask.bool()], expected)
    # ReMax: Ret_t (gamma 1) minus the greedy response's reward b_i
    out = compute_advantages("remax", rewards=rewards, group_ids=torch.tensor([0, 1]), response_mask=mask,
                             reward_baselines=torch.tensor([0.5, 2.5]))
    torch.testing.assert_close(out.advantages, torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]]))
    with pytest.raises(ValueError, match="needs reward_baselines"):
        compute_advantages("remax", rewards=rewards, group_ids=torch.tensor([0, 1]), response_mask=mask)


def test_opo_length_weighted_baseline():
    # lengths [2, 4], rewards [1, 0]: b = (2*1 + 4*0) / 6 = 1/3 -> A = [2/3, -1/3]
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    out = compute_advantages("opo", rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([5, 5]),
                             response_mask=mask)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([2 / 3, -1 / 3]))


def test_grpo_passk_only_the_best_sample():
    # R = [0.2, 0.9, 0.5]: best 0.9, second 0.5 -> gap 0.4; unbiased std: mean 0.5333,
    # squared deviations 0.1111 + 0.1344 + 0.0011 = 0.24667 / 2 = 0.12333 -> std 0.351188
    mask = torch.ones(3, 2)
    out = compute_advantages("grpo_passk", rewards=torch.tensor([0.2, 0.9, 0.5]), group_ids=torch.zeros(3),
                             response_mask=mask)
    std = torch.tensor([0.2, 0.9, 0.5]).std().item()
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([0.0, 0.4 / (std + 1e-6), 0.0]))
    assert std == pytest.approx(0.351188, abs=1e-5)
    out = compute_advantages("grpo_passk", rewards=torch.tensor([0.2, 0.9, 0.5]), group_ids=torch.zeros(3),
                             response_mask=mask, norm_std=False)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([0.0, 0.4, 0.0]))
    with pytest.raises(ValueError, match="at least 2"):
        compute_advantages("grpo_passk", rewards=torch.ones(2), group_ids=torch.tensor([0, 1]), response_mask=mask[:2])


def test_reinforce_pp_baseline_is_group_centred_then_whitened():
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    out = compute_advantages("reinforce_pp_baseline", rewards=torch.tensor([1.0, 0.0, 3.0, 1.0]),
                             group_ids=torch.tensor([0, 0, 1, 1]), response_mask=mask)
    # centred: [0.5, -0.5, 1, -1] broadcast over 7 loss tokens, then whitened
    vals = torch.tensor([0.5, 0.5, -0.5, -0.5, 1.0, -1.0, -1.0])
    torch.testing.assert_close(out.advantages[mask.bool()], (vals - vals.mean()) / torch.sqrt(vals.var() + 1e-8))


# ----------------------------------------------------------------------------- EVPO


def _evpo_batch():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    mask = torch.ones(6, 3)
    return rewards, groups, mask


def test_explained_variance_definition():
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0, abs=1e-4)
    # V = mean(Ret): residual variance = Var(Ret) -> EV = 1 - var/(var + 1e-5) ~ 0
    assert explained_variance(ret, torch.full_like(ret, 2.5), mask) == pytest.approx(0.0, abs=1e-4)


def test_evpo_uses_the_critic_only_when_it_explains_the_returns():
    rewards, groups, mask = _evpo_batch()
    good_values = rewards[:, None].expand(6, 3) * 0.9 + 0.05  # tracks the return closely -> EV ~ 0.99
    out = compute_advantages("evpo", rewards=rewards, group_ids=groups, response_mask=mask, values=good_values)
    gae_out = compute_advantages("gae", rewards=rewards, group_ids=groups, response_mask=mask, values=good_values)
    assert out.metrics["evpo/explained_variance"] > 0.9 and out.metrics["evpo/use_critic"] == 1.0
    torch.testing.assert_close(out.advantages, gae_out.advantages)
    torch.testing.assert_close(out.returns, gae_out.returns)
    bad_values = 1.0 - good_values  # anti-correlated -> EV < 0 -> group baseline
    out = compute_advantages("evpo", rewards=rewards, group_ids=groups, response_mask=mask, values=bad_values)
    grpo_out = compute_advantages("grpo", rewards=rewards, group_ids=groups, response_mask=mask)
    assert out.metrics["evpo/explained_variance"] < 0 and out.metrics["evpo/use_critic"] == 0.0
    torch.testing.assert_close(out.advantages, grpo_out.advantages)
    # the critic's training targets are the GAE returns in both branches
    torch.testing.assert_close(out.returns, gae(rewards, bad_values, mask, gamma=1.0, lam=1.0)[1])


def test_evpo_group_gate():
    rewards, groups, mask = _evpo_batch()
    values = rewards[:, None].expand(6, 3).clone()
    values[3:] = 1.0 - values[3:]  # the critic is right on group 0, wrong on group 1
    out = compute_advantages("evpo", rewards=rewards, group_ids=groups, response_mask=mask, values=values,
                             gate="group")
    assert out.metrics["evpo/use_critic"] == pytest.approx(0.5)
    grpo_out = compute_advantages("grpo", rewards=rewards, group_ids=groups, response_mask=mask)
    torch.testing.assert_close(out.advantages[3:], grpo_out.advantages[3:])


# ----------------------------------------------------------------------------- PAPO


def _entropy(z: torch.Tensor) -> torch.Tensor:
    p = z.softmax(-1)
    return -(p * p.log()).sum(-1)


def test_entropy_direction_matches_finite_difference():
    """dH ~= -eta A (S_k - C) for the logit step dz = eta A (e_k - pi) (spec: ~1e-7 relative)."""
    torch.manual_seed(0)
    z = torch.randn(1, 1, 50, dtype=torch.float64)
    for k, a in ((3, 1.0), (17, -0.7), (int(z.argmax()), 2.0)):
        labels = torch.tensor([[k]])
        direction = entropy_direction_from_logits(z, labels).item()
        eta = 1e-6
        pi = z.softmax(-1)
        step = eta * a * (torch.nn.functional.one_hot(labels, 50).double() - pi)
        finite = (_entropy(z + step) - _entropy(z)).item()
        assert finite == pytest.approx(-eta * a * direction, rel=1e-5)
    torch.testing.assert_close(entropy_from_logits(z), _entropy(z))


def test_papo_phase_functions():
    assert papo_phase([2.0, 1.5]) == pytest.approx(-0.25)  # (1.5 - 2) / 2: entropy falling
    assert papo_phase([2.0]) == 0.0
    assert papo_phase([2.0, 3.0], "none") == 0.0
    # ema_trend: trend over [2.0, 1.0] with ema 0.5 = 0.5*2 + 0.5*1 = 1.5; current 1.2 -> (1.2 - 1.5) / 2
    assert papo_phase([2.0, 1.0, 1.2], "ema_trend", ema=0.5) == pytest.approx(-0.15)
    with pytest.raises(ValueError, match="phase_fn"):
        papo_phase([1.0, 2.0], "slope")


def test_papo_reweights_polarity_branches():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0])
    mask = torch.ones(4, 2)
    base = compute_advantages("grpo", rewards=rewards, group_ids=groups, response_mask=mask).advantages
    # D = S_k - C; with A > 0 rows (0, 2) and A < 0 rows (1, 3): P = -A D
    direction = torch.tensor([[-1.0, 1.0], [-1.0, 1.0], [-1.0, 1.0], [-1.0, 1.0]])
    polarity_positive = (-base * direction) > 0  # column 0 for A>0 rows, column 1 for A<0 rows
    falling = [2.0, 1.5]  # phi = -0.25 -> w+ = 1.25, w- = 0.75 (strength 1)
    out = compute_advantages("papo", rewards=rewards, group_ids=groups, response_mask=mask,
                             entropy_direction=direction, entropy_history=falling, renormalize=False)
    expected = torch.where(polarity_positive, base * 1.25, base * 0.75)
    torch.testing.assert_close(out.advantages, expected)
    assert out.metrics["papo/w_pos"] == pytest.approx(1.25) and out.metrics["papo/frac_expand"] == pytest.approx(0.5)
    renorm = compute_advantages("papo", rewards=rewards, group_ids=groups, response_mask=mask,
                                entropy_direction=direction, entropy_history=falling)
    assert renorm.advantages.abs().sum().item() == pytest.approx(base.abs().sum().item())
    flat = compute_advantages("papo", rewards=rewards, group_ids=groups, response_mask=mask,
                              entropy_direction=direction, entropy_history=falling, phase_fn="none")
    torch.testing.assert_close(flat.advantages, base)  # no phase signal: plain GRPO
    rising = compute_advantages("papo", rewards=rewards, group_ids=groups, response_mask=mask,
                                entropy_direction=direction, entropy_history=[1.0, 5.0], renormalize=False)
    assert rising.metrics["papo/w_pos"] == 0.5 and rising.metrics["papo/w_neg"] == 2.0  # clipped to [0.5, 2]
    expo = compute_advantages("papo", rewards=rewards, group_ids=groups, response_mask=mask, weight_map="exp",
                              entropy_direction=direction, entropy_history=falling, renormalize=False)
    assert expo.metrics["papo/w_pos"] == pytest.approx(math.exp(0.25))  # exp(-strength * phi), phi = -0.25
    with pytest.raises(ValueError, match="needs entropy_direction, entropy_history"):
        compute_advantages("papo", rewards=rewards, group_ids=groups, response_mask=mask)


def test_every_estimator_has_a_test():
    from credo.algo import list_advantage_estimators

    tested = {"gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "remax", "opo", "grpo_passk",
              "reinforce_pp_baseline", "evpo", "papo", "dvpo", "attnrl",  # dvpo, attnrl: tests/algo/test_dvpo.py, tests/methods/attnrl/test_attnrl.py
              "gpg",  # tests/algo/test_verl_fidelity.py
              "dfpo",  # tests/algo/test_dfpo.py
              "optimal_token_baseline", "tir_optimal_token_baseline", "gdpo"}  # tests/algo/test_advantages_verl_extra.py
    assert set(list_advantage_estimators()) == tested


def test_value_loss_hand_computed():
    from credo.algo import value_loss

    # V = [1.0, 0.2], V_old = [0.0, 0.0], Ret = [0.8, 1.0], clip 0.5:
    # token 0: (1.0-0.8)^2 = 0.04; clipped V = 0.5 -> (0.5-0.8)^2 = 0.09 -> max 0.09 (clipped term larger)
    # token 1: (0.2-1.0)^2 = 0.64; clipped V = 0.2 -> 0.64 -> max 0.64
    # L = 0.5 * mean(0.09, 0.64) = 0.1825
    values = torch.tensor([[1.0, 0.2]], requires_grad=True)
    out = value_loss(values, torch.zeros(1, 2), torch.tensor([[0.8, 1.0]]), torch.ones(1, 2), cliprange_value=0.5)
    assert out.loss.item() == pytest.approx(0.1825)
    assert out.metrics["vf_clipfrac"] == pytest.approx(0.5)
    out.loss.backward()
    # gradient: token 0 comes from the clipped branch (constant in V) -> 0; token 1: 0.5 * 2 (0.2-1.0) / 2 = -0.4
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.4]]))
