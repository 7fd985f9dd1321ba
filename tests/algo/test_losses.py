"""Every registered policy loss: value and gradient in each region of its weight table (arithmetic in
comments), float64 gradcheck, the equalities the spec states, mask types, micro-batch invariance."""
from __future__ import annotations

import math

import pytest
import torch

from credo.algo import AggNorm, compute_policy_loss, list_policy_losses
from credo.algo.losses.entropy_split import low_entropy_mask

D = torch.float64


def T(x):
    return torch.tensor(x, dtype=D)


def _row(ratios, advs):
    """One response: old_logprobs = 0, logprobs = log r (so the ratio is exactly r)."""
    r = torch.tensor([ratios], dtype=D)
    lp = r.log().requires_grad_(True)
    return lp, torch.zeros_like(r), torch.tensor([advs], dtype=D), torch.ones_like(r)


def _loss_and_grad(name, lp, old, adv, mask, **kw):
    out = compute_policy_loss(name, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, **kw)
    (grad,) = torch.autograd.grad(out.loss, lp)
    return out, grad


def _close(a, b):
    torch.testing.assert_close(torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D), rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- GPPO / CE-GPPO

def test_gppo_regions():
    lp, old, adv, mask = _row([1.1, 1.5, 0.5, 2.0, 12.0, 0.5], [1, 1, -1, -1, -1, 1])
    out, grad = _loss_and_grad("gppo", lp, old, adv, mask)  # clip 0.2 / 0.28, clip_c 10
    # A=+1 r=1.1: -1.1, w=r=1.1                -> dL/dlp = -A w = -1.1
    # A=+1 r=1.5 > 1.28: -1.28, w=1.28 (PPO 0) -> -1.28
    # A=-1 r=0.5 < 0.8: 0.8, w=0.8 (PPO 0)     -> +0.8
    # A=-1 r=2.0: 2.0, w=2                     -> +2.0
    # A=-1 r=12 > 10: min(12, 10) = 10, w=0    -> 0
    # A=+1 r=0.5 (lower bound is not pessimistic for A>0): -0.5, w=0.5 -> -0.5
    _close(out.loss, (-1.1 - 1.28 + 0.8 + 2.0 + 10.0 - 0.5) / 6)
    _close(grad, T([[-1.1, -1.28, 0.8, 2.0, 0.0, -0.5]]) / 6)
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 6)  # tokens 2 and 3
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / 6)  # token 5


def test_cegppo_regions():
    lp, old, adv, mask = _row([1.1, 1.5, 0.5, 2.0, 12.0, 0.5], [1, 1, -1, -1, -1, 1])
    out, grad = _loss_and_grad("cegppo", lp, old, adv, mask)  # beta1 0.75, beta2 1, clip 0.2/0.2, c 10
    # A=+1 r=1.1: -1.1, w 1.1
    # A=+1 r=1.5 in C_high: -beta2 (1.2) A = -1.2, w = beta2 1.2 = 1.2
    # A=-1 r=0.5 in C_low: -beta1 0.8 A = 0.75*0.8 = 0.6, w = 0.6 -> dL/dlp = +0.6
    # A=-1 r=2: 2, w 2; A=-1 r=12: 10, w 0; A=+1 r=0.5: -0.5, w 0.5
    _close(out.loss, (-1.1 - 1.2 + 0.6 + 2.0 + 10.0 - 0.5) / 6)
    _close(grad, T([[-1.1, -1.2, 0.6, 2.0, 0.0, -0.5]]) / 6)
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 6)  # C_low and C_high


def _random_case(seed=0, b=4, t=7, scale=0.6):
    g = torch.Generator().manual_seed(seed)
    lp = (-1.0 + scale * torch.randn(b, t, generator=g, dtype=D)).requires_grad_(True)
    old = -1.0 + scale * torch.randn(b, t, generator=g, dtype=D)
    adv = torch.randn(b, 1, generator=g, dtype=D).expand(b, t).contiguous()
    adv[0, :3] = -adv[0, :3]  # token-level advantages of both signs
    mask = torch.rand(b, t, generator=g) > 0.25
    ent = torch.rand(b, t, generator=g, dtype=D) * 3
    ref = -1.0 + scale * torch.randn(b, t, generator=g, dtype=D)
    return lp, old, adv, mask, ent, ref


