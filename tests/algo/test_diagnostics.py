"""credo.algo.diagnostics: the method-blind mech/* quantities, by hand (docs/algorithms/README.md, "Mechanism
diagnostics")."""
from __future__ import annotations

import math

import pytest
import torch

from credo.algo import compute_policy_loss
from credo.algo.diagnostics import (detached_logprob_grad, grad_share, logprob_grad, mechanism_metrics,
                                    pessimistic_clip_mask, subset_mean)

# one response of four loss tokens: A = +1, +1, -1, -1 and ratios r = 1.5, 1.1, 0.5, 0.9
A4 = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
R4 = torch.tensor([[1.5, 1.1, 0.5, 0.9]])
OLD4 = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
NEW4 = OLD4 + R4.log()
MASK4 = torch.ones(1, 4)


def _grad(name: str, logprobs, old, adv, mask, **hp) -> torch.Tensor:
    return detached_logprob_grad(lambda lp: compute_policy_loss(name, logprobs=lp, old_logprobs=old, advantages=adv,
                                                                response_mask=mask, **hp).loss, logprobs)


def test_pessimistic_clip_mask_takes_the_fixed_window_and_the_advantage_sign():
    # token 0: A > 0, r 1.5 > 1.2 -> in C;  token 1: r 1.1 inside;  token 2: A < 0, r 0.5 < 0.8 -> in C;
    # token 3: r 0.9 inside.  With the window 0.6 / 0.6 only r > 1.6 or r < 0.4 count: none.
    assert pessimistic_clip_mask(R4.log(), A4, MASK4).tolist() == [[True, False, True, False]]
    assert not pessimistic_clip_mask(R4.log(), A4, MASK4, clip_low=0.6, clip_high=0.6).any()
    # the optimistic side (A > 0 with r < 0.8, A < 0 with r > 1.2) is never in C, nor a padded token
    opt = pessimistic_clip_mask(torch.tensor([[0.5, 1.5, 1.5]]).log(), torch.tensor([[1.0, -1.0, 1.0]]),
                                torch.tensor([[1.0, 1.0, 0.0]]))
    assert opt.tolist() == [[False, False, False]]


def test_grad_share_and_subset_mean_by_hand():
    g = torch.tensor([[-3.0, 1.0, 0.0, 4.0]])
    subset = torch.tensor([[True, False, True, True]])
    within = torch.tensor([[True, True, True, False]])
    # within: |-3| + |1| + |0| = 4;  subset and within: |-3| + |0| = 3  ->  3 / 4
    assert grad_share(g, subset, within) == 0.75
    assert grad_share(torch.zeros(1, 4), subset, within) is None  # no gradient: undefined, left out
    # mean of g over subset: (-3 + 0 + 4) / 3
    assert subset_mean(g, subset) == pytest.approx(1.0 / 3.0)
    assert subset_mean(g, torch.zeros(1, 4, dtype=torch.bool)) is None


