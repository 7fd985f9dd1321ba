"""verl 0.9.1's remaining policy losses: ``dppo_tv``, ``dppo_kl``, ``dro``, ``bypass_mode``.

Every value and gradient is worked by hand (float64, arithmetic in the comments) and is the value verl's formula
gives for the same inputs (``core_algos.compute_policy_loss_dppo_tv`` / ``_dppo_kl`` / ``_dro`` /
``_bypass_mode`` and ``rollout_corr_helper``), written next to it. token-mean aggregation unless stated.
"""
from __future__ import annotations

import math

import pytest
import torch

from credo.algo import compute_policy_loss, policy_loss_inert
from credo.algo.registry import POLICY_LOSSES

D = torch.float64
L = math.log


def T(x):
    return torch.tensor(x, dtype=D)


def _probs(p, p_old, advs):
    """One response with logprobs = log p, old_logprobs = log p_old (so r = p / p_old)."""
    lp = T([p]).log().requires_grad_(True)
    return lp, T([p_old]).log(), T([advs]), torch.ones(1, len(p), dtype=D)


def _ratios(ratios, advs):
    """One response with old_logprobs = 0, logprobs = log r (so the ratio is r)."""
    lp = T([ratios]).log().requires_grad_(True)
    return lp, torch.zeros_like(lp), T([advs]), torch.ones_like(lp)


def _run(name, lp, old, adv, mask, **kw):
    out = compute_policy_loss(name, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, **kw)
    (grad,) = torch.autograd.grad(out.loss, lp)
    return out, grad


def _close(a, b):
    torch.testing.assert_close(torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D), rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- DPPO

def test_dppo_tv_regions():
    p = [0.6, 0.7, 0.3, 0.4, 0.5, 0.1]
    p_old = [0.5, 0.5, 0.5, 0.5, 0.01, 0.9]
    lp, old, adv, mask = _probs(p, p_old, [1, 1, -1, -1, -1, 1])
    out, grad = _run("dppo_tv", lp, old, adv, mask)  # clip_low = clip_high = 0.15, clip_c 20
    # verl: valid = (p - p_old <= 0.15) if A > 0 else (p - p_old >= -0.15); L = -A min(r, 20) log p valid
    # t0 A=+1 p-p_old = +0.1 valid, r = 1.2:  L = -1.2 ln 0.6,  w = 1.2
    # t1 A=+1 +0.2 > 0.15: invalid, L = 0, w = 0
    # t2 A=-1 -0.2 < -0.15: invalid, L = 0, w = 0
    # t3 A=-1 -0.1 valid, r = 0.8:       L = +0.8 ln 0.4, w = 0.8 -> dL/dlp = +0.8
    # t4 A=-1 +0.49 valid (A<0 bounds only the fall), r = 50 -> min(50, 20) = 20: L = 20 ln 0.5, dL/dlp = +20
    # t5 A=+1 -0.8 valid (A>0 bounds only the rise), r = 1/9: L = -(1/9) ln 0.1, dL/dlp = -1/9
    vals = [-1.2 * L(0.6), 0.0, 0.0, 0.8 * L(0.4), 20 * L(0.5), -(1 / 9) * L(0.1)]
    _close(out.loss, sum(vals) / 6)
    _close(grad, T([[-1.2, 0.0, 0.0, 0.8, 20.0, -1 / 9]]) / 6)
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 6)  # verl: mean(1 - valid)
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / 6)  # verl: mean(1[r > 20] valid): t4
    ppo_kl = sum(L(b) - L(a) for a, b in zip(p, p_old)) / 6  # verl: mean(-(log p - log p_old))
    assert out.metrics["ppo_kl"] == pytest.approx(ppo_kl)


def _binary_kl(p_old, p):  # verl: p_old (log p_old - log p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    return p_old * (L(p_old) - L(p)) + (1 - p_old) * L((1 - p_old + 1e-8) / (1 - p + 1e-8))