def test_cegppo_with_unit_betas_equals_gppo_and_gppo_value_equals_ppo():
    lp, old, adv, mask, _, _ = _random_case(1, scale=1.0)
    a, ga = _loss_and_grad("cegppo", lp, old, adv, mask, beta1=1.0, beta2=1.0, clip_high=0.28)
    b, gb = _loss_and_grad("gppo", lp, old, adv, mask, clip_high=0.28)
    _close(a.loss, b.loss)
    assert (ga - gb).abs().max().item() == 0.0  # exactly equal, as the spec's unit test states
    c, gc = _loss_and_grad("ppo", lp, old, adv, mask, clip_high=0.28, clip_c=10.0)
    _close(b.loss, c.loss)  # same forward value ...
    assert not torch.allclose(gb, gc)  # ... different gradients (the preserved ones)


# ----------------------------------------------------------------------------- ASPO / Archer

ENT = [1.0, 9.0, 2.0, 3.0, 4.0, 5.0]  # 0.8 quantile of the sorted row [1,2,3,4,5,9]: position 4 -> 5.0


def test_entropy_split_quantile_and_ties():
    low = low_entropy_mask(torch.tensor([ENT]), torch.ones(1, 6))
    assert low.tolist() == [[True, False, True, True, True, True]]  # only H=9 is above 5.0
    # linear interpolation: [1..5] -> position 3.2 -> 4.2; ties go to "low"; padding is never low
    low = low_entropy_mask(torch.tensor([[1.0, 2, 3, 4, 5, 7]]), torch.tensor([[1, 1, 1, 1, 1, 0]]))
    assert low.tolist() == [[True, True, True, True, False, False]]
    assert low_entropy_mask(torch.ones(1, 4), torch.ones(1, 4)).all()
    assert low_entropy_mask(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.long)).sum() == 0


def test_aspo_regions():
    lp, old, adv, mask = _row([1.1, 1.3, 0.2, 0.5, 2.0, 4.0], [1, 1, 1, -1, -1, -1])
    ent = torch.tensor([ENT], dtype=D)  # token 2 is high-entropy (eps 0.4), the rest low (eps 0.2)
    out, grad = _loss_and_grad("aspo", lp, old, adv, mask, entropy=ent, kl_coef=0.0)
    # A=+1 r=1.1 (low, eps .2): q=1.1, value -1/1.1, w=1/r                  -> -1/1.1
    # A=+1 r=1.3 (HIGH, eps .4): 1.3 <= 1.4, value -1/1.3, w=1/1.3           -> -1/1.3
    # A=+1 r=0.2 < 1/c=1/3: soft dual clip, L = -A c log pi = -3 ln 0.2, w=3 -> -3
    # A=-1 r=0.5 < 0.8: p = 0.8, value 0.8, w=0                              -> 0
    # A=-1 r=2.0: value 2, w=r=2                                             -> +2
    # A=-1 r=4.0 > c=3: soft dual clip, L = -A c log pi = 3 ln 4, w=3        -> +3
    expected = [-1 / 1.1, -1 / 1.3, -3 * math.log(0.2), 0.8, 2.0, 3 * math.log(4.0)]
    _close(out.loss, sum(expected) / 6)
    _close(grad, T([[-1 / 1.1, -1 / 1.3, -3.0, 0.0, 2.0, 3.0]]) / 6)
    assert out.metrics["high_entropy_frac"] == pytest.approx(1 / 6)
    assert out.metrics["aspo_pos_dual_frac"] == pytest.approx(1 / 6)
    assert out.metrics["aspo_neg_dual_frac"] == pytest.approx(1 / 6)
    # the same r=1.3 token as a low-entropy token (eps 0.2) is above 1.2: hard clip, w = 0
    _, grad_low = _loss_and_grad("aspo", lp, old, adv, mask, entropy=torch.ones(1, 6, dtype=D), kl_coef=0.0)
    assert grad_low[0, 1].item() == 0.0


