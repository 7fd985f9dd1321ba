"""Algorithm layer: hand-computed values (arithmetic in comments), invariances, registry errors."""
from __future__ import annotations

import math

import pytest
import torch

from credo.algo import (
    AggNorm,
    agg_loss,
    check_policy_loss_hparams,
    compute_advantages,
    compute_policy_loss,
    entropy_from_logits,
    kl_penalty,
    list_advantage_estimators,
    list_policy_losses,
    logprobs_from_logits,
    register_policy_loss,
)
from credo.algo.registry import TokenLoss

# ----------------------------------------------------------------------------- advantages


def test_grpo_advantages_hand_computed():
    # group 0: R = [1, 0, 0] -> mean 1/3; deviations 2/3, -1/3, -1/3; unbiased var = (4/9+1/9+1/9)/2 = 1/3
    #          std = sqrt(1/3) = 0.57735; A = (2/3)/0.57735 = 1.15470, (-1/3)/0.57735 = -0.57735
    # group 7: R = [0.5] (size 1) -> mean 0, std 1 -> A = 0.5 / (1 + 1e-6)
    # group 3: R = [1, 1] -> std 0 -> A = 0 / (0 + 1e-6) = 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 7, 3, 3])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    out = compute_advantages("grpo", rewards=rewards, group_ids=groups, response_mask=mask)
    std = math.sqrt(1 / 3)
    expected_seq = torch.tensor([(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6),
                                 0.5 / (1 + 1e-6), 0.0, 0.0])
    torch.testing.assert_close(out.advantages, expected_seq[:, None] * mask.float())
    assert out.advantages[0, 0].item() == pytest.approx(1.154700, abs=1e-5)
    assert out.advantages[1, 0].item() == pytest.approx(-0.577350, abs=1e-5)
    # 1 of 3 groups has zero reward std (group 3); the singleton group has std 1 by convention
    assert out.metrics["frac_reward_zero_std"] == pytest.approx(1 / 3)


