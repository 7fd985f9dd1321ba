"""Where credo says "as in verl" it is verl 0.9.1's math, and the seed authors' conventions are options (issue 21).

Every expected value is computed by hand (arithmetic in the comments); where verl defines the quantity, the comment
says what verl 0.9.1's ``core_algos`` formula gives for the same input and the test asserts credo gives that.
"""
from __future__ import annotations

import math

import pytest
import torch

from credo.algo import agg_loss, compute_advantages, compute_policy_loss
from credo.algo.advantages import explained_variance, gae
from credo.algo.advantages.returns import discounted_returns
from credo.algo.critic import compute_critic_loss
from credo.algo.dvpo import distributional_gae, tail_curvature_loss
from credo.algo.logprobs import sum_pi_squared_from_logits
from credo.rewards.registry import to_result

D = torch.float64


def T(x, dtype=D):
    return torch.tensor(x, dtype=dtype)


def close(a, b, tol=1e-12):
    torch.testing.assert_close(torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- 1. estimators keep float64

def _grpo_by_hand(rs: list[float], eps: float = 1e-6) -> list[float]:
    mean = sum(rs) / len(rs)
    std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1))  # unbiased, as torch.std
    return [(r - mean) / (std + eps) for r in rs]


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "opo", "gpg", "reinforce_pp_baseline", "reinforce_pp",
                                  "gae", "evpo", "remax", "grpo_passk", "dvpo", "papo"])
def test_every_estimator_keeps_float64(name):
    rewards = T([0.1, 0.2, 0.7, 0.3])
    mask = torch.ones(4, 3)  # a float32 mask does not pull the computation down to float32
    inputs = {"values": T([[0.1, 0.2, 0.3]] * 4), "reward_baselines": T([0.0, 0.1, 0.2, 0.3]),
              "value_quantiles": torch.rand(4, 3, 5, dtype=D), "entropy_direction": torch.rand(4, 3, dtype=D),
              "entropy_history": [1.0, 0.9]}
    out = compute_advantages(name, rewards=rewards, group_ids=torch.tensor([0, 0, 1, 1]), response_mask=mask,
                             **inputs)
    assert out.advantages.dtype == D and (out.returns is None or out.returns.dtype == D)


def test_grpo_float64_matches_the_float64_formula_to_1e14():
    # the group (0.1, 0.2, 0.7): mean 1/3, unbiased std sqrt(0.31/3 * ...) by hand in _grpo_by_hand; a float32
    # computation is off by ~1e-7 (the 4e-8..4e-7), float64 by ~1e-16
    out = compute_advantages("grpo", rewards=T([0.1, 0.2, 0.7]), group_ids=torch.tensor([0, 0, 0]),
                             response_mask=torch.ones(3, 1))
    close(out.advantages[:, 0], _grpo_by_hand([0.1, 0.2, 0.7]), tol=1e-14)


def test_reinforce_pp_float64_returns_exact():
    # gamma 0.3 over 3 loss tokens, reward 0.7 on the last: Ret = [0.7 * 0.09, 0.7 * 0.3, 0.7] in float64
    ret = discounted_returns(T([0.7]), torch.ones(1, 3), 0.3)
    assert ret.dtype == D
    close(ret, [[0.7 * 0.3 * 0.3, 0.7 * 0.3, 0.7]], tol=1e-15)


# ----------------------------------------------------------------------------- 2. seq-mean-token-sum-norm