def test_aspo_kl_term_all_and_low_entropy():
    lp, old, adv, mask = _row([1.1, 1.3, 0.2, 0.5, 2.0, 4.0], [1, 1, 1, -1, -1, -1])
    ent = torch.tensor([ENT], dtype=D)
    ref = lp.detach() - torch.tensor([[0.1, 0.5, 0.1, 0.1, 0.1, 0.1]], dtype=D)
    base = compute_policy_loss("aspo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask,
                               entropy=ent, kl_coef=0.0).loss
    k3 = lambda x: math.exp(-x) + x - 1  # k3 with logprobs - ref = x: e^{-x} - (-x) - 1  # noqa: E731
    for kl_on, expected in (("all", (5 * k3(0.1) + k3(0.5)) / 6), ("low_entropy", k3(0.1))):
        out = compute_policy_loss("aspo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask,
                                  entropy=ent, ref_logprobs=ref, kl_coef=0.001, kl_on=kl_on)
        _close(out.loss - base, 0.001 * expected)
        assert out.metrics["aspo_kl_loss"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        compute_policy_loss("aspo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, entropy=ent)
    with pytest.raises(ValueError, match="needs entropy"):
        compute_policy_loss("aspo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, kl_coef=0.0)


def test_archer_regions_and_kl_sets():
    lp, old, adv, mask = _row([1.1, 1.4, 1.3, 0.5, 5.0, 12.0], [1, 1, 1, -1, -1, -1])
    ent = torch.tensor([ENT], dtype=D)  # token 2 high-entropy (eps 0.5), others low (eps 0.2)
    out, grad = _loss_and_grad("archer", lp, old, adv, mask, entropy=ent, low_entropy_kl_coef=0.0)
    # A=+1 r=1.1 low: -1.1, w 1.1 | A=+1 r=1.4 HIGH (<= 1.5): -1.4, w 1.4 | A=+1 r=1.3 low (> 1.2): -1.2, w 0
    # A=-1 r=0.5 low (< 0.8): 0.8, w 0 | A=-1 r=5: 5, w 5 | A=-1 r=12 > c=10: 10, w 0
    _close(out.loss, (-1.1 - 1.4 - 1.2 + 0.8 + 5.0 + 10.0) / 6)
    _close(grad, T([[-1.1, -1.4, 0.0, 0.0, 5.0, 0.0]]) / 6)
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 6)
    # KL: 0.001 * mean over the 5 low-entropy tokens + 0.0 * mean over the high-entropy one
    ref = lp.detach() - torch.tensor([[0.2, 0.7, 0.2, 0.2, 0.2, 0.2]], dtype=D)
    with_kl = compute_policy_loss("archer", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask,
                                  entropy=ent, ref_logprobs=ref)
    k3_02 = math.exp(-0.2) + 0.2 - 1
    _close(with_kl.loss - out.loss, 0.001 * k3_02)
    assert with_kl.metrics["kl_loss_high_entropy"] == pytest.approx(math.exp(-0.7) + 0.7 - 1)


# ----------------------------------------------------------------------------- GSPO / GMPO / SAPO / CISPO

def test_gspo_sequence_ratio_and_forced_aggregation():
    old = torch.zeros(3, 2, dtype=D)
    lp = torch.tensor([[0.1, -0.3], [0.5, 0.5], [0.5, 0.5]], dtype=D, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]], dtype=D)
    out, grad = _loss_and_grad("gspo", lp, old, adv, torch.ones(3, 2), agg="token-mean")
    # row 0: s = (0.1 - 0.3)/2 = -0.1, rho = e^-0.1 = 0.904837 < 1 - 3e-4, A > 0: unclipped, w = e^s
    # row 1: s = 0.5, rho = 1.648721 > 1 + 4e-4, A < 0: unclipped (pessimistic), w = e^0.5
    # row 2: s = 0.5, A > 0: clipped at 1.0004, w = 0
    # forced seq-mean-token-mean: mean over rows of the per-row token means
    r0, r1 = math.exp(-0.1), math.exp(0.5)
    _close(out.loss, (-r0 + r1 - 1.0004) / 3)
    _close(grad, T([[-r0, -r0], [r1, r1], [0.0, 0.0]]) / 6)  # 1/3 rows x 1/2 tokens
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 6)