def test_grpo_without_std_and_dr_grpo_and_rloo():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0])
    mask = torch.ones(4, 2)
    # mean 0.5 -> R - mean = [0.5, -0.5, -0.5, 0.5]
    no_std = compute_advantages("grpo", rewards=rewards, group_ids=groups, response_mask=mask, norm_std=False)
    dr = compute_advantages("dr_grpo", rewards=rewards, group_ids=groups, response_mask=mask)
    torch.testing.assert_close(no_std.advantages[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    torch.testing.assert_close(dr.advantages, no_std.advantages)
    # RLOO: R_i - mean of the other three: 1 - 1/3 = 0.6667, 0 - 2/3 = -0.6667
    rloo = compute_advantages("rloo", rewards=rewards, group_ids=groups, response_mask=mask)
    torch.testing.assert_close(rloo.advantages[:, 0], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


# ----------------------------------------------------------------------------- PPO-clip


def _ppo_case():
    # ratios r and advantages A per token (one row); old_logprobs = 0 so logprobs = log r
    r = torch.tensor([[1.1, 1.5, 0.5, 2.0, 4.0, 0.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    logprobs = r.log().requires_grad_(True)
    return logprobs, torch.zeros_like(r), adv, torch.ones_like(r)


def test_ppo_clip_values_gradients_and_metrics_by_region():
    logprobs, old, adv, mask = _ppo_case()
    out = compute_policy_loss("ppo", logprobs=logprobs, old_logprobs=old, advantages=adv, response_mask=mask)
    # per token (clip_low = clip_high = 0.2, clip_c = 3):
    # A=+1 r=1.1: L1=-1.1, L2=-1.1 -> -1.1               weight r=1.1  -> dL/dlp = -A*w = -1.1
    # A=+1 r=1.5: L1=-1.5, L2=-1.2 -> -1.2 (clipped)     weight 0      -> 0
    # A=-1 r=0.5: L1= 0.5, L2= 0.8 -> 0.8  (clipped)     weight 0      -> 0
    # A=-1 r=2.0: L1= 2.0, L2= 1.2 -> 2.0; dual min(2,3)=2  weight r=2 -> +2.0
    # A=-1 r=4.0: L1= 4.0, L2= 1.2 -> 4.0; dual min(4,3)=3  weight 0   -> 0
    # A=+1 r=0.5: L1=-0.5, L2=-0.8 -> -0.5               weight r=0.5  -> -0.5
    per_token = torch.tensor([-1.1, -1.2, 0.8, 2.0, 3.0, -0.5], dtype=torch.float64)
    assert out.loss.item() == pytest.approx(per_token.sum().item() / 6)  # token-mean over 6 tokens = 0.5
    out.loss.backward()
    expected_grad = torch.tensor([[-1.1, 0.0, 0.0, 2.0, 0.0, -0.5]], dtype=torch.float64) / 6
    torch.testing.assert_close(logprobs.grad, expected_grad)
    # pg_clipfrac: L2 > L1 on tokens 2 and 3 -> 2/6; dual clip active on token 5 -> 1/6
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 6)
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / 6)
    assert out.metrics["clipfrac_high"] == pytest.approx(1 / 6)  # A>0, r=1.5 > 1.2
    assert out.metrics["clipfrac_low"] == pytest.approx(1 / 6)  # A<0, r=0.5 < 0.8
    # ppo_kl = mean(old - logprobs) = -mean(log r)
    assert out.metrics["ppo_kl"] == pytest.approx(-torch.log(torch.tensor([1.1, 1.5, 0.5, 2, 4, 0.5])).mean().item(),
                                                  rel=1e-5)


def test_ppo_clip_higher_changes_only_the_upper_bound():
    logprobs, old, adv, mask = _ppo_case()
    out = compute_policy_loss("ppo", logprobs=logprobs, old_logprobs=old, advantages=adv, response_mask=mask,
                              clip_high=0.6)
    out.loss.backward()
    # with clip_high=0.6 the token A=+1 r=1.5 is inside [0.8, 1.6]: weight r=1.5 -> grad -1.5/6
    assert logprobs.grad[0, 1].item() == pytest.approx(-1.5 / 6)
    assert logprobs.grad[0, 2].item() == 0.0  # lower clip unchanged


def test_ppo_gradcheck_float64():
    torch.manual_seed(0)
    logprobs = (0.3 * torch.randn(3, 5, dtype=torch.float64)).requires_grad_(True)
    old = 0.3 * torch.randn(3, 5, dtype=torch.float64)
    adv = torch.randn(3, 5, dtype=torch.float64)
    mask = (torch.rand(3, 5) > 0.3).long()

    def f(lp):
        return compute_policy_loss("ppo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask,
                                   clip_high=0.28).loss

    assert torch.autograd.gradcheck(f, (logprobs,))


def test_ppo_rejects_dual_clip_constant_not_above_one():
    logprobs, old, adv, mask = _ppo_case()
    with pytest.raises(ValueError, match="clip_c"):
        compute_policy_loss("ppo", logprobs=logprobs, old_logprobs=old, advantages=adv, response_mask=mask, clip_c=1.0)


def test_gpg_is_plain_policy_gradient():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]])
    out = compute_policy_loss("gpg", logprobs=logprobs, old_logprobs=logprobs.detach(), advantages=adv,
                              response_mask=torch.ones(1, 2))
    # L = -A * logprob: [2, -2] -> token-mean 0; gradient -A / 2 = [-1, 0.5]
    assert out.loss.item() == pytest.approx(0.0)
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0, 0.5]]))


# ----------------------------------------------------------------------------- aggregation