def test_seq_mean_token_sum_norm_divides_by_sequences_and_the_constant():
    loss = T([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # verl 0.9.1: seq_losses = token sums [6, 4, 0]; seq_mask = [1, 1, 0] -> 2 sequences; (6 + 4) / 2 = 5; / S.
    # S defaults to the padded length 3: 5/3. credo before: 10 / 3 (no 1/G).
    close(agg_loss(loss, mask, "seq-mean-token-sum-norm"), 5 / 3)
    close(agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=10.0), 0.5)  # 10 / 2 / 10


# ----------------------------------------------------------------------------- 3. sequence losses and IS weights

def _one_row(weights):
    lp = torch.zeros(1, len(weights), dtype=D, requires_grad=True)  # logprobs = old: every ratio is 1
    return lp, torch.zeros(1, len(weights), dtype=D), torch.ones(1, len(weights), dtype=D), T([weights])


def test_gmpo_reduces_token_weights_to_their_geometric_mean():
    lp, old, adv, w = _one_row([0.25, 1.0])
    out = compute_policy_loss("gmpo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=torch.ones(1, 2),
                              token_weights=w)
    # rho = exp(mean clipped delta) = 1, A_i = 1; verl geo_mean: seq_is_weights = exp(mean log(w + 1e-10))
    # = exp((log 0.25 + log 1) / 2) = 0.5 -> pg_loss = mean_i(-A_i rho_i w_i) = -0.5 (the arithmetic mean gives -0.625)
    close(out.loss, -math.exp((math.log(0.25 + 1e-10) + math.log(1.0 + 1e-10)) / 2))
    (grad,) = torch.autograd.grad(out.loss, lp)
    # d/dlp_t (-A rho w) = -A w rho / |y| = -0.5 / 2 per unclipped token
    close(grad, [[-0.25, -0.25]], tol=1e-9)


def test_gmpo_clip_fractions_count_every_delta_outside_the_range_as_verl():
    lp = T([[-0.5, 0.5, 0.1, 0.6]]).requires_grad_(True)
    adv = T([[1.0, 1.0, -1.0, -1.0]])
    out = compute_policy_loss("gmpo", logprobs=lp, old_logprobs=torch.zeros(1, 4, dtype=D), advantages=adv,
                              response_mask=torch.ones(1, 4))
    # verl geo_mean: clipped = delta != clamp(delta, -0.4, 0.4): tokens 0, 1 (A > 0) and 3 (A < 0); token 0's clip
    # does not bind (A > 0 takes min(d, clip(d)) = -0.5) but verl counts it: pg_clipfrac 2/4, pg_clipfrac_lower 1/4
    assert out.metrics["pg_clipfrac"] == 0.5 and out.metrics["pg_clipfrac_lower"] == 0.25


def test_gspo_token_weights_per_token_by_default_or_per_sequence():
    lp, old, adv, w = _one_row([0.25, 1.0])
    mask = torch.ones(1, 2)
    token = compute_policy_loss("gspo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask,
                                token_weights=w)
    # verl gspo: pg_losses (-A rho = -1 per token) * rollout_is_weights, seq-mean-token-mean: (-0.25 - 1) / 2
    close(token.loss, -0.625)
    (grad,) = torch.autograd.grad(token.loss, lp)
    close(grad, [[-0.125, -0.5]])  # each token's gradient carries its own weight: -A w_t rho / |y|
    seq = compute_policy_loss("gspo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask,
                              token_weights=w, weight_reduce="sequence")
    close(seq.loss, -0.5, tol=1e-9)  # geometric mean 0.5 on both tokens
    with pytest.raises(ValueError, match="weight_reduce"):
        compute_policy_loss("gspo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask,
                            weight_reduce="mean")


def test_a_token_level_loss_still_multiplies_weights_per_token():
    lp, old, adv, w = _one_row([0.25, 1.0])
    out = compute_policy_loss("ppo", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=torch.ones(1, 2),
                              token_weights=w)
    close(out.loss, -0.625)  # token-mean of -A r w = (-0.25 - 1) / 2


# ----------------------------------------------------------------------------- 4. OPO singletons

def test_opo_singleton_group_has_baseline_zero():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 1]])
    out = compute_advantages("opo", rewards=T([2.0, 1.0, 0.0]), group_ids=torch.tensor([7, 8, 8]),
                             response_mask=mask)
    # verl opo: a group of one gets id2bsl = 0 -> A = 2 (credo before: b = R, A = 0);
    # group 8: b = (1 * 1 + 3 * 0) / (1 + 3) = 0.25 -> A = [0.75, -0.25]
    close(out.advantages, [[2.0, 2.0, 2.0], [0.75, 0.0, 0.0], [-0.25, -0.25, -0.25]])