def test_gmpo_geometric_mean_with_log_space_clip():
    old = torch.zeros(2, 2, dtype=D)
    lp = torch.tensor([[0.5, 0.1], [-0.5, 0.2]], dtype=D, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=D)
    out, grad = _loss_and_grad("gmpo", lp, old, adv, torch.ones(2, 2), agg="token-mean")
    # row 0 (A>0): d~ = min(d, clip(d, -.4, .4)) = [0.4, 0.1] -> rho = e^0.25 = 1.284025, L = -1.284025
    # row 1 (A<0): d~ = max(d, clip(d)) = [-0.4, 0.2] -> rho = e^-0.1 = 0.904837, L = +0.904837
    # plain mean over sequences; d rho / d lp_t = rho / |y| on unclipped tokens, 0 on clipped ones
    a, b = math.exp(0.25), math.exp(-0.1)
    _close(out.loss, (-a + b) / 2)
    _close(grad, T([[0.0, -a / 2], [0.0, b / 2]]) / 2)
    assert out.metrics["pg_clipfrac"] == pytest.approx(1 / 4)
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / 4)


def test_sapo_soft_gate():
    lp, old, adv, mask = _row([1.5, 0.5, 1.0], [1, -1, 1])
    out, grad = _loss_and_grad("sapo", lp, old, adv, mask)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    s1, s2, s3 = sig(1.0 * 0.5), sig(1.05 * -0.5), sig(0.0)
    # f = sigmoid(tau (r-1)) 4/tau; L = -A f; w = 4 s (1-s) r (tau_pos 1.0, tau_neg 1.05)
    _close(out.loss, (-4 * s1 + s2 * 4 / 1.05 - 4 * s3) / 3)
    w = [4 * s1 * (1 - s1) * 1.5, 4 * s2 * (1 - s2) * 0.5, 4 * s3 * (1 - s3) * 1.0]
    _close(grad, T([[-w[0], w[1], -w[2]]]) / 3)
    assert w[2] == pytest.approx(1.0)  # f'(1) = 1: plain policy-gradient weight at r = 1


def test_cispo_clipped_detached_weight():
    lp, old, adv, mask = _row([7.0, 0.5, 1.2], [1, -1, 1])
    out, grad = _loss_and_grad("cispo", lp, old, adv, mask)
    # w = sg[clip(r, 0, 5)]: [5, 0.5, 1.2]; L = -w A log pi; dL/dlp = -A w (never 0)
    _close(out.loss, (-5 * math.log(7) + 0.5 * math.log(0.5) - 1.2 * math.log(1.2)) / 3)
    _close(grad, T([[-5.0, 0.5, -1.2]]) / 3)
    assert out.metrics["pg_clipfrac"] == pytest.approx(1 / 3)


# ----------------------------------------------------------------------------- Clip-Cov / KL-Cov

def _cov_case(delta0=0.0):
    # A = [3, -3, 3, -3] (mean 0); log pi = [-0.4, -3.5, -2.0, -2.1] (mean -2.0)
    # cov = A (lp + 2) = [4.8, 4.5, 0, 0.3]
    lp = torch.tensor([[-0.4, -3.5, -2.0, -2.1]], dtype=D, requires_grad=True)
    old = lp.detach().clone()
    old[0, 0] -= delta0
    return lp, old, torch.tensor([[3.0, -3.0, 3.0, -3.0]], dtype=D), torch.ones(1, 4)


def test_clip_cov_zeroes_high_covariance_tokens():
    lp, old, adv, mask = _cov_case()
    out, grad = _loss_and_grad("clip_cov", lp, old, adv, mask, clip_cov_ratio=0.5)
    # candidates 1 < cov < 5: tokens 0 and 1; k = max(floor(0.5 * 4), 1) = 2 -> both zeroed
    # remaining (r = 1): L = -A = [-3, 3] -> sum 0; dL/dlp = -A / 4 on tokens 2, 3
    _close(out.loss, 0.0)
    _close(grad, T([[0.0, 0.0, -0.75, 0.75]]))
    assert out.metrics["pg_clipfrac"] == pytest.approx(0.5)
    torch.manual_seed(0)
    one = compute_policy_loss("clip_cov", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)
    assert one.metrics["pg_clipfrac"] == pytest.approx(0.25)  # default ratio -> k = 1, chosen at random


