"""PAPO's advantage-mass shares per polarity branch (credo/algo/advantages/papo.py; docs/algorithms/papo.md)."""
import pytest
import torch

from credo.algo import compute_advantages

REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0])  # one group: |A| equal on every token
GROUPS = torch.tensor([0, 0, 0, 0])
MASK = torch.ones(4, 2)
# D = S_k - C; P = -A D > 0 on column 0 of the A > 0 rows and column 1 of the A < 0 rows: half the tokens expand
DIRECTION = torch.tensor([[-1.0, 1.0]] * 4)


def _papo(history, **kw):
    return compute_advantages("papo", rewards=REWARDS, group_ids=GROUPS, response_mask=MASK,
                              entropy_direction=DIRECTION, entropy_history=history, **kw).metrics


@pytest.mark.parametrize("renormalize", [True, False])
def test_falling_entropy_moves_advantage_mass_to_the_expanding_branch(renormalize):
    m = _papo([2.0, 1.5], renormalize=renormalize)  # phi = -0.25: w+ = 1.25, w- = 0.75
    assert m["papo/expand_share_base"] == pytest.approx(0.5)
    assert m["papo/expand_share"] == pytest.approx(1.25 / (1.25 + 0.75))


def test_rising_entropy_moves_it_to_the_contracting_branch_and_no_phase_leaves_it():
    assert _papo([2.0, 2.5])["papo/expand_share"] == pytest.approx(0.75 / 2.0)  # phi = +0.25
    m = _papo([2.0, 1.5], phase_fn="none")
    assert m["papo/expand_share"] == pytest.approx(m["papo/expand_share_base"]) == pytest.approx(0.5)


def test_shares_are_zero_when_every_advantage_is_zero():
    m = compute_advantages("papo", rewards=torch.ones(4), group_ids=GROUPS, response_mask=MASK,
                           entropy_direction=DIRECTION, entropy_history=[2.0, 1.5]).metrics
    assert m["papo/expand_share"] == 0.0 and m["papo/expand_share_base"] == 0.0