# ----------------------------------------------------------------------------- 5. returns across masked spans

def test_reinforce_pp_and_remax_carry_the_return_across_an_environment_span():
    mask = torch.tensor([[1, 1, 0, 0, 1]])  # turn 1, an environment span, turn 2
    # verl reinforce_plus_plus, gamma 0.5, reward 1 on the last loss token: t4: 1; t3, t2 (mask 0): running carried
    # unchanged, returns 0; t1: 0 + 0.5 * 1 = 0.5; t0: 0.25 (credo before reset it: [0, 0, 0, 0, 1])
    out = compute_advantages("reinforce_pp", rewards=T([1.0]), group_ids=torch.tensor([0]), response_mask=mask,
                             gamma=0.5)
    close(out.returns, [[0.25, 0.5, 0.0, 0.0, 1.0]])
    # verl remax: returns = reverse cumsum of masked rewards = [1, 1, 1, 1, 1], advantages = returns - b m;
    # with b = 0.4: 0.6 on every loss token (credo zeroes the masked positions, which the loss never reads)
    out = compute_advantages("remax", rewards=T([1.0]), group_ids=torch.tensor([0]), response_mask=mask,
                             reward_baselines=T([0.4]))
    close(out.returns, [[1.0, 1.0, 0.0, 0.0, 1.0]])
    close(out.advantages, [[0.6, 0.6, 0.0, 0.0, 0.6]])


def test_token_rewards_on_masked_positions_are_dropped_as_in_verl():
    # a reward on an environment token (mask 0) reaches no return: verl multiplies it away in the carry
    rewards = T([[0.0, 0.0, 5.0, 1.0]])
    ret = discounted_returns(rewards, torch.tensor([[1, 1, 0, 1]]), 1.0)
    close(ret, [[1.0, 1.0, 0.0, 1.0]])


def test_every_return_estimator_treats_masked_spans_alike():
    # GAE with V = 0 and gamma = lam = 1 is the plain return, and DVPO's distributional GAE per quantile is GAE:
    # all three see the turn-2 reward from turn 1
    mask = torch.tensor([[1, 1, 0, 0, 1]])
    adv, ret = gae(T([1.0]), torch.zeros(1, 5, dtype=D), mask, gamma=1.0, lam=1.0)
    close(ret, [[1.0, 1.0, 0.0, 0.0, 1.0]])
    close(ret, discounted_returns(T([1.0]), mask, 1.0))
    adv_q, targets = distributional_gae(T([1.0]), torch.zeros(1, 5, 2, dtype=D), mask, gamma=1.0, lam=1.0)
    close(targets[..., 0], ret)


# ----------------------------------------------------------------------------- 7. GAE bootstrap

VALUES = [[0.5, 0.6, 9.0, 0.7, 0.2]]  # position 2: an environment token; position 4: after the final action
MASK = [[1, 1, 0, 1, 0]]


def test_gae_terminal_zero_bootstrap_hand_computed():
    adv, ret = gae(T([1.0]), T(VALUES), torch.tensor(MASK), gamma=1.0, lam=1.0)
    # reward 1 on the last loss token (3). t3: delta = 1 + 0 - 0.7 = 0.3; t2 skipped (next stays V3 = 0.7);
    # t1: delta = 0.7 - 0.6 = 0.1, A = 0.4; t0: delta = 0.6 - 0.5 = 0.1, A = 0.5. returns = A + V
    close(adv, [[0.5, 0.4, 0.0, 0.3, 0.0]])
    close(ret, [[1.0, 1.0, 0.0, 1.0, 0.0]])


