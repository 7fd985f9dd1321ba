"""verl 0.9.1's remaining estimators: OTB (single- and multi-turn) and GDPO, hand-computed values in float64.

Each expected value is worked out in the comments from verl's formulas (``core_algos.py``):
  OTB:  w_t = (1 - 2 pi_t + sum pi^2) rho_t^2,  W_t = cumsum(w m),  G_t = reverse cumsum(r m),
        B_t = sum_i G_t W_t m_t / (sum_i W_t m_t + 1e-8),  A_t = (G_t - B_t) m_t
  GDPO: A = masked_whiten(sum_k w_k GRPO(r_k)),  GRPO eps 1e-6, whitening (x - mean) / sqrt(var_unbiased + 1e-8)
"""
from __future__ import annotations

import math

import pytest
import torch

from credo.algo import compute_advantages
from credo.algo.advantages.gdpo import gdpo_advantage
from credo.algo.advantages.otb import sum_pi_squared_from_logits

D = torch.float64
EPS = 1e-8  # verl's OTB epsilon


def t(x):
    return torch.tensor(x, dtype=D)


def energy_inputs(pi, spp):
    """old_logprobs = log pi and sum_pi_squared as given, so w = 1 - 2 pi + spp."""
    return {"old_logprobs": t(pi).log(), "sum_pi_squared": t(spp)}


# Two trajectories of one prompt, T = 3. Row 0: 3 loss tokens, score 1; row 1: 2 loss tokens, score 3.
# Row 0: pi = spp = 0.5 -> w = 1 - 1 + 0.5 = 0.5 each -> W = [0.5, 1.0, 1.5]; G = [1, 1, 1]
# Row 1: pi = spp = 0.25 -> w = 0.75; pi = spp = 0.5 -> w = 0.5; (masked: pi = spp = 0.9 -> w = 0.1, not counted)
#        -> W = [0.75, 1.25, 1.25]; G = [3, 3, 0]
SINGLE = dict(rewards=t([1.0, 3.0]), group_ids=torch.tensor([0, 0]), response_mask=t([[1, 1, 1], [1, 1, 0]]),
              **energy_inputs([[0.5, 0.5, 0.5], [0.25, 0.5, 0.9]], [[0.5, 0.5, 0.5], [0.25, 0.5, 0.9]]))


