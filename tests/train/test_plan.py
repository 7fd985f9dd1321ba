"""credo.train.plan: which passes a step runs, derived from what its pieces declare they read."""
from __future__ import annotations

import pytest

from credo.config import load_config
from credo.recipes.stages import build_plan
from credo.train.plan import step_plan
from credo.train.transforms import BuildContext, build_transforms


def plan(**kw):
    base = dict(estimator_inputs=(), loss_reads=(), term_reads=(), transform_reads=(), critic_reads=(),
                critic=False, one_step_off=False, bypass_loss=False)
    return step_plan(**base | kw)


def fused(p, *, batch=8, epochs=1, mini=None, mode="auto", collector=False) -> bool:
    return p.fused(batch_size=batch, ppo_epochs=epochs, mini_batch_size=mini, mode=mode, collector_needs_pass=collector)


def test_nothing_read_one_optimizer_step_fuses_the_old_logprob_pass():
    p = plan()
    assert fused(p) and not p.reference and p.pass_stats == ()
    assert not fused(p, mode="always")  # train.old_logprob_pass forces it
    assert not fused(p, epochs=2) and not fused(p, mini=4)  # the policy moves before the last loss
    assert not fused(p, collector=True)  # e.g. replayed rows: asked every step


@pytest.mark.parametrize("reader", ["transform_reads", "term_reads", "estimator_inputs"])
def test_a_reader_of_a_pass_output_keeps_the_pass_whoever_it_is(reader):
    assert not fused(plan(**{reader: ("old_logprobs",)}))
    assert not fused(plan(**{reader: ("entropy",)}))


def test_the_policy_losses_own_entropy_is_not_the_pass():
    # a loss reading "entropy" gets the update's own (with gradient): the pass may still fuse
    assert fused(plan(loss_reads=("entropy",)))


def test_reference_comes_from_any_reader_and_keeps_the_pass():
    for kw in ({"term_reads": ("ref_logprobs",)}, {"transform_reads": ("ref_logprobs",)},
               {"loss_reads": ("ref_logprobs",)}, {"critic": True, "critic_reads": ("ref_entropy",)}):
        p = plan(**kw)
        assert p.reference and not fused(p)
    assert plan(critic=True, critic_reads=("ref_entropy",)).ref_entropy
    assert not plan(critic=False, critic_reads=("ref_entropy",)).reference  # no critic: its loss reads nothing


def test_bypass_loss_fuses_over_several_optimizer_steps_and_stats_follow_the_estimator():
    assert fused(plan(bypass_loss=True), epochs=2)
    assert not fused(plan(bypass_loss=True, one_step_off=True), epochs=2)
    assert plan(estimator_inputs=("values", "sum_pi_squared")).pass_stats == ("sum_pi_squared",)


@pytest.mark.parametrize("overrides, reference, passes", [
    ([], False, False),                                                    # GRPO: fused, no reference
    (["algo.kl_coef=0.01"], True, True),                                   # KL term reads ref_logprobs
    (["algo.kl_coef=0.01", "algo.kl_in_reward=true"], True, True),         # KL-in-reward transform reads both
    (["token_select.type=entropy", "token_select.top_fraction=0.2"], False, True),  # reads entropy
    (["algo.entropy_coef=0.01", "algo.sft_coef=0.1"], False, False),       # terms on the update's own forward
])
def test_built_in_configs_plan_from_their_declarations(tmp_path, overrides, reference, passes):
    cfg = load_config(None, overrides)
    p = build_plan(cfg, build_transforms(BuildContext(cfg, None, None, tmp_path)))
    assert p.reference == reference
    assert (not fused(p, batch=cfg.train.prompts_per_step * cfg.rollout.group_size)) == passes