def test_gae_agentgym_bootstrap_hand_computed():
    adv, ret = gae(T([1.0]), T(VALUES), torch.tensor(MASK), gamma=1.0, lam=1.0, bootstrap="agentgym")
    # AgentGym-RL: next = V[t + 1] at every loss token. t3: delta = 1 + V4 (0.2) - 0.7 = 0.5, A = 0.5;
    # t2 (env): A carried; t1: delta = 0 + V2 (9.0) - 0.6 = 8.4, A = 8.4 + 0.5 = 8.9; t0: delta = 0.6 - 0.5 = 0.1,
    # A = 9.0. returns = A + V = [9.5, 9.5, -, 1.2, -]
    close(adv, [[9.0, 8.9, 0.0, 0.5, 0.0]])
    close(ret, [[9.5, 9.5, 0.0, 1.2, 0.0]])
    # the last position has no next: 0 (a loss token at t = T - 1 bootstraps from nothing)
    adv, _ = gae(T([1.0]), T([[0.5, 0.6]]), torch.ones(1, 2), gamma=1.0, lam=1.0, bootstrap="agentgym")
    close(adv, [[0.5, 0.4]])  # t1: 1 - 0.6; t0: 0.6 - 0.5 + 0.4
    with pytest.raises(ValueError, match="bootstrap"):
        gae(T([1.0]), T(VALUES), torch.tensor(MASK), gamma=1.0, lam=1.0, bootstrap="zero")


def test_gae_and_evpo_estimators_take_the_bootstrap_key():
    kw = dict(rewards=T([1.0]), group_ids=torch.tensor([0]), response_mask=torch.tensor(MASK), values=T(VALUES))
    out = compute_advantages("gae", **kw, bootstrap="agentgym", whiten=False)
    close(out.advantages, [[9.0, 8.9, 0.0, 0.5, 0.0]])
    base = compute_advantages("evpo", **kw)
    agent = compute_advantages("evpo", **kw, bootstrap="agentgym")
    close(agent.returns, [[9.5, 9.5, 0.0, 1.2, 0.0]])
    assert not torch.equal(base.returns, agent.returns)


def test_batched_values_keep_environment_tokens_and_zero_padding(tiny_model):
    from credo.models import ValueModel
    from credo.models.batch import collate
    from credo.train.forward import batched_values
    from credo.types import Example, RewardResult, Trajectory

    model, tok = tiny_model
    critic = ValueModel.from_policy(model, "scalar")
    with torch.no_grad():  # the head starts at zero: make every value nonzero
        for p in critic.value_head.parameters():
            p.add_(0.01)
    ex = Example(prompt="1+1", answer="2")
    trajs = [Trajectory(example=ex, group_id=0, prompt_ids=[5, 6], response_ids=[7, 8, 9, 10], rollout_logprobs=[0.0] * 4,
                        response_mask=[1, 0, 0, 1], finish_reason="eos"),
             Trajectory(example=ex, group_id=0, prompt_ids=[5, 6], response_ids=[7, 8], rollout_logprobs=[0.0] * 2,
                        response_mask=[1, 1], finish_reason="eos")]
    batch = collate(trajs, [RewardResult(1.0), RewardResult(0.0)], pad_id=tok.pad_token_id)
    values, _ = batched_values(critic, batch, micro_batch_size=None)
    assert bool((values[0, 1:3] != 0).all())  # environment tokens of row 0 keep their values
    assert bool((values[1, 2:] == 0).all())  # padding of row 1 is 0


# ----------------------------------------------------------------------------- 8. explained variance eps

def test_explained_variance_eps_and_exact():
    returns = T([[0.0, 0.0], [1.0, 1.0]])
    values = T([[0.0, 0.0], [0.5, 0.5]])
    mask = torch.ones(2, 2)
    # tokens R = [0, 0, 1, 1]: mean 0.5, unbiased Var = 4 * 0.25 / 3 = 1/3; R - V = [0, 0, .5, .5]: Var = 0.25 / 3
    close(explained_variance(returns, values, mask, eps=0.0), 1 - (0.25 / 3) / (1 / 3))  # 0.75 exactly
    close(explained_variance(returns, values, mask), 1 - (0.25 / 3) / (1 / 3 + 1e-5))  # verl's + 1e-5
    flat = torch.ones(2, 2, dtype=D)
    assert explained_variance(flat, flat, mask, eps=0.0) != explained_variance(flat, flat, mask, eps=0.0)  # 0/0: nan
    assert explained_variance(flat, 0.5 * flat + T([[0, 1], [0, 0]]), mask, eps=0.0) == -math.inf