def test_kl_cov_penalises_top_covariance_token():
    lp, old, adv, mask = _cov_case(delta0=0.2)
    out, grad = _loss_and_grad("kl_cov", lp, old, adv, mask)
    # k = max(1, floor(2e-4 * 4)) = 1 -> token 0 (cov 4.8): L = -A r + 0.1 |delta|, r = e^0.2
    # dL/dlp_0 = -3 e^0.2 + 0.1; other tokens r = 1: dL/dlp = -A
    r = math.exp(0.2)
    _close(out.loss, (-3 * r + 0.1 * 0.2 + 3 - 3 + 3) / 4)
    _close(grad, T([[-3 * r + 0.1, 3.0, -3.0, 3.0]]) / 4)
    assert out.metrics["kl_cov_frac"] == pytest.approx(0.25)


# ----------------------------------------------------------------------------- all losses

NEEDS_ENTROPY = {"aspo": {"kl_coef": 0.0}, "archer": {"low_entropy_kl_coef": 0.0}, "aepo": {}}


# Losses whose forward value is the objective they differentiate: torch.autograd.gradcheck applies.
TRUE_OBJECTIVE = ["archer", "bypass_mode", "clip_cov", "dro", "gmpo", "gpg", "kl_cov", "ppo", "sapo"]
# Losses whose gradient is defined through stop-gradients (preserved / flipped / detached weights):
# the numerical derivative of the value is not the gradient by design, so the autograd gradient is
# checked against an independent float64 implementation of the spec's weight table instead.
# dppo_tv / dppo_kl: their weight tables are checked in tests/algo/test_losses_verl_extra.py
SURROGATE = ["aepo", "aspo", "cegppo", "cispo", "dppo_kl", "dppo_tv", "gppo", "gspo"]


def test_every_registered_loss_is_covered_by_a_gradient_check():
    assert set(TRUE_OBJECTIVE) | set(SURROGATE) == set(list_policy_losses()) - {"test_scaled_pg"}


@pytest.mark.parametrize("name", TRUE_OBJECTIVE)
def test_gradcheck_float64(name):
    lp, old, adv, mask, ent, ref = _random_case(3)
    kw = {"entropy": ent, "ref_logprobs": ref} if name in NEEDS_ENTROPY else {}

    def f(x):
        torch.manual_seed(0)  # clip_cov picks tokens at random: the same pick on every call
        return compute_policy_loss(name, logprobs=x, old_logprobs=old, advantages=adv, response_mask=mask, **kw).loss

    assert torch.autograd.gradcheck(f, (lp,))


def _weights(name, r, a, low):
    """Reference gradient weights w (dL/dlogprob = -A w) from the spec's tables, elementwise."""
    def pick(*cases, default):
        out = default.clone()
        for cond, val in reversed(cases):
            out = torch.where(cond, val if torch.is_tensor(val) else torch.full_like(r, val), out)
        return out

    if name == "gppo":  # clip 0.2 / 0.28, c 10
        return pick(((a > 0) & (r > 1.28), 1.28), ((a < 0) & (r < 0.8), 0.8), ((a < 0) & (r > 10), 0.0), default=r)
    if name == "cegppo":  # beta1 0.75, beta2 1.0, clip 0.2 / 0.2, c 10
        return pick(((a > 0) & (r > 1.2), 1.2), ((a < 0) & (r < 0.8), 0.6), ((a < 0) & (r > 10), 0.0), default=r)
    if name == "cispo":  # clip(r, 0, 5)
        return r.clamp(0.0, 5.0)
    if name == "aepo":  # clip 0.2 / 0.2, c 3; high-entropy A>0 r>1.2 keeps weight 1.2 (rescale 1)
        return pick(((a > 0) & (r > 1.2) & ~low, 1.2), ((a > 0) & (r > 1.2), 0.0), ((a < 0) & (r < 0.8), 0.0),
                    ((a < 0) & (r > 3), 0.0), default=r)
    if name == "aspo":  # eps 0.2 (low entropy) / 0.4 (high), c 3
        eps = torch.where(low, torch.full_like(r, 0.2), torch.full_like(r, 0.4))
        pos = pick((r > 1 + eps, 0.0), (r < 1 / 3, 3.0), default=1 / r)
        neg = pick((r < 1 - eps, 0.0), (r > 3, 3.0), default=r)
        return torch.where(a < 0, neg, pos)
    raise KeyError(name)