def test_dppo_kl_regions():
    p = [0.6, 0.8, 0.1, 0.2, 0.5, 0.45]
    p_old = [0.5, 0.5, 0.5, 0.5, 0.01, 0.5]
    lp, old, adv, mask = _probs(p, p_old, [1, 1, 1, -1, -1, -1])
    out, grad = _run("dppo_kl", lp, old, adv, mask)  # clip_low = clip_high = 0.05, clip_c 20
    kl = [_binary_kl(b, a) for a, b in zip(p, p_old)]
    # t0 A=+1: D = 0.5 ln(0.5/0.6) + 0.5 ln(0.5/0.4) = 0.5 ln(1.0417) = 0.0204 <= 0.05: valid, w = r = 1.2
    # t1 A=+1: D = 0.5 ln(0.625) + 0.5 ln(2.5) = 0.5 ln 1.5625 = 0.2231 > 0.05 and p > p_old: invalid
    # t2 A=+1: D large, but p <= p_old (the safe direction for A > 0): valid, w = 0.2
    # t3 A=-1: D = 0.5 ln 2.5 + 0.5 ln 0.625 = 0.2231 > 0.05 and p < p_old: invalid
    # t4 A=-1: p >= p_old: valid, r = 50 truncated to 20
    # t5 A=-1: D = 0.5 ln(0.25 / 0.2475) = 0.00503 <= 0.05: valid, w = 0.9
    assert kl[0] == pytest.approx(0.5 * L(1.25 / 1.2), rel=1e-6) and kl[0] < 0.05
    assert kl[1] == pytest.approx(0.5 * L(1.5625), rel=1e-6) and kl[3] > 0.05 and kl[5] < 0.05
    w = [1.2, 0.0, 0.2, 0.0, 20.0, 0.9]
    a = [1, 1, 1, -1, -1, -1]
    _close(out.loss, sum(-ai * wi * L(pi) for ai, wi, pi in zip(a, w, p)) / 6)
    _close(grad, T([[-ai * wi for ai, wi in zip(a, w)]]) / 6)
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 6)
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / 6)


