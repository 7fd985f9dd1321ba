"""Rollout correction (baselines.md §8): importance weights exp(old - rollout) per token or per sequence,
truncated or masked, hand-computed; they multiply the per-token loss; end to end through the trainer."""
from __future__ import annotations

import math

import pytest
import torch

from credo.algo import compute_policy_loss
from credo.algo.rollout_correction import rollout_is_weights

LN = math.log


def _case():
    # row 0: token ratios 3, 0.5, 1.5 (last token masked out); row 1: ratios 1.2, 1.2, padding
    old = torch.tensor([[LN(3.0), LN(0.5), LN(1.5)], [LN(1.2), LN(1.2), 0.0]], dtype=torch.float64)
    roll = torch.zeros_like(old)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.float64)
    return old, roll, mask


def test_token_truncate_and_mask_hand_computed():
    old, roll, mask = _case()
    w, m = rollout_is_weights(old, roll, mask, mode="token_truncate", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0], [1.2, 1.2, 0.0]], dtype=torch.float64))
    assert m["rollout_corr/is_max"] == pytest.approx(3.0) and m["rollout_corr/is_min"] == pytest.approx(0.5)
    assert m["rollout_corr/is_mean"] == pytest.approx((3 + 0.5 + 1.2 + 1.2) / 4)
    assert m["rollout_corr/adjusted_frac"] == pytest.approx(1 / 4)  # only the 3 was clipped
    w, m = rollout_is_weights(old, roll, mask, mode="token_mask", low=0.8, high=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.2, 1.2, 0.0]], dtype=torch.float64))
    # effective sample size of the final weights over 4 tokens: (2.4)^2 / (4 * 2.88) = 0.5
    assert m["rollout_corr/eff_sample_size"] == pytest.approx(0.5)


def test_sequence_modes_use_the_product_over_the_row():
    old, roll, mask = _case()
    w, _ = rollout_is_weights(old, roll, mask, mode="sequence_truncate", high=2.0)
    # row 0: 3 * 0.5 = 1.5 (the masked 1.5 does not count); row 1: 1.2 * 1.2 = 1.44
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5, 0.0], [1.44, 1.44, 0.0]], dtype=torch.float64))
    w, _ = rollout_is_weights(old, roll, mask, mode="sequence_mask", low=0.5, high=1.45)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.44, 1.44, 0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown rollout correction mode"):
        rollout_is_weights(old, roll, mask, mode="tis")


def test_weights_multiply_the_per_token_loss_and_are_not_differentiated():
    old, roll, mask = _case()
    lp = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    w, _ = rollout_is_weights(old, roll, mask, mode="token_truncate", high=2.0)
    out = compute_policy_loss("gpg", logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask, token_weights=w)
    # gpg: L = -A logprob per token; token-mean over 4 tokens of w * L
    want = -(2.0 * 1.0 * LN(3.0) + 0.5 * -1.0 * LN(0.5) + 1.2 * 0.5 * LN(1.2) * 2) / 4
    assert float(out.loss.detach()) == pytest.approx(want)
    (g,) = torch.autograd.grad(out.loss, lp)
    torch.testing.assert_close(g, -(adv * w * mask) / 4)


def test_trainer_applies_the_correction_and_reports_it():
    """Through update_policy: with rollout log-probs equal to the trainer's, every weight is 1 and the update is
    the uncorrected one; with them shifted, the weights change the update and the metrics report them."""
    import copy

    from credo.config import load_config
    from credo.train.forward import batched_logprobs
    from credo.train.optim import build_optimizer, build_scheduler
    from credo.train.update import UpdateOptions, update_policy
    from tests.train.test_forward import F64, _group_batch, _model64

    model, tok = _model64()
    batch = _group_batch(tok)
    batch.advantages = torch.randn(batch.responses.shape, dtype=F64,
                                   generator=torch.Generator().manual_seed(3)) * batch.response_mask
    batch.rollout_logprobs, _ = batched_logprobs(model, batch, micro_batch_size=None)

    def run(b, corr):
        cfg = load_config(None, ["train.warmup_steps=0", f"algo.rollout_correction={corr}"])
        m = copy.deepcopy(model)
        opt = build_optimizer(m, lr=0.01)
        metrics = update_policy(UpdateOptions.of(cfg), m, b, opt,
                                build_scheduler(opt, warmup_steps=0, total_steps=1), step=0)
        return [p.detach().clone() for p in m.parameters()], metrics

    base, _ = run(batch, "none")
    same, metrics = run(batch, "token_truncate")
    for a, b in zip(base, same):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert metrics["rollout_corr/is_mean"] == pytest.approx(1.0, abs=1e-6)
    shifted = copy.copy(batch)
    shifted.rollout_logprobs = batch.rollout_logprobs.clone()
    shifted.rollout_logprobs[:3] -= 0.5 * batch.response_mask[:3]  # rows 0-2 (one group): ratios e^0.5 = 1.65
    moved, metrics = run(shifted, "token_mask")  # 1.65 <= 2: kept, so that group weighs 1.65x the others
    n = batch.response_mask.sum()
    want = float((batch.response_mask[:3].sum() * math.exp(0.5) + batch.response_mask[3:].sum()) / n)
    assert metrics["rollout_corr/is_mean"] == pytest.approx(want, rel=1e-4)
    assert max(float((a - b).abs().max()) for a, b in zip(base, moved)) > 1e-4  # a different direction