@pytest.mark.parametrize("name", ["aepo", "aspo", "cegppo", "cispo", "gppo"])
def test_surrogate_gradients_match_the_weight_table(name):
    lp, old, adv, mask, ent, ref = _random_case(3, b=8, t=9, scale=1.0)
    kw = {"entropy": ent, "kl_coef": 0.0} if name == "aspo" else {"entropy": ent} if name == "aepo" else {}
    out, grad = _loss_and_grad(name, lp, old, adv, mask, **kw)
    r = (lp - old).detach().exp()
    low = low_entropy_mask(ent, mask)
    w = _weights(name, r, adv, low)
    expected = -adv * w * mask / mask.sum()  # token-mean
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-14)
    assert len({round(float(x), 6) for x in (w[mask] / r[mask]).flatten()}) > 2  # several regions were hit


def test_gspo_gradient_matches_sequence_weight():
    lp, old, adv, mask, _, _ = _random_case(7, b=8, t=5, scale=0.02)  # small ratios: both sides of the clip
    out, grad = _loss_and_grad("gspo", lp, old, adv, mask)
    n = mask.double().sum(-1, keepdim=True)
    s = (((lp - old) * mask).sum(-1, keepdim=True) / n.clamp(min=1)).detach()
    rho = s.exp().expand_as(lp)
    clipped = ((adv > 0) & (rho > 1 + 4e-4)) | ((adv < 0) & (rho < 1 - 3e-4))
    w = torch.where(clipped, torch.zeros_like(rho), rho)
    rows = float((n > 0).sum())
    expected = -adv * w * mask / (n.clamp(min=1) * rows)  # seq-mean-token-mean
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-14)
    assert 0 < int(clipped[mask].sum()) < int(mask.sum())


@pytest.mark.parametrize("name", sorted(set(list_policy_losses()) - {"test_scaled_pg"}))
def test_int_and_bool_masks_agree(name):
    lp, old, adv, mask, ent, ref = _random_case(4)
    kw = {"entropy": ent, "ref_logprobs": ref} if name in NEEDS_ENTROPY else {}
    outs = []
    for m in (mask, mask.long(), mask.int(), mask.double()):
        torch.manual_seed(0)
        outs.append(compute_policy_loss(name, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=m, **kw))
    for o in outs[1:]:
        assert o.loss.item() == outs[0].loss.item() and o.metrics == outs[0].metrics
    assert "pg_clipfrac" in outs[0].metrics and "ppo_kl" in outs[0].metrics


@pytest.mark.parametrize("name", sorted(set(list_policy_losses()) - {"clip_cov", "kl_cov", "test_scaled_pg"}))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_invariance(name, agg):
    """Per-call token statistics (Clip-Cov / KL-Cov counts, ASPO / Archer KL means) are excluded by design."""
    lp, old, adv, mask, ent, ref = _random_case(5, b=6)
    hp = NEEDS_ENTROPY.get(name, {})
    kw = {"entropy": ent} if name in NEEDS_ENTROPY else {}
    full = compute_policy_loss(name, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, agg=agg,
                               **kw, **hp)
    (g_full,) = torch.autograd.grad(full.loss, lp)
    norm = AggNorm.of(mask)
    total = 0.0
    for rows in (slice(0, 1), slice(1, 4), slice(4, 6)):
        kw_r = {"entropy": ent[rows]} if name in NEEDS_ENTROPY else {}
        total = total + compute_policy_loss(name, logprobs=lp[rows], old_logprobs=old[rows], advantages=adv[rows],
                                            response_mask=mask[rows], agg=agg, norm=norm, **kw_r, **hp).loss
    (g_split,) = torch.autograd.grad(total, lp)
    torch.testing.assert_close(total, full.loss)
    torch.testing.assert_close(g_split, g_full)