def test_otb_hand_computed_with_zero_tail():
    out = compute_advantages("optimal_token_baseline", **SINGLE)
    # t0: B = (1 * 0.5 + 3 * 0.75) / (0.5 + 0.75 + eps) = 2.75 / 1.25 = 2.2
    # t1: B = (1 * 1.0 + 3 * 1.25) / (1.0 + 1.25 + eps) = 4.75 / 2.25 = 19/9
    # t2: only row 0: B = 1.5 / (1.5 + eps) ~ 1, but row 0 is the unique longest (3 > 2): B[0, 2:] = 0
    b0, b1 = 2.75 / (1.25 + EPS), 4.75 / (2.25 + EPS)
    expected = t([[1 - b0, 1 - b1, 1.0], [3 - b0, 3 - b1, 0.0]])  # [[-1.2, -10/9, 1], [0.8, 8/9, 0]]
    torch.testing.assert_close(out.advantages, expected, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(out.returns, t([[1, 1, 1], [3, 3, 0]]))
    assert out.advantages.dtype == D and out.returns.dtype == D
    assert out.advantages[0, 0].item() == pytest.approx(-1.2) and out.advantages[1, 1].item() == pytest.approx(8 / 9)
    # mean token energy over the 5 loss tokens: (0.5 * 3 + 0.75 + 0.5) / 5 = 0.55
    assert out.metrics["otb/token_energy_mean"] == pytest.approx(0.55)


def test_otb_without_zero_tail_keeps_the_self_baseline():
    out = compute_advantages("optimal_token_baseline", **SINGLE, handle_zero_tail=False)
    # t2 of row 0: A = 1 - 1 * 1.5 / (1.5 + eps) = eps / (1.5 + eps) ~ 6.7e-9: its own return cancels it
    assert out.advantages[0, 2].item() == pytest.approx(EPS / (1.5 + EPS), rel=1e-6)
    torch.testing.assert_close(out.advantages[:, :2], compute_advantages("optimal_token_baseline",
                                                                         **SINGLE).advantages[:, :2])


def test_otb_rollout_is_weights_scale_the_energy_by_rho_squared():
    rho = t([[1.0, 2.0, 1.0], [2.0, 1.0, 1.0]])
    out = compute_advantages("optimal_token_baseline", **SINGLE, rollout_is_weights=rho)
    # row 0: w = 0.5 * [1, 4, 1] = [0.5, 2, 0.5] -> W = [0.5, 2.5, 3.0]
    # row 1: w = [0.75 * 4, 0.5, -] = [3, 0.5] -> W = [3, 3.5, 3.5]
    # t0: B = (1 * 0.5 + 3 * 3) / 3.5 = 19/7;  t1: B = (1 * 2.5 + 3 * 3.5) / 6 = 13/6;  t2: zero tail for row 0
    b0, b1 = 9.5 / (3.5 + EPS), 13.0 / (6.0 + EPS)
    expected = t([[1 - b0, 1 - b1, 1.0], [3 - b0, 3 - b1, 0.0]])  # [[-12/7, -7/6, 1], [2/7, 5/6, 0]]
    torch.testing.assert_close(out.advantages, expected, rtol=1e-8, atol=1e-12)
    assert out.advantages[1, 0].item() == pytest.approx(2 / 7)


def test_otb_singleton_groups_get_the_returns():
    out = compute_advantages("optimal_token_baseline", **{**SINGLE, "group_ids": torch.tensor([0, 1])})
    torch.testing.assert_close(out.advantages, t([[1, 1, 1], [3, 3, 0]]))  # no baseline: A = G m
    assert out.metrics["otb/frac_singleton_groups"] == 1.0
    out = compute_advantages("tir_optimal_token_baseline", **{**SINGLE, "group_ids": torch.tensor([0, 1])})
    torch.testing.assert_close(out.advantages, t([[1, 1, 1], [3, 3, 0]]))


def test_otb_empty_row_in_a_group_single_turn_vs_tir():
    # row 1 has no loss token. verl's single-turn estimator still counts it in the group (N = 2): with the zero
    # tail, row 0 (length 3 > 0) gets no baseline at all (B[0, 0:] = 0) -> A = G; without it B_t = G W / (W + eps)
    # -> A ~ 0. The TIR estimator leaves empty rows out, so row 0 is alone: A = G either way.
    inputs = {**SINGLE, "response_mask": t([[1, 1, 1], [0, 0, 0]])}
    g = t([[1, 1, 1], [0, 0, 0]])
    torch.testing.assert_close(compute_advantages("optimal_token_baseline", **inputs).advantages, g)
    off = compute_advantages("optimal_token_baseline", **inputs, handle_zero_tail=False).advantages
    assert off.abs().max().item() < 1e-7  # eps / (W + eps) with W >= 0.5
    for zero_tail in (True, False):
        out = compute_advantages("tir_optimal_token_baseline", **inputs, handle_zero_tail=zero_tail)
        torch.testing.assert_close(out.advantages, g)


# Multi-turn: row 0 has an environment token at t1 (mask 0), row 1 is a plain 3-token answer. T = 4.
# Row 0: loss tokens t0, t2, t3 with w = 0.5 each (pi = spp = 0.5); env token pi = spp = 0.9 (not counted)
#        W = [0.5, 0.5, 1.0, 1.5] (packed [0.5, 1.0, 1.5]); score 1 on t3 -> G = [1, 1, 1, 1] (carried over t1)
# Row 1: w = [0.75, 0.5, 0.25] (pi = spp = 0.25; 0.5; pi = 0.5, spp = 0.25) -> W = [0.75, 1.25, 1.5, 1.5];
#        score 3 on t2 -> G = [3, 3, 3, 0]
MULTI = dict(rewards=t([1.0, 3.0]), group_ids=torch.tensor([7, 7]), response_mask=t([[1, 0, 1, 1], [1, 1, 1, 0]]),
             **energy_inputs([[0.5, 0.9, 0.5, 0.5], [0.25, 0.5, 0.5, 0.5]],
                             [[0.5, 0.9, 0.5, 0.5], [0.25, 0.5, 0.25, 0.5]]))


def test_tir_otb_aligns_by_loss_token_not_position():
    out = compute_advantages("tir_optimal_token_baseline", **MULTI)
    # packed k0: B = (1 * 0.5 + 3 * 0.75) / 1.25 = 2.2;  k1: (1 * 1.0 + 3 * 1.25) / 2.25 = 19/9;
    # k2: (1 * 1.5 + 3 * 1.5) / 3.0 = 2.0. Both have 3 loss tokens: no zero tail.
    b = [2.75 / (1.25 + EPS), 4.75 / (2.25 + EPS), 6.0 / (3.0 + EPS)]
    expected = t([[1 - b[0], 0.0, 1 - b[1], 1 - b[2]],  # [-1.2, 0, -10/9, -1]
                  [3 - b[0], 3 - b[1], 3 - b[2], 0.0]])  # [0.8, 8/9, 1, 0]
    torch.testing.assert_close(out.advantages, expected, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(out.returns, t([[1, 1, 1, 1], [3, 3, 3, 0]]))  # not masked: carried over t1

    single = compute_advantages("optimal_token_baseline", **MULTI)
    # by absolute position: t0: 2.2 as above; t1: row 0 masked -> B = 3 * 1.25 / (1.25 + eps) ~ 3 -> row 1 A ~ 0;
    # t2: (1 * 1.0 + 3 * 1.5) / 2.5 = 2.2; t3: row 1 masked -> B = 1 * 1.5 / (1.5 + eps) ~ 1 -> row 0 A ~ 0
    torch.testing.assert_close(single.advantages, t([[-1.2, 0, -1.2, 0], [0.8, 0, 0.8, 0]]), rtol=0, atol=1e-7)
    assert (out.advantages - single.advantages).abs().max().item() > 0.5


def test_tir_otb_zero_tail_is_in_loss_token_index():
    # row 1 loses its last loss token: lengths 3 (row 0) and 2 (row 1); row 0's packed k2 (absolute t3) is the
    # tail beyond the second-longest length 2: B = 0 there -> A = G = 1. Without the zero tail: A ~ 0.
    inputs = {**MULTI, "response_mask": t([[1, 0, 1, 1], [1, 1, 0, 0]])}
    # row 1 now: score 3 on t1 -> G = [3, 3, 0, 0]; W = [0.75, 1.25, ...]
    out = compute_advantages("tir_optimal_token_baseline", **inputs)
    b = [2.75 / (1.25 + EPS), 4.75 / (2.25 + EPS)]
    expected = t([[1 - b[0], 0.0, 1 - b[1], 1.0], [3 - b[0], 3 - b[1], 0.0, 0.0]])
    torch.testing.assert_close(out.advantages, expected, rtol=1e-8, atol=1e-12)
    off = compute_advantages("tir_optimal_token_baseline", **inputs, handle_zero_tail=False)
    assert off.advantages[0, 3].item() == pytest.approx(EPS / (1.5 + EPS), rel=1e-6)


def test_otb_token_rewards_and_dtypes():
    # (B, T) token rewards: row 0 gets 0.5 at t0 and t2 -> G = [1, 0.5, 0.5]; row 1 gets 3 at t1 -> G = [3, 3, 0]
    tok = t([[0.5, 0.0, 0.5], [0.0, 3.0, 9.0]])  # the 9 sits on a masked token: dropped
    out = compute_advantages("optimal_token_baseline", **{**SINGLE, "rewards": tok})
    torch.testing.assert_close(out.returns, t([[1, 0.5, 0.5], [3, 3, 0]]))
    # t0: B = 2.2 (G unchanged at t0); t1: B = (0.5 * 1.0 + 3 * 1.25) / 2.25 = 17/9 -> row 0: 0.5 - 17/9 = -25/18
    assert out.advantages[0, 1].item() == pytest.approx(0.5 - 4.25 / 2.25)
    f32 = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in SINGLE.items()}
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        assert compute_advantages(name, **f32).advantages.dtype == torch.float32
        assert compute_advantages(name, **SINGLE).advantages.dtype == D
        with pytest.raises(ValueError, match="needs old_logprobs, sum_pi_squared"):
            compute_advantages(name, rewards=SINGLE["rewards"], group_ids=SINGLE["group_ids"],
                               response_mask=SINGLE["response_mask"])


def test_sum_pi_squared_from_logits():
    # softmax([0, ln 3]) = [1/4, 3/4] -> 1/16 + 9/16 = 0.625 = exp(ln 10 - 2 ln 4)
    z = torch.tensor([[[0.0, math.log(3.0)], [5.0, 5.0]]], dtype=D)
    torch.testing.assert_close(sum_pi_squared_from_logits(z), t([[0.625, 0.5]]))
    big = torch.randn(2, 3, 50, dtype=D) * 4
    torch.testing.assert_close(sum_pi_squared_from_logits(big), big.softmax(-1).square().sum(-1))
    assert sum_pi_squared_from_logits(big.to(torch.bfloat16)).dtype == torch.float32


# GDPO: 2 prompts x 2 samples; two components. mask rows: [1, 1], [1, 0], [1, 1], [1, 1] (7 loss tokens)
GROUPS = torch.tensor([0, 0, 1, 1])
MASK = t([[1, 1], [1, 0], [1, 1], [1, 1]])
COMPS = {"acc": t([1.0, 0.0, 1.0, 1.0]), "fmt": t([1.0, 1.0, 0.0, 1.0])}
S = 0.5 / (math.sqrt(0.5) + 1e-6)  # GRPO of [1, 0] (or [0, 1]): +-(1 - 0.5) / (std([1, 0]) = sqrt(0.5) + 1e-6)


# verl's masked_whiten divides its means by n + 1e-8 (credo's too): a ~1e-9 relative shift from the plain
# mean / unbiased variance computed by hand below, hence rtol=1e-8 on whitened values
def whiten(x, mask):
    """verl masked_whiten by hand: (x - mean) / sqrt(unbiased var + 1e-8) over the mask's tokens."""
    vals = x[mask.bool()]
    return (x - vals.mean()) / math.sqrt(vals.var().item() + 1e-8) * mask


def test_gdpo_two_components_weighted_by_hand():
    out = compute_advantages("gdpo", rewards=COMPS["acc"] + COMPS["fmt"], group_ids=GROUPS, response_mask=MASK,
                             reward_components=COMPS, reward_weights=[1.0, 0.5])
    # acc: group 0 [1, 0] -> [S, -S]; group 1 [1, 1] -> [0, 0] (zero std).  fmt: [0, 0] and [-S, S].
    # sum with w = (1, 0.5): per row [S, -S, -S/2, S/2]; tokens (units of S) [1, 1, -1, -1/2, -1/2, 1/2, 1/2]
    # mean = 1/7; deviations 6/7, 6/7, -8/7, -9/14, -9/14, 5/14, 5/14; squares sum = 136/49 + 53/49 = 27/7;
    # unbiased var = 27/7 / 6 = 9/14 (times S^2)
    sd = math.sqrt(9 / 14 * S * S + 1e-8)
    expected = t([[6 / 7, 6 / 7], [-8 / 7, 0], [-9 / 14, -9 / 14], [5 / 14, 5 / 14]]) * S / sd
    torch.testing.assert_close(out.advantages, expected, rtol=1e-8, atol=1e-12)
    assert out.advantages[0, 0].item() == pytest.approx(6 / 7 / math.sqrt(9 / 14), rel=1e-5)  # ~1.0690
    assert out.advantages.dtype == D and out.returns is out.advantages
    assert out.metrics["gdpo/acc/frac_zero_std"] == 0.5 and out.metrics["gdpo/fmt/frac_zero_std"] == 0.5
    # the summed score [2, 1, 1, 2] has std > 0 in both groups
    assert out.metrics["frac_reward_zero_std"] == 0.0


def test_gdpo_differs_from_grpo_of_the_sum_and_equal_weights():
    out = compute_advantages("gdpo", rewards=COMPS["acc"] + COMPS["fmt"], group_ids=GROUPS, response_mask=MASK,
                             reward_components=COMPS)
    # w = (1, 1): rows [S, -S, -S, S]; tokens [1, 1, -1, -1, -1, 1, 1] S: mean 1/7, deviations 6/7 (x4), -8/7
    # (x3): squares 4 * 36/49 + 3 * 64/49 = 336/49 = 48/7; var = 8/7
    sd = math.sqrt(8 / 7 * S * S + 1e-8)
    expected = t([[6 / 7, 6 / 7], [-8 / 7, 0], [-8 / 7, -8 / 7], [6 / 7, 6 / 7]]) * S / sd
    torch.testing.assert_close(out.advantages, expected, rtol=1e-8, atol=1e-12)
    only_fmt = compute_advantages("gdpo", rewards=COMPS["fmt"], group_ids=GROUPS, response_mask=MASK,
                                  reward_components=COMPS, reward_keys=["fmt"])
    torch.testing.assert_close(only_fmt.advantages, whiten(t([[0, 0], [0, 0], [-S, -S], [S, S]]), MASK))
    assert set(only_fmt.metrics) == {"gdpo/fmt/frac_zero_std", "frac_reward_zero_std"}


def test_gdpo_fallback_is_grpo_of_the_score_then_whitened():
    # no components: the score [1, 0, 1, 1] -> GRPO [S, -S, 0, 0]; tokens [1, 1, -1, 0, 0, 0, 0] S: mean 1/7,
    # squares 36/49 * 2 + 64/49 + 4/49 = 140/49 = 20/7, var = 10/21
    sd = math.sqrt(10 / 21 * S * S + 1e-8)
    expected = t([[6 / 7, 6 / 7], [-8 / 7, 0], [-1 / 7, -1 / 7], [-1 / 7, -1 / 7]]) * S / sd
    out = compute_advantages("gdpo", rewards=COMPS["acc"], group_ids=GROUPS, response_mask=MASK,
                             reward_components={})  # what the trainer passes when the rewards have no components
    torch.testing.assert_close(out.advantages, expected, rtol=1e-8, atol=1e-12)
    assert out.metrics["gdpo/score/frac_zero_std"] == 0.5
    direct = gdpo_advantage(rewards=COMPS["acc"], group_ids=GROUPS, response_mask=MASK, reward_components=None)
    torch.testing.assert_close(direct.advantages, expected, rtol=1e-8, atol=1e-12)
    with pytest.raises(ValueError, match="needs reward_components"):  # declared, so the trainer provides it
        compute_advantages("gdpo", rewards=COMPS["acc"], group_ids=GROUPS, response_mask=MASK)


def test_gdpo_bad_key_and_bad_weights():
    kw = dict(rewards=COMPS["acc"], group_ids=GROUPS, response_mask=MASK, reward_components=COMPS)
    with pytest.raises(ValueError, match=r"'acc_typo' not found; available: \['acc', 'fmt'\]"):
        compute_advantages("gdpo", **kw, reward_keys=["acc", "acc_typo"])
    with pytest.raises(ValueError, match="available: none"):
        compute_advantages("gdpo", **{**kw, "reward_components": {}}, reward_keys=["acc"])
    with pytest.raises(ValueError, match="reward_weights has 1 entries for 2 reward components"):
        compute_advantages("gdpo", **kw, reward_weights=[1.0])
    with pytest.raises(TypeError, match="reward_keys"):
        compute_advantages("gdpo", **kw, reward_keys="acc")
