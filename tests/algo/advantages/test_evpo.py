"""EVPO's residual-variance metrics (credo/algo/advantages/evpo.py; docs/algorithms/evpo.md, "Evidence")."""
import pytest
import torch

from credo.algo import compute_advantages

# two groups of three outcome rewards, three loss tokens each: with gamma = lam = 1 every token's return is R
REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])
MASK = torch.ones(6, 3)
N = 18  # loss tokens; variances are unbiased (n - 1 = 17)
GROUP_VAR = 3 * (1 / 9 + 4 / 9 + 1 / 9 + 1 / 9 + 1 / 9 + 4 / 9) / (N - 1)  # R - mean_g R: +-1/3, +-2/3
BATCH_VAR = N * 0.25 / (N - 1)  # R - 0.5 = +-0.5


def _evpo(values):
    return compute_advantages("evpo", rewards=REWARDS, group_ids=GROUPS, response_mask=MASK,
                              values=values[:, None].expand(6, 3)).metrics


def test_residual_variances_hand_computed_when_the_critic_wins():
    m = _evpo(0.9 * REWARDS + 0.05)  # residual R - V = 0.1 R - 0.05 = +-0.05
    assert m["evpo/resid_var_group"] == pytest.approx(GROUP_VAR, rel=1e-5)
    assert m["evpo/resid_var_batch"] == pytest.approx(BATCH_VAR, rel=1e-5)
    assert m["evpo/resid_var_critic"] == pytest.approx(N * 0.05 ** 2 / (N - 1), rel=1e-4)
    assert m["evpo/use_critic"] == 1.0
    assert m["evpo/resid_var_chosen"] == pytest.approx(m["evpo/resid_var_critic"])
    assert m["evpo/picked_lower"] == 1.0


def test_a_wrong_critic_falls_back_to_the_group_baseline():
    m = _evpo(1.0 - (0.9 * REWARDS + 0.05))  # residual 1.9 R - 0.95 = +-0.95: EV < 0
    assert m["evpo/use_critic"] == 0.0
    assert m["evpo/resid_var_critic"] == pytest.approx(N * 0.95 ** 2 / (N - 1), rel=1e-4)
    assert m["evpo/resid_var_chosen"] == pytest.approx(GROUP_VAR, rel=1e-5)
    assert m["evpo/picked_lower"] == 1.0


def test_critic_better_than_the_batch_mean_but_worse_than_the_group_mean_is_reported():
    # V = 0.5 + 0.02 (2R - 1): residual +-0.48, so Var between the group's (+-0.471 rms) and the batch's (+-0.5):
    # EV > 0 picks the critic, whose residual variance exceeds the group baseline's -> picked_lower = 0
    m = _evpo(0.5 + 0.02 * (2 * REWARDS - 1))
    assert 0 < m["evpo/explained_variance"] < 0.1 and m["evpo/use_critic"] == 1.0
    assert GROUP_VAR < m["evpo/resid_var_chosen"] < BATCH_VAR
    assert m["evpo/resid_var_chosen"] == pytest.approx(N * 0.48 ** 2 / (N - 1), rel=1e-4)
    assert m["evpo/picked_lower"] == 0.0