def test_aepo_preserves_high_entropy_clipped_gradients_and_upweights_their_advantages():
    lp, old, adv, mask = _row([1.5, 1.5, 1.1], [1, 1, 1])
    ent = torch.tensor([[1.0, 9.0, 2.0]], dtype=D)  # 0.8 quantile of [1, 2, 9] = 2 + 0.6*7 = 6.2: token 1 is high
    out, grad = _loss_and_grad("aepo", lp, old, adv, mask, entropy=ent, high_entropy_rescale=0.5,
                               high_entropy_adv_weight=1.0)
    # token 0 (low, r 1.5 > 1.2): PPO clip, value -1.2, w 0
    # token 1 (high, A -> 2 by the up-weight, r 1.5): preserved: value -2 * 0.5 * 1.2 = -1.2, grad -2 * 0.6 = -1.2
    # token 2 (low, r 1.1): value -1.1, w 1.1
    _close(out.loss, (-1.2 - 1.2 - 1.1) / 3)
    _close(grad, T([[0.0, -1.2, -1.1]]) / 3)
    assert out.metrics["preserved_frac"] == pytest.approx(1 / 3)


# ------------------------------------------------------------------ rows with zero advantage (update skipping)

# (loss, hyperparameters) pairs: every loss with its defaults, plus the KL-free settings that make ASPO and
# Archer inert. The trainer drops rows whose advantages are all zero only where policy_loss_inert says so.
# Clip-Cov / KL-Cov select tokens by a covariance centred over the call and by a count of the call's tokens:
# the settings below select enough tokens for the coupling to show on this small case.
_COV = {"clip_cov": {"clip_cov_lb": -10.0, "clip_cov_ratio": 0.2}, "kl_cov": {"kl_cov_ratio": 0.2}}
INERT_CASES = [(n, _COV.get(n, {})) for n in sorted(set(list_policy_losses()) - {"test_scaled_pg"})] + [
    ("aspo", {"kl_coef": 0.0}), ("archer", {"low_entropy_kl_coef": 0.0}),
    ("bypass_mode", {"loss_type": "reinforce", "rollout_is": "token", "rollout_is_batch_normalize": True})]


@pytest.mark.parametrize("name,hp", INERT_CASES)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_zero_advantage_rows_are_inert_exactly_where_declared(name, hp, agg):
    """Declared inert: the zero-advantage rows get zero gradient, and the loss and gradients of the other rows
    are the same with those rows left out (same normalisers). Declared not inert: one of the two fails, so the
    declaration is not merely conservative."""
    from credo.algo import policy_loss_inert

    lp, old, adv, mask, ent, ref = _random_case(6, b=6, t=8)
    adv = adv.clone()
    adv[[1, 4]] = 0.0  # two rows of a group with equal rewards
    keep = torch.tensor([0, 2, 3, 5])
    norm = AggNorm.of(mask)

    def run(rows):
        kw = {"entropy": ent[rows], "ref_logprobs": ref[rows]} if name in NEEDS_ENTROPY else {}
        torch.manual_seed(0)
        out = compute_policy_loss(name, logprobs=lp[rows], old_logprobs=old[rows], advantages=adv[rows],
                                  response_mask=mask[rows], agg=agg, norm=norm, **kw, **hp)
        (g,) = torch.autograd.grad(out.loss, lp)
        return out.loss.detach(), g

    full_loss, g_full = run(torch.arange(6))
    part_loss, g_part = run(keep)
    same = bool(torch.allclose(part_loss, full_loss, rtol=1e-12, atol=1e-14)
                and torch.allclose(g_part, g_full, rtol=1e-12, atol=1e-14))
    zero_rows = bool((g_full[[1, 4]] == 0).all())
    if policy_loss_inert(name, hp):
        assert zero_rows and same
    else:
        assert not (zero_rows and same)
    if name in ("aspo", "archer") and not hp:
        assert not policy_loss_inert(name, hp)  # the default KL term reaches every row