def test_aggregation_modes_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)  # (1+2+3+4)/4 tokens
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(5.0)  # (6 + 4) / 2 seqs
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)  # (6/3 + 4/1) / 2
    # verl 0.9.1 agg_loss: seq-mean-token-sum (sum_i token sums / #non-empty sequences), then / loss_scale_factor
    # (default the padded length): (6 + 4) / 2 / 3 = 5/3, and with S = 5: (6 + 4) / 2 / 5 = 1.0
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(5 / 3)
    assert agg_loss(loss, mask, "constant-norm", loss_scale_factor=5.0).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        agg_loss(loss, mask, "token-sum")


def test_empty_rows_and_empty_batch_do_not_divide_by_zero():
    loss = torch.tensor([[1.0, 2.0], [5.0, 5.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    # the empty row is not a sequence: seq-mean-token-mean = (3/2) / 1
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    # nor for seq-mean-token-sum-norm (verl's seq_mask excludes it): 3 / 1 sequence / T = 2 -> 1.5
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(1.5)
    assert agg_loss(loss, torch.zeros(2, 2), "token-mean").item() == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("splits", [[8], [4, 4], [1, 3, 4], [1] * 8])
def test_policy_loss_and_gradient_invariant_to_micro_batching(mode, splits):
    torch.manual_seed(1)
    b, t = 8, 6
    logprobs = (0.2 * torch.randn(b, t, dtype=torch.float64)).requires_grad_(True)
    old = 0.2 * torch.randn(b, t, dtype=torch.float64)
    adv = torch.randn(b, 1, dtype=torch.float64).expand(b, t).contiguous()
    mask = (torch.rand(b, t) > 0.35).long()
    mask[3] = 0  # an empty sequence
    full = compute_policy_loss("ppo", logprobs=logprobs, old_logprobs=old, advantages=adv, response_mask=mask, agg=mode)
    (g_full,) = torch.autograd.grad(full.loss, logprobs)
    norm = AggNorm.of(mask)  # computed once over the mini-batch
    total, start = 0.0, 0
    for size in splits:
        rows = slice(start, start + size)
        part = compute_policy_loss("ppo", logprobs=logprobs[rows], old_logprobs=old[rows], advantages=adv[rows],
                                   response_mask=mask[rows], agg=mode, norm=norm)
        total = total + part.loss
        start += size
    (g_split,) = torch.autograd.grad(total, logprobs)
    torch.testing.assert_close(total, full.loss)
    torch.testing.assert_close(g_split, g_full)


def test_int_bool_and_float_masks_give_identical_results():
    torch.manual_seed(2)
    logprobs = 0.1 * torch.randn(4, 5)
    old = 0.1 * torch.randn(4, 5)
    adv = torch.randn(4, 5)
    mask_bool = torch.rand(4, 5) > 0.3
    outs = [compute_policy_loss("ppo", logprobs=logprobs, old_logprobs=old, advantages=adv, response_mask=m,
                                agg="seq-mean-token-mean")
            for m in (mask_bool, mask_bool.long(), mask_bool.int(), mask_bool.float())]
    for o in outs[1:]:
        assert o.loss.item() == outs[0].loss.item()
        assert o.metrics == outs[0].metrics
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    a_bool = compute_advantages("grpo", rewards=rewards, group_ids=groups, response_mask=mask_bool)
    a_int = compute_advantages("grpo", rewards=rewards, group_ids=groups, response_mask=mask_bool.long())
    torch.testing.assert_close(a_bool.advantages, a_int.advantages)


# ----------------------------------------------------------------------------- KL, entropy, log-probs


def test_kl_estimators_hand_computed_and_straight_through():
    # pi = 0.5, pi_ref = 0.25: x = log(0.5/0.25) = ln 2 = 0.693147
    lp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]])
    ln2 = math.log(2)
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(ln2)
    assert kl_penalty(lp, ref, "abs").item() == pytest.approx(ln2)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * ln2**2)  # 0.240227
    # k3: u = ref - lp = -ln 2; e^u - u - 1 = 0.5 + 0.693147 - 1 = 0.193147
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(0.5 + ln2 - 1)
    assert kl_penalty(lp, ref, "low_var_kl").item() == pytest.approx(0.5 + ln2 - 1)
    # "k3+": value of k3, gradient of k2 (d/dlp of x^2/2 = x = ln 2); plain k3 gradient is 1 - e^u = 0.5
    st = kl_penalty(lp, ref, "k3+")
    assert st.item() == pytest.approx(0.5 + ln2 - 1)
    (g_st,) = torch.autograd.grad(st.sum(), lp)
    (g_k3,) = torch.autograd.grad(kl_penalty(lp, ref, "k3").sum(), lp)
    assert g_st.item() == pytest.approx(ln2)
    assert g_k3.item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(lp, ref, "k4")