def test_ppo_clip_gives_zero_share_outside_its_window_and_gppo_keeps_a_bounded_one():
    # PPO-clip 0.2 / 0.2, token-mean over N = 4, g_t = dL/dlogprob_t = -A_t w_t / 4:
    #   token 0 (C): w 0;  token 1: w = r = 1.1 -> g = -0.275;  token 2 (C): w 0;  token 3: w = 0.9 -> g = +0.225
    ppo = _grad("ppo", NEW4, OLD4, A4, MASK4, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    assert torch.allclose(ppo, torch.tensor([[0.0, -0.275, 0.0, 0.225]]))
    m = mechanism_metrics(grad=ppo, logprobs=NEW4, old_logprobs=OLD4, advantages=A4, response_mask=MASK4)
    assert m["mech/clip_frac"] == 0.5  # 2 of 4 tokens in C
    assert m["mech/grad_share_clipped"] == 0.0  # exactly: PPO's clipped tokens carry no gradient
    # GPPO 0.2 / 0.28: token 0 (r 1.5 > 1.28): w 1.28 -> g = -0.32;  token 2 (r 0.5 < 0.8): w 0.8 -> g = +0.2;
    # tokens 1, 3 as PPO.  sum |g| = 0.32 + 0.275 + 0.2 + 0.225 = 1.02;  C carries 0.32 + 0.2 = 0.52
    gppo = _grad("gppo", NEW4, OLD4, A4, MASK4, clip_low=0.2, clip_high=0.28, clip_c=10.0)
    assert torch.allclose(gppo, torch.tensor([[-0.32, -0.275, 0.2, 0.225]]))
    m = mechanism_metrics(grad=gppo, logprobs=NEW4, old_logprobs=OLD4, advantages=A4, response_mask=MASK4)
    assert m["mech/grad_share_clipped"] == pytest.approx(0.52 / 1.02)
    assert m["mech/grad_share_clipped_pos"] == pytest.approx(0.32 / 1.02)  # the A > 0 side (CE-GPPO's beta2)
    assert m["mech/grad_share_clipped_neg"] == pytest.approx(0.20 / 1.02)  # the A < 0 side (CE-GPPO's beta1)
    # CE-GPPO with beta1 = 0.5, beta2 = 2 (clip 0.2 / 0.2): token 0 w = 2 * 1.2 = 2.4 -> |g| 0.6;
    # token 2 w = 0.5 * 0.8 = 0.4 -> |g| 0.1;  sum |g| = 0.6 + 0.275 + 0.1 + 0.225 = 1.2
    ce = _grad("cegppo", NEW4, OLD4, A4, MASK4, clip_low=0.2, clip_high=0.2, clip_c=10.0, beta1=0.5, beta2=2.0)
    m = mechanism_metrics(grad=ce, logprobs=NEW4, old_logprobs=OLD4, advantages=A4, response_mask=MASK4)
    assert m["mech/grad_share_clipped_pos"] == pytest.approx(0.6 / 1.2)
    assert m["mech/grad_share_clipped_neg"] == pytest.approx(0.1 / 1.2)


def test_drift_splits_by_each_responses_entropy_quantile():
    # entropies 0.1 0.2 0.3 0.4 2.0: the 0.8 quantile (linear) sits at position 0.8 * 4 = 3.2 ->
    # 0.4 + 0.2 * (2.0 - 0.4) = 0.72, so only the last token is high-entropy
    entropy = torch.tensor([[0.1, 0.2, 0.3, 0.4, 2.0]])
    old = torch.full((1, 5), math.log(0.5))
    delta = torch.tensor([[0.1, -0.1, 0.0, 0.2, 0.5]])
    m = mechanism_metrics(grad=torch.zeros(1, 5), logprobs=old + delta, old_logprobs=old,
                          advantages=torch.zeros(1, 5), response_mask=torch.ones(1, 5), entropy=entropy)
    assert m["mech/drift_high_entropy"] == pytest.approx(0.5)
    assert m["mech/drift_low_entropy"] == pytest.approx((0.1 + 0.1 + 0.0 + 0.2) / 4)  # 0.1
    assert m["mech/drift"] == pytest.approx(0.9 / 5)
    # no gradient at all and no positive token: the shares and the probability split are left out, not zero
    assert not {"mech/grad_share_clipped", "mech/grad_share_pos_highprob", "mech/drift_pos_highprob"} & set(m)
    # without an entropy there is no split
    m = mechanism_metrics(grad=torch.zeros(1, 5), logprobs=old + delta, old_logprobs=old,
                          advantages=torch.zeros(1, 5), response_mask=torch.ones(1, 5))
    assert "mech/drift_high_entropy" not in m and "mech/drift_low_entropy" not in m


def test_aspo_moves_positive_gradient_off_high_probability_tokens_that_rose():
    # two positive tokens (A = 1): a high-probability one (p = 0.95, r = 1.1) and a low-probability one
    # (p = 0.3, r = 0.5), plus a padded column.  Token-mean over N = 2:
    #   PPO-clip: |g| = r / 2 -> 0.55 and 0.25;  share of the high one = 1.1 / 1.6 = 0.6875
    #   ASPO (flipped ratio, w = 1/r inside [1/c, 1 + eps] = [1/3, 1.2 or 1.4]): |g| = 1 / (2 r) -> 1/2.2 and 1;  share = (1/1.1) / (1/1.1 + 2)
    old = torch.log(torch.tensor([[0.95, 0.3, 0.5]]))
    new = old + torch.tensor([[1.1, 0.5, 1.0]]).log()
    adv = torch.tensor([[1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    entropy = torch.tensor([[0.1, 0.2, 0.0]])
    ppo = _grad("ppo", new, old, adv, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    aspo = _grad("aspo", new, old, adv, mask, entropy=entropy, kl_coef=0.0)
    assert torch.allclose(aspo.abs(), torch.tensor([[1 / 2.2, 1.0, 0.0]]))
    kw = dict(logprobs=new, old_logprobs=old, advantages=adv, response_mask=mask)
    m_ppo, m_aspo = mechanism_metrics(grad=ppo, **kw), mechanism_metrics(grad=aspo, **kw)
    assert m_ppo["mech/grad_share_pos_highprob"] == pytest.approx(1.1 / 1.6)
    assert m_aspo["mech/grad_share_pos_highprob"] == pytest.approx((1 / 1.1) / (1 / 1.1 + 2.0))
    assert m_ppo["mech/pos_highprob_frac"] == 0.5  # 1 of the 2 positive tokens has p >= 0.9
    assert m_ppo["mech/drift_pos_highprob"] == pytest.approx(math.log(1.1))


def test_logprob_grad_reads_the_loss_graph_and_leaves_it_for_the_backward():
    theta = torch.tensor([0.3, -0.2, 0.1], requires_grad=True)
    logprobs = (theta * torch.tensor([1.0, 2.0, 3.0])).unsqueeze(0)  # a non-leaf, as the model's output is
    loss = (logprobs ** 2).sum()  # dL/dlogprobs = 2 logprobs = [0.6, -0.8, 0.6]
    g = logprob_grad(loss, logprobs)
    assert torch.allclose(g, torch.tensor([[0.6, -0.8, 0.6]])) and not g.requires_grad
    assert theta.grad is None  # nothing reached the parameters
    loss.backward()  # the graph is still there: dL/dtheta = 2 logprobs * [1, 2, 3]
    assert torch.allclose(theta.grad, torch.tensor([0.6, -1.6, 1.8]))
    # the same gradient from a detached copy; zeros where the log-probs carry no graph
    assert torch.allclose(detached_logprob_grad(lambda x: (x ** 2).sum(), logprobs), g)
    assert torch.equal(logprob_grad(torch.tensor(1.0), torch.ones(1, 3)), torch.zeros(1, 3))