def test_evpo_ev_eps_reaches_gate_and_metric():
    # outcome rewards [0, 1], gamma = lam = 1: GAE returns are R on every token, the setup above
    kw = dict(rewards=T([0.0, 1.0]), group_ids=torch.tensor([0, 0]), response_mask=torch.ones(2, 2),
              values=T([[0.0, 0.0], [0.5, 0.5]]))
    exact = compute_advantages("evpo", **kw, ev_eps=0.0)
    default = compute_advantages("evpo", **kw)
    assert exact.metrics["evpo/explained_variance"] == pytest.approx(0.75, abs=1e-15)
    # verl's masked means divide by n + 1e-8: a ~1e-14 shift on top of the + 1e-5
    assert default.metrics["evpo/explained_variance"] == pytest.approx(1 - (0.25 / 3) / (1 / 3 + 1e-5), abs=1e-12)
    # verl's eps shrinks the ratio: EV 0.7500075 > 0.75; a threshold between the two gates them apart
    thr = 0.75 + 1e-6
    assert compute_advantages("evpo", **kw, ev_eps=0.0, threshold=thr).metrics["evpo/use_critic"] == 0.0
    assert compute_advantages("evpo", **kw, threshold=thr).metrics["evpo/use_critic"] == 1.0
    with pytest.raises(ValueError, match="ev_eps"):
        compute_advantages("evpo", **kw, ev_eps=-1.0)


# ----------------------------------------------------------------------------- 9. DVPO tail curvature

Q = [[[0.0, 2.0, 3.0, 3.5, 6.0, 6.2]]]  # one token, M = 6 quantiles


def test_dvpo_tail_curvature_in_tail_and_whole_axis():
    q = T(Q)
    # in_tail, alpha = beta = 0.5: tails of floor(3) quantiles. low [0, 2, 3]: D2 = 3 - 4 + 0 = -1 -> ReLU 0;
    # high [3.5, 6, 6.2]: D2 = 6.2 - 12 + 3.5 = -2.3 -> ReLU(2.3) = 2.3
    close(tail_curvature_loss(q, alpha=0.5, beta=0.5), [[2.3]])
    # whole_axis (the port): D2 over the axis = [-1, -0.5, 2, -2.3]; k = max(1, floor(0.5 * (6 - 2))) = 2 per end:
    # ReLU(mean(-1, -0.5)) = 0; ReLU(-mean(2, -2.3)) = 0.15
    close(tail_curvature_loss(q, alpha=0.5, beta=0.5, tail_curvature="whole_axis"), [[0.15]])
    # alpha = 0.1: in_tail has 1-quantile tails and refuses; whole_axis keeps max(1, floor(0.4)) = 1 per end:
    # ReLU(-1) + ReLU(2.3) = 2.3
    with pytest.raises(ValueError, match=">= 3 quantiles per tail"):
        tail_curvature_loss(q, alpha=0.1, beta=0.1)
    close(tail_curvature_loss(q, alpha=0.1, beta=0.1, tail_curvature="whole_axis"), [[2.3]])
    with pytest.raises(ValueError, match="tail_curvature"):
        tail_curvature_loss(q, tail_curvature="port")


def test_dvpo_critic_loss_takes_tail_curvature():
    heads = T(Q).unsqueeze(-2).expand(1, 1, 2, 6)  # two identical heads
    only_curvature = {k: 0.0 for k in ("qr_coef", "cvar_coef", "upper_coef", "mean_shift_coef", "tail_shape_coef",
                                       "consistency_coef")}
    inputs = {"values": torch.zeros(1, 1, dtype=D), "quantiles": heads, "return_quantiles": T(Q)}
    for mode, expected in (("in_tail", 2.3), ("whole_axis", 0.15)):
        out = compute_critic_loss("dvpo", response_mask=torch.ones(1, 1), inputs=inputs, alpha=0.5, beta=0.5,
                                  tail_curvature=mode, **only_curvature)
        close(out.loss, expected)