def test_k3_is_clamped():
    lp = torch.tensor([[0.0]])
    ref = torch.tensor([[50.0]])  # u clamped to 20 -> e^20 - 21 -> clamped to 10
    assert kl_penalty(lp, ref, "k3").item() == 10.0


def test_logprobs_and_entropy_from_logits():
    # uniform over 4 -> log-prob ln(1/4), entropy ln 4
    logits = torch.zeros(1, 1, 4)
    assert logprobs_from_logits(logits, torch.tensor([[2]])).item() == pytest.approx(-math.log(4))
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(4))
    # one-hot-ish: entropy near 0
    assert entropy_from_logits(torch.tensor([[[100.0, 0.0, 0.0]]])).item() == pytest.approx(0.0, abs=1e-6)


# ----------------------------------------------------------------------------- registry


def test_registry_lists_and_hparam_errors():
    assert {"ppo", "gpg"} <= set(list_policy_losses())
    assert {"grpo", "dr_grpo", "rloo"} <= set(list_advantage_estimators())
    with pytest.raises(TypeError, match="did you mean 'clip_high'"):
        check_policy_loss_hparams("ppo", {"clip_hihg": 0.3})
    with pytest.raises(TypeError, match="expects float"):
        check_policy_loss_hparams("ppo", {"clip_high": "wide"})
    with pytest.raises(KeyError, match="did you mean 'ppo'"):
        check_policy_loss_hparams("ppp", {})


def test_registering_a_loss_is_one_function_and_it_is_usable_by_name():
    @register_policy_loss("test_scaled_pg")
    def scaled_pg(*, logprobs, old_logprobs, advantages, response_mask, entropy=None, ref_logprobs=None,
                  scale: float = 2.0) -> TokenLoss:
        """Test loss: -scale * A * logprob."""
        return TokenLoss(loss=-scale * advantages * logprobs)

    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    out = compute_policy_loss("test_scaled_pg", logprobs=lp, old_logprobs=lp.detach(),
                              advantages=torch.ones(1, 2), response_mask=torch.ones(1, 2), scale=3.0)
    assert out.loss.item() == pytest.approx(3.0)  # -3 * 1 * -1, token-mean
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("test_scaled_pg")(lambda **kw: None)
    with pytest.raises(TypeError, match="keyword-only"):
        @register_policy_loss("test_bad_signature")
        def bad(*, logprobs, old_logprobs, advantages, response_mask, entropy=None, ref_logprobs=None, k=None, j):
            return None


def test_a_method_packages_estimator_is_listed_and_found_without_importing_it_first():
    """ADVANTAGE_ESTIMATORS names the method modules that register estimators (credo.registry.Registry builtins):
    credo.algo lists AttnRL's estimator without importing credo.methods at import time."""
    import subprocess
    import sys

    code = ("import sys, credo.algo as algo; mod = 'credo.methods.attnrl.advantage'; before = mod in sys.modules; "
            "names = algo.list_advantage_estimators(); "
            "print(before, mod in sys.modules, 'attnrl' in names, algo.advantage_requirements('attnrl'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True", "('tree_paths',)"]