# ------------------------------------------------------------------ calls with no loss tokens (issue 33 item 11)

def _empty_call(name, agg="token-mean", b=3, t=4, **hp):
    """``name`` on a (b, t) case whose response mask is all zeros; returns (LossOutput, d loss / d logprobs)."""
    lp, old, adv, _, ent, ref = _random_case(8, b=b, t=t)
    out = compute_policy_loss(name, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=torch.zeros(b, t),
                              entropy=ent, ref_logprobs=ref, agg=agg, **hp)
    (grad,) = torch.autograd.grad(out.loss, lp)
    return out, grad


_RS = ["", "token_k1", "seq_sum_k2", "seq_mean_k3", "seq_max_k2", "token_k1,seq_max_k3"]
BYPASS_EMPTY = [dict(loss_type=lt, rollout_is=level, rollout_rs=rs, rollout_rs_threshold=2.0 if rs else None)
                for lt in ("ppo_clip", "reinforce") for level in ("none", "token", "sequence") for rs in _RS] + [
    dict(loss_type="reinforce", rollout_is=level, rollout_is_low=0.5, rollout_is_batch_normalize=True,
         rollout_rs="token_k2", rollout_rs_threshold=2.0) for level in ("token", "sequence")]


@pytest.mark.parametrize("hp", BYPASS_EMPTY, ids=lambda hp: "-".join(str(v) for v in hp.values() if v))
def test_bypass_mode_with_no_loss_tokens_returns_zero_without_rollout_corr_metrics(hp):
    """docs/algorithms/bypass_mode.md: a call with no loss tokens logs no rollout_corr/* metrics (verl raises); the
    loss is 0 (every token is off the mask) and its gradient is defined and 0."""
    out, grad = _empty_call("bypass_mode", **hp)
    assert out.loss.item() == 0.0
    assert torch.equal(grad, torch.zeros_like(grad))
    assert not [k for k in out.metrics if k.startswith("rollout_corr/")]
    assert out.metrics["pg_clipfrac"] == 0.0 and out.metrics["ppo_kl"] == 0.0  # means over no token: 0


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_bypass_mode_with_every_loss_token_rejected(loss_type):
    """Tokens on the mask, all rejected (seq_max_k2 with a bound below every row's max): the loss and gradient are 0,
    rejected tokens still count in the normaliser, and the rejection metrics say everything was rejected."""
    lp, old, adv, mask, _, _ = _random_case(9, b=3, t=4)
    mask[:, 0] = True  # a token in every row
    n = float(mask.sum())
    out = compute_policy_loss("bypass_mode", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask,
                              loss_type=loss_type, rollout_is="token", rollout_rs="seq_max_k2",
                              rollout_rs_threshold=1e-12)  # k2 = lr^2 / 2 > 1e-12 wherever lp != old
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert out.loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    m = out.metrics
    # masked fraction: vmean(1 - keep, mask) = n / (n + 1e-8); every row has a rejected token: 3 / 3 rows
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(n / (n + 1e-8), rel=1e-12)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0
    assert m["rollout_corr/rollout_rs_seq_max_k2_seq_masked_fraction"] == 1.0
    assert m["pg_clipfrac"] == 0.0 and m["ppo_kl"] == 0.0  # over the kept tokens: none


@pytest.mark.parametrize("name", sorted(set(list_policy_losses()) - {"test_scaled_pg"}))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                                 "constant-norm"])
def test_every_loss_with_no_loss_tokens_is_zero_with_a_zero_gradient(name, agg):
    """A micro-batch with no loss tokens (every response empty or masked) is a valid call of every registered loss
    at its defaults: loss 0, gradient 0, finite metrics (a reduction over an empty selection must not raise)."""
    out, grad = _empty_call(name, agg)
    assert out.loss.item() == 0.0
    assert torch.equal(grad, torch.zeros_like(grad))
    assert all(math.isfinite(v) for v in out.metrics.values()), out.metrics