# ----------------------------------------------------------------------------- 10. DVPO GAE keeps float64

def test_distributional_gae_keeps_float64():
    q = T([[[0.1, 0.2], [0.3, 0.4]]]) + 1e-9  # below float32 resolution near 0.3
    adv, targets = distributional_gae(T([1.0]), q, torch.ones(1, 2), gamma=1.0, lam=1.0)
    assert adv.dtype == targets.dtype == D
    # quantile 0: t1: 1 - (0.3 + 1e-9); t0: (0.3 + 1e-9) - (0.1 + 1e-9) + that = 1 - 0.1 - 1e-9
    close(adv[0, :, 0], [1 - 0.1 - 1e-9, 1 - 0.3 - 1e-9], tol=1e-15)


# ----------------------------------------------------------------------------- verl's gpg estimator

def test_gpg_estimator_alpha_rescaled_group_centring():
    mask = torch.ones(3, 1)
    out = compute_advantages("gpg", rewards=T([1.0, 0.0, 2.0]), group_ids=torch.tensor([0, 0, 1]),
                             response_mask=mask)
    # verl gpg: alpha = B / #nonzero scores = 3 / 2 = 1.5; group 0 mean 0.5 -> 1.5 * [0.5, -0.5];
    # the singleton group has mean 0 -> 1.5 * 2 = 3
    close(out.advantages[:, 0], [0.75, -0.75, 3.0])
    assert out.metrics["gpg/alpha"] == 1.5
    out = compute_advantages("gpg", rewards=T([1.0, 0.0, 0.0, 0.0]), group_ids=torch.tensor([0, 0, 1, 1]),
                             response_mask=torch.ones(4, 1), f_norm=2.0)
    close(out.advantages[:, 0], [1.0, -1.0, 0.0, 0.0])  # alpha 4 / 1; 4 * (+-0.5) / 2
    out = compute_advantages("gpg", rewards=T([0.0, 0.0]), group_ids=torch.tensor([0, 0]), response_mask=mask[:2])
    close(out.advantages, torch.zeros(2, 1))  # no nonzero reward: alpha = 2 / max(0, 1), advantages 0


# ----------------------------------------------------------------------------- sum pi^2 and dict verifiers

def test_sum_pi_squared_from_logits():
    logits = T([[0.0, math.log(3.0)]])  # pi = [1/4, 3/4]: sum pi^2 = 1/16 + 9/16 = 10/16
    close(sum_pi_squared_from_logits(logits), [0.625])


def test_verl_style_dict_verifier_results_carry_components():
    r = to_result({"score": 0.5, "acc": True, "format_reward": 1.0, "accuracy_reward": 0.0, "pred": "x"})
    assert r.score == 0.5 and r.correct is True
    assert r.info["components"] == {"format_reward": 1.0, "accuracy_reward": 0.0}  # bools and strings are not
    assert to_result({"score": 1.0}).correct is True and to_result({"score": 1.0}).info == {}
    with pytest.raises(TypeError, match="'score'"):
        to_result({"reward": 1.0})


# ----------------------------------------------------------------------------- the new methods through the real CLI

def _train(tmp_path, name, *extra):
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics
    from tests.conftest import TINY_COLD

    run = tmp_path / name
    code = main(["-q", "train", "--run-dir", str(run), *TINY_COLD, "train.steps=2", "eval.every=0", "log.report=false",
                 "log.tensorboard=false", "warm_start.enabled=false", *extra])
    assert code == 0, name
    return [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]