def _dppo_reference_weight(name, lp, old, adv):
    """Independent float64 weight table: w = min(r, 20) on valid tokens, 0 elsewhere (verl's masks)."""
    p, q = lp.exp(), old.exp()
    r = (lp - old).clamp(-20, 20).exp()
    if name == "dppo_tv":
        valid = torch.where(adv > 0, p - q <= 0.15, p - q >= -0.15)
    else:
        kl = q * (old - lp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        valid = torch.where(adv > 0, (kl <= 0.05) | (p <= q), (kl <= 0.05) | (p >= q))
    return torch.where(valid, r.clamp(max=20.0), torch.zeros_like(r)), valid


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_gradient_matches_the_weight_table(name):
    g = torch.Generator().manual_seed(11)
    old = torch.rand(8, 9, generator=g, dtype=D).clamp(0.02, 0.98).log()
    lp = (old + 0.8 * torch.randn(8, 9, generator=g, dtype=D)).clamp(max=-1e-3).requires_grad_(True)
    adv = torch.randn(8, 9, generator=g, dtype=D)
    mask = torch.rand(8, 9, generator=g) > 0.2
    out, grad = _run(name, lp, old, adv, mask)
    w, valid = _dppo_reference_weight(name, lp.detach(), old, adv)
    m = mask.to(D)
    torch.testing.assert_close(grad, -adv * w * m / m.sum(), rtol=1e-10, atol=1e-14)
    assert 0 < int((~valid)[mask].sum()) < int(mask.sum())  # both regions hit


def test_dppo_zero_advantage_and_bad_hyperparameters():
    assert policy_loss_inert("dppo_tv") and policy_loss_inert("dppo_kl")
    lp, old, adv, mask = _probs([0.9, 0.1], [0.1, 0.9], [0, 0])
    for name in ("dppo_tv", "dppo_kl"):
        out, grad = _run(name, lp, old, adv, mask)
        assert out.loss.item() == 0.0 and (grad == 0).all()
        with pytest.raises(ValueError, match="clip_c"):
            compute_policy_loss(name, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, clip_c=0.0)
        with pytest.raises(ValueError, match="thresholds"):
            compute_policy_loss(name, logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask,
                                clip_low=-0.1)


# ----------------------------------------------------------------------------- DRO

def test_dro_matches_verl_unit_case_and_gradient():
    # verl's own DRO test: old [-1, -0.7, -0.2], lp [-0.8, -0.9, -0.1], A [2, -1.5, 9], mask [1, 1, 0], beta 0.05
    # verl: L = -(lp A - beta/2 (lp - old)^2), token-mean over the 2 valid tokens
    # t0: -(-1.6 - 0.025 * 0.04) = 1.601;  t1: -(1.35 - 0.025 * 0.04) = -1.349;  mean = 0.252 / 2 = 0.126
    lp = T([[-0.8, -0.9, -0.1]]).requires_grad_(True)
    old, adv, mask = T([[-1.0, -0.7, -0.2]]), T([[2.0, -1.5, 9.0]]), T([[1.0, 1.0, 0.0]])
    out, grad = _run("dro", lp, old, adv, mask)  # default beta 0.05
    _close(out.loss, 0.126)
    # dL/dlp = -A + beta (lp - old): t0 -2 + 0.05 * 0.2 = -1.99; t1 1.5 + 0.05 * (-0.2) = 1.49; over 2 tokens
    _close(grad, T([[-1.99 / 2, 1.49 / 2, 0.0]]))
    assert out.metrics["ppo_kl"] == pytest.approx((-0.2 + 0.2) / 2, abs=1e-15)  # mean(old - lp) = (-0.2 + 0.2)/2
    out, grad = _run("dro", lp, old, adv, mask, beta=1.0)
    _close(grad, T([[(-2 + 0.2) / 2, (1.5 - 0.2) / 2, 0.0]]))


def test_dro_rejects_non_positive_beta_and_is_not_inert():
    lp, old, adv, mask = _ratios([1.5], [0.0])
    for beta in (0.0, -1.0):
        with pytest.raises(ValueError, match="beta"):
            compute_policy_loss("dro", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, beta=beta)
    out, grad = _run("dro", lp, old, adv, mask, beta=0.5)
    _close(grad, T([[0.5 * L(1.5)]]))  # A = 0: the penalty still pulls lp back to old
    assert not policy_loss_inert("dro")


# ----------------------------------------------------------------------------- bypass mode

def test_bypass_registration_flags():
    entry = POLICY_LOSSES["bypass_mode"]
    assert entry.uses_rollout_logprobs and not POLICY_LOSSES["ppo"].uses_rollout_logprobs
    assert policy_loss_inert("bypass_mode")
    assert policy_loss_inert("bypass_mode", {"rollout_is_batch_normalize": True})  # ppo_clip applies no weights
    assert not policy_loss_inert("bypass_mode", {"rollout_is_batch_normalize": True, "loss_type": "reinforce",
                                                 "rollout_is": "token"})


def test_bypass_ppo_clip_is_ppo_against_the_rollout_logprobs():
    g = torch.Generator().manual_seed(3)
    ro = -1.0 + 0.6 * torch.randn(4, 7, generator=g, dtype=D)
    lp = (ro + 0.5 * torch.randn(4, 7, generator=g, dtype=D)).requires_grad_(True)
    adv = torch.randn(4, 7, generator=g, dtype=D)
    mask = torch.rand(4, 7, generator=g) > 0.25
    kw = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0}
    a, ga = _run("bypass_mode", lp, ro, adv, mask, rollout_is="token", **kw)  # IS weights: metrics only
    b, gb = _run("ppo", lp, ro, adv, mask, **kw)
    _close(a.loss, b.loss)
    _close(ga, gb)
    for k in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        assert a.metrics[k] == pytest.approx(b.metrics[k])
    assert "rollout_corr/rollout_is_mean" in a.metrics and "rollout_corr/kl" in a.metrics


def test_bypass_reinforce_token_tis_and_icepop():
    lp, ro, adv, mask = _ratios([0.4, 1.5, 3.0, 0.8], [1, -1, 1, -1])
    out, grad = _run("bypass_mode", lp, ro, adv, mask, loss_type="reinforce", rollout_is="token")
    # verl: w = min(exp(lr), 2) * mask = [0.4, 1.5, 2.0, 0.8]; L = -A w log pi (reinforce, no clip)
    w = [0.4, 1.5, 2.0, 0.8]
    a = [1, -1, 1, -1]
    r = [0.4, 1.5, 3.0, 0.8]
    _close(out.loss, sum(-ai * wi * L(ri) for ai, wi, ri in zip(a, w, r)) / 4)
    _close(grad, T([[-ai * wi for ai, wi in zip(a, w)]]) / 4)
    m = out.metrics
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(sum(w) / (4 + 1e-8))  # verl masked_mean
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 4)  # raw 3.0 > 2
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 4)  # raw 0.4 < 1/2
    assert m["rollout_corr/kl"] == pytest.approx(-sum(L(x) for x in r) / 4)  # mean(rollout - lp)
    assert m["ppo_kl"] == pytest.approx(-sum(L(x) for x in r) / 4) and m["pg_clipfrac"] == 0.0
    # IcePop ("0.5_2.0" in verl): w = r if 0.5 <= r <= 2 else 0 -> [0, 1.5, 0, 0.8]
    out, grad = _run("bypass_mode", lp, ro, adv, mask, loss_type="reinforce", rollout_is="token",
                     rollout_is_low=0.5)
    _close(grad, T([[0.0, 1.5, 0.0, 0.8]]) / 4)
    assert out.metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 4)


