"""Recipe-level equivalences: gradient accumulation, KL and entropy terms wired through the real update."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from credo.algo import compute_advantages
from credo.config import load_config
from credo.train.update import UpdateOptions, update_policy
from credo.rollout import HFRolloutEngine
from credo.models.batch import collate
from credo.train.forward import batched_logprobs
from credo.train.optim import build_optimizer, build_scheduler
from credo.types import Example, RewardResult, SamplingParams


def _batch(model, tok):
    engine = HFRolloutEngine(model, tok, seed=0)
    prompts = [Example(f"rev {s}=", s[::-1]) for s in ("abc", "dcba", "eab", "hgfe")]
    trajs = engine.generate(prompts, 4, SamplingParams(max_new_tokens=6))
    scores = [RewardResult(score=float(len(t.response_ids) % 3)) for t in trajs]  # varied rewards
    batch = collate(trajs, scores, pad_id=tok.pad_token_id)
    batch.old_logprobs, _ = batched_logprobs(model, batch, micro_batch_size=None)
    batch.ref_logprobs = batch.old_logprobs - 0.1
    adv = compute_advantages("grpo", rewards=batch.scores, group_ids=batch.group_ids,
                             response_mask=batch.response_mask)
    batch.advantages = adv.advantages
    return batch


def _update(model, batch, overrides, sgd=False):
    cfg = load_config(None, ["train.prompts_per_step=4", "rollout.group_size=4", "train.grad_clip=0",
                             "train.warmup_steps=0", *overrides])
    model = copy.deepcopy(model)
    # plain SGD: the parameter change is exactly -lr * gradient (Adam would amplify float noise on tiny grads)
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if sgd else build_optimizer(model, lr=1e-2)
    sched = build_scheduler(opt, warmup_steps=0, total_steps=10)
    metrics = update_policy(UpdateOptions.of(cfg), model, batch, opt, sched, step=0)
    return model, metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant-norm"])
def test_gradient_accumulation_does_not_change_the_update(tiny_model, agg):
    model, tok = tiny_model
    batch = _batch(model, tok)
    extra = [f"algo.agg={agg}", "algo.kl_coef=0.1", "algo.entropy_coef=0.01"]
    whole, m_whole = _update(model, batch, extra, sgd=True)
    accum, m_accum = _update(model, batch, extra + ["train.micro_batch_size=4"], sgd=True)
    moved = 0
    for p0, p, q in zip(model.parameters(), whole.parameters(), accum.parameters()):
        torch.testing.assert_close(p - p0, q - p0, atol=1e-7, rtol=1e-4)
        moved += int(not torch.equal(p, p0))
    assert moved > 0
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/pg_clipfrac", "actor/grad_norm"):
        assert m_whole[key] == pytest.approx(m_accum[key], rel=1e-4, abs=1e-6), key


def test_mini_batches_and_epochs_take_several_optimizer_steps(tiny_model):
    model, tok = tiny_model
    batch = _batch(model, tok)
    _, one = _update(model, batch, [])
    _, many = _update(model, batch, ["train.mini_batch_size=8", "train.ppo_epochs=2"])
    # the first update is on-policy (ratio 1, nothing clipped); later ones move away from the old policy
    assert one["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert many["actor/ppo_kl"] != pytest.approx(0.0, abs=1e-6)
    assert many["actor/ratio"] != pytest.approx(1.0, abs=1e-6)


def test_sft_term_is_exact_under_gradient_accumulation(tiny_model):
    model, tok = tiny_model
    batch = _batch(model, tok)
    batch.scores = torch.tensor([1.0, 0.0] * 8)  # half the responses count as fully correct
    extra = ["algo.sft_coef=0.1", "algo.agg=token-mean"]
    whole, m_whole = _update(model, batch, extra, sgd=True)
    accum, m_accum = _update(model, batch, extra + ["train.micro_batch_size=2"], sgd=True)
    for p0, p, q in zip(model.parameters(), whole.parameters(), accum.parameters()):
        torch.testing.assert_close(p - p0, q - p0, atol=1e-7, rtol=1e-4)
    assert m_whole["actor/sft_loss"] == pytest.approx(m_accum["actor/sft_loss"], rel=1e-5)
    # the SFT loss is the token-mean NLL over the correct responses only
    from credo.train.loss_terms import correct_mask

    mask = correct_mask(batch, 1.0)
    logprobs, _ = batched_logprobs(model, batch, micro_batch_size=None)
    assert m_whole["actor/sft_loss"] == pytest.approx(float(-(logprobs * mask).sum() / mask.sum()), rel=1e-5)


def test_top_entropy_token_selection_keeps_the_requested_fraction(tiny_model):
    from credo.tracking.timer import Timer
    from credo.train.transforms import BuildContext, StepIO, build_transforms, run_phase

    def select_tokens(cfg, batch, metrics):  # the run's policy-phase transforms, as credo.recipes.step runs them
        transforms = build_transforms(BuildContext(cfg, model, tok, Path(".")))
        return run_phase(transforms, "policy", batch, None, StepIO(metrics, Timer(), 0, []))[0]

    model, tok = tiny_model
    batch = _batch(model, tok)
    _, stats = batched_logprobs(model, batch, micro_batch_size=None, stats=("entropy",))
    batch.entropy = stats["entropy"]
    metrics = {}
    cfg = load_config(None, ["algo.top_entropy_quantile=0.2"])
    selected = select_tokens(cfg, batch, metrics)
    valid = batch.response_mask.bool()
    kept = selected.response_mask.bool()
    assert (kept & ~valid).sum() == 0
    assert metrics["token_select/frac"] == pytest.approx(0.2, abs=0.05)
    assert batch.entropy[kept].min() >= batch.entropy[valid & ~kept].max()  # the kept ones are the top entropy
    assert select_tokens(load_config(), batch, {}) is batch  # 1.0: everything