def test_bypass_mode_skips_the_old_logprob_pass_even_with_several_mini_batches(tmp_path):
    rows = _train(tmp_path, "bypass", "algo.policy_loss=bypass_mode", "train.mini_batch_size=8",
                  "algo.policy_loss_args={loss_type: reinforce, rollout_is: token, rollout_rs: token_k1, "
                  "rollout_rs_threshold: '0.5_2.0'}", "reward.name=tests.reward_fixtures:length_score")
    assert len(rows) == 2
    # 16 sequences in 2 mini-batches: any other loss keeps the pass; bypass mode's anchor is the sampler
    assert all("timing_s/old_logprob" not in r for r in rows)
    assert all("actor/rollout_corr/rollout_is_mean" in r and "actor/rollout_corr/rollout_rs_masked_fraction" in r
               for r in rows)
    ppo = _train(tmp_path, "ppo", "train.mini_batch_size=8", "reward.name=tests.reward_fixtures:length_score")
    assert all("timing_s/old_logprob" in r for r in ppo)


def test_gdpo_reads_the_components_of_a_verl_style_dict_verifier(tmp_path):
    rows = _train(tmp_path, "gdpo", "--config", "gdpo", "reward.name=tests.reward_fixtures:verl_dict_score",
                  "algo.advantage_args={reward_keys: [length_reward, format_reward], reward_weights: [1.0, 0.5]}")
    assert all("gdpo/length_reward/frac_zero_std" in r and "gdpo/format_reward/frac_zero_std" in r for r in rows)


def test_gdpo_names_the_missing_component(tmp_path, capsys):
    from credo.cli.main import main
    from tests.conftest import TINY_COLD

    code = main(["-q", "train", "--config", "gdpo", "--run-dir", str(tmp_path / "r"), *TINY_COLD, "train.steps=1",
                 "eval.every=0", "warm_start.enabled=false", "reward.name=tests.reward_fixtures:verl_dict_score",
                 "algo.advantage_args={reward_keys: [accuracy_reward]}"])
    assert code != 0
    err = capsys.readouterr().err
    assert "accuracy_reward" in err and "length_reward" in err


# ----------------------------------------------------------------------------- named differences: verl's float32 constants

def test_named_differences_from_verl_float32_constants():
    """docs/algorithms/grpo.md, gdpo.md, gpg.md ("Difference from verl 0.9.1"): verl rounds a singleton group's std
    and GPG's alpha through float32; credo computes them exactly in the scores' dtype. verl's expressions are
    reproduced here as its ``core_algos`` writes them (verl itself runs in ``tests/algo/test_verl_parity.py``)."""
    r = T([3.7, 0.5])  # two singleton groups
    ones = torch.ones(2, 1, dtype=D)
    ours = compute_advantages("grpo", rewards=r, group_ids=torch.tensor([0, 1]), response_mask=ones).advantages[:, 0]
    close(ours, r / 1.000001, tol=1e-15)  # credo: std 1, + eps 1e-6, in float64
    verl_div = torch.tensor(1.0) + 1e-6  # verl compute_grpo_outcome_advantage: id2std = torch.tensor(1.0) (float32)
    assert verl_div.dtype == torch.float32 and verl_div.item() == 1.0000009536743164
    rel = ((ours - r / verl_div) / ours).abs()
    assert torch.allclose(rel, T([4.6326e-8, 4.6326e-8]), rtol=1e-4, atol=0), rel  # the documented 4.6e-8
    # float32 rewards: both divide by the same float32 number, bit for bit
    r32 = r.float()
    ours32 = compute_advantages("grpo", rewards=r32, group_ids=torch.tensor([0, 1]),
                                response_mask=ones.float()).advantages[:, 0]
    assert torch.equal(ours32, r32 / verl_div)
    # gpg: B = 8 rows, 6 nonzero, all singletons (mean 0): A = alpha R with alpha = 8 / 6 exactly
    r = T([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    out = compute_advantages("gpg", rewards=r, group_ids=torch.arange(8), response_mask=torch.ones(8, 1, dtype=D))
    close(out.advantages[:6, 0], torch.full((6,), 8 / 6, dtype=D), tol=1e-15)
    verl_alpha = 8 / torch.tensor(6).clamp(min=1)  # verl compute_gpg_outcome_advantage: bsz / m.clamp(min=1)
    assert verl_alpha.dtype == torch.float32
    assert abs(verl_alpha.item() - 8 / 6) / (8 / 6) == pytest.approx(2.98e-8, rel=1e-2)  # the documented 3.0e-8