def test_bypass_reinforce_sequence_is_and_batch_normalisation():
    ro = torch.zeros(2, 2, dtype=D)
    lp = T([[0.2, 0.3], [-0.1, -0.3]]).requires_grad_(True)
    adv = T([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2, dtype=D)
    out, grad = _run("bypass_mode", lp, ro, adv, mask, loss_type="reinforce", rollout_is="sequence")
    # verl sequence IS: w_i = min(exp(sum_t lr), 2): row 0 e^0.5 = 1.6487, row 1 e^-0.4 = 0.6703
    w0, w1 = math.exp(0.5), math.exp(-0.4)
    _close(grad, T([[-w0, -w0], [w1, w1]]) / 4)
    _close(out.loss, (-w0 * 0.5 + w1 * -0.4) / 4)  # -A w sum(lp) per row
    assert out.metrics["rollout_corr/rollout_is_max"] == pytest.approx(w0)  # exp(max row log-ratio)
    # batch normalisation (verl, sequence): mean over rows of the row mean weight, each with verl's +1e-8:
    # row mean = 2 w / (2 + 1e-8); mean = (row0 + row1) / 2; w -> w / mean
    mean = (2 * w0 / (2 + 1e-8) + 2 * w1 / (2 + 1e-8)) / 2
    out, grad = _run("bypass_mode", lp, ro, adv, mask, loss_type="reinforce", rollout_is="sequence",
                     rollout_is_batch_normalize=True)
    _close(grad, T([[-w0, -w0], [w1, w1]]) / (4 * mean))
    assert out.metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(mean)
    # token level: w = min(e^lr, 2) over 4 tokens, mean = sum / (4 + 1e-8)
    wt = [math.exp(0.2), math.exp(0.3), math.exp(-0.1), math.exp(-0.3)]
    mt = sum(wt) / (4 + 1e-8)
    out, grad = _run("bypass_mode", lp, ro, adv, mask, loss_type="reinforce", rollout_is="token",
                     rollout_is_batch_normalize=True)
    _close(grad, T([[-wt[0], -wt[1]], [wt[2], wt[3]]]) / (4 * mt))


def test_bypass_rejection_token_k1_lower_upper():
    lp, ro, adv, mask = _ratios([0.6, 0.7, 1.9, 2.1], [1, 1, -1, -1])
    out, grad = _run("bypass_mode", lp, ro, adv, mask, rollout_rs="token_k1", rollout_rs_threshold="0.5_1.5",
                     clip_c=10.0)
    # verl token_k1: stat = -lr, keep iff log 0.5 <= -lr <= log 1.5, i.e. 1/1.5 = 0.667 <= r <= 2
    # r = 0.6 rejected, 0.7 kept, 1.9 kept, 2.1 rejected; PPO-clip 0.2 on the kept ones:
    # t1 A=+1 r=0.7: L = -0.7, w = 0.7;  t2 A=-1 r=1.9: L = max(1.9, 1.2) = 1.9, w = 1.9
    # rejected tokens: L = 0, still counted in the token-mean denominator (4), as verl's global token count
    _close(out.loss, (-0.7 + 1.9) / 4)
    _close(grad, T([[0.0, -0.7, 1.9, 0.0]]) / 4)
    m = out.metrics
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / (4 + 1e-8))
    assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / (4 + 1e-8))
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0
    assert m["pg_clipfrac"] == 0.0  # over the 2 kept tokens: neither is clipped
    assert m["ppo_kl"] == pytest.approx(-(L(0.7) + L(1.9)) / 2)  # over the kept tokens, as verl


def test_bypass_rejection_seq_mean_k3():
    ro = torch.zeros(2, 3, dtype=D)
    lp = T([[0.1, -0.1, 0.0], [1.0, 0.0, 0.0]]).requires_grad_(True)
    adv = T([[1.0] * 3, [1.0] * 3])
    mask = T([[1, 1, 1], [1, 1, 0]])
    out, grad = _run("bypass_mode", lp, ro, adv, mask, loss_type="reinforce", rollout_rs="seq_mean_k3",
                     rollout_rs_threshold=0.1)
    # k3 = e^lr - 1 - lr; row 0: (e^0.1 - 1.1 + e^-0.1 - 0.9) / 3 = 0.010008 / 3 = 0.0033 <= 0.1: kept
    # row 1 (2 tokens): (e - 2 + 0) / 2 = 0.3591 > 0.1: rejected
    k3 = lambda x: math.exp(x) - 1 - x  # noqa: E731
    row1 = (k3(1.0) + k3(0.0)) / (2 + 1e-8)
    assert row1 > 0.1
    # reinforce without IS (rollout_is "none"): L = -A log pi on kept tokens; 5 tokens in the normaliser
    _close(grad, T([[-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]]) / 5)
    _close(out.loss, -(0.1 - 0.1 + 0.0) / 5)
    m = out.metrics
    assert m["rollout_corr/rollout_rs_seq_mean_k3_max"] == pytest.approx(row1)
    assert m["rollout_corr/rollout_rs_seq_mean_k3_seq_masked_fraction"] == pytest.approx(1 / 2)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / (5 + 1e-8))


def test_bypass_rejection_seq_max_k2_combined_with_token_k1():
    ro = torch.zeros(2, 2, dtype=D)
    lp = T([[0.3, -0.2], [0.05, 0.6]]).requires_grad_(True)
    adv = T([[-1.0, -1.0], [1.0, 1.0]])
    mask = torch.ones(2, 2, dtype=D)
    out, grad = _run("bypass_mode", lp, ro, adv, mask, loss_type="reinforce", rollout_rs="seq_max_k2",
                     rollout_rs_threshold="0.1")
    # k2 = lr^2 / 2: row 0 max(0.045, 0.02) = 0.045 <= 0.1 kept; row 1 max(0.00125, 0.18) = 0.18 rejected
    _close(grad, T([[1.0, 1.0], [0.0, 0.0]]) / 4)
    assert out.metrics["rollout_corr/rollout_rs_seq_max_k2_max"] == pytest.approx(0.18)
    # two options, one shared threshold string per option: token_k1 "2.0" -> bounds (1/2, 2) on -lr: all kept
    both, g2 = _run("bypass_mode", lp, ro, adv, mask, loss_type="reinforce", rollout_rs="token_k1,seq_max_k2",
                    rollout_rs_threshold="2.0,0.1")
    _close(g2, grad)


@pytest.mark.parametrize("kw,match", [
    ({"loss_type": "vanilla"}, "loss_type"),
    ({"rollout_is": "geo"}, "rollout_is"),
    ({"rollout_is_threshold": 0.0}, "rollout_is_threshold"),
    ({"rollout_is_low": 3.0}, "rollout_is_low"),
    ({"rollout_is_low": -1.0}, "rollout_is_low"),
    ({"rollout_rs": "token_k4", "rollout_rs_threshold": 1.0}, "unknown rollout_rs"),
    ({"rollout_rs": "token_k2"}, "must be set"),
    ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1_0.2"}, "one upper bound"),
    ({"rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "1,2,3"}, "entries"),
    ({"rollout_rs": "token_k1", "rollout_rs_threshold": "2.0_1.0"}, "lower <= upper"),
    ({"rollout_rs": "seq_sum_k3", "rollout_rs_threshold": -1.0}, "positive"),
    ({"rollout_rs": "seq_sum_k3", "rollout_rs_threshold": "abc"}, "invalid"),
])
def test_bypass_bad_hyperparameters_raise(kw, match):
    lp, ro, adv, mask = _ratios([1.0, 1.1], [1, -1])
    with pytest.raises(ValueError, match=match):
        compute_policy_loss("bypass_mode", logprobs=lp, old_logprobs=ro, advantages=adv, response_mask=mask, **kw)
