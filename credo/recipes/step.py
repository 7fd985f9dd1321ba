"""The RL step, in reading order. Every stage is one visible call; each stage function says what it reads and
writes. Which collector, estimator, loss, terms and transforms run is configuration, built once
(credo/recipes/stages.py); this file never names a method.

     1. sync weights    the rollout engine serves the policy the previous steps trained, as version ``step``
     2. collect         the collector's rollouts (groups, trees, agent episodes, replayed answers)
     3. collate         rollouts -> TrainBatch
     4. forward passes  old log-probs (unless fused into the update), critic values, reference log-probs
     5. rewards         the collector's rewards, then the ``rewards`` transforms (KL in the reward, ...)
     6. advantages      the estimator, then the ``advantages`` transforms
     7. critic update
     8. token selection the ``policy`` transforms: the batch the policy update sees
     9. policy update   the policy loss plus the loss terms (credo.train.loss_terms)
    10. metrics         the step's row (and the rollouts' dump when due)

Which passes run is derived from declarations (credo.train.plan): nothing here tests for a method.
"""
from __future__ import annotations

import contextlib

import torch

from credo.algo import compute_advantages, masked_mean
from credo.algo.advantages import discounted_returns, explained_variance, token_rewards
from credo.algo.advantages.common import masked_var
from credo.guards.logprobs import check_behaviour_logprobs, check_first_ratio
from credo.models.lora import adapters_disabled, is_lora
from credo.recipes.estimator_inputs import InputContext, estimator_inputs
from credo.tracking.dump import rollout_records
from credo.models.batch import SAMPLED, collate
from credo.train.flow_targets import CriticPassOptions, critic_pass
from credo.train.forward import ForwardOptions, batched_logprobs
from credo.tracking.timer import Timer
from credo.train.transforms import StepIO, kl_metric, run_phase
from credo.train.update import UpdateOptions, update_critic, update_policy
from credo.types import AdvantageOutput, TrainBatch, declare_extra

# the extras the step writes itself (credo.types.BATCH_EXTRAS)
REF_ENTROPY = declare_extra("ref_entropy", "the step's reference pass (credo.recipes.step), when something reads "
                            "it (a critic loss on the frozen LM's entropy): (B, T) the reference policy's entropy")
TOKEN_REWARDS = declare_extra("token_rewards", "the step's advantages stage (credo.recipes.step): (B, T) the rewards "
                              "the estimator saw (last-token score plus what the reward transforms added)")
RETURN_QUANTILES = declare_extra("return_quantiles", "the step's advantages stage (credo.recipes.step), for an "
                                 "estimator that returns them: (B, T, M) distributional return targets")


def rl_step(cfg, parts, state, *, step: int) -> dict[str, float]:
    """One RL step (the module docstring's stages); returns its metrics row."""
    timer = Timer()
    with timer("step"):
        parts.rollout.sync_weights(step, timer)                                    # 1. sync weights
        rollouts = parts.rollout.collect(step, timer)                              # 2. collect
        io = StepIO(metrics=rollouts.metrics, timer=timer, step=step, trajs=rollouts.trajs)
        if not rollouts.trajs:  # every group was filtered out: nothing to learn from this step
            return io.metrics | timer.metrics() | parts.guards.metrics() | {"train/skipped_step": 1}
        batch = collate_rollouts(parts, rollouts)                                  # 3. collate
        fused = parts.plan.fused(batch_size=batch.batch_size, ppo_epochs=cfg.train.ppo_epochs,
                                 mini_batch_size=cfg.train.mini_batch_size, mode=cfg.train.old_logprob_pass,
                                 collector_needs_pass=parts.collector.needs.old_logprob_pass)
        token_stats = {} if fused else old_logprob_pass(cfg, parts, batch, io, state)  # 4. forward passes
        critic_values(cfg, parts, batch, io)
        reference_pass(cfg, parts, batch, io)
        rewards = parts.collector.rewards(batch, rollouts.trajs)                   # 5. rewards
        batch, rewards = run_phase(parts.transforms, "rewards", batch, rewards, io)
        adv = advantages(cfg, parts, batch, rollouts, rewards, token_stats, state, io)  # 6. advantages
        batch, _ = run_phase(parts.transforms, "advantages", batch, None, io)
        opts = UpdateOptions.of(cfg)
        critic_update(opts, parts, batch, io)                                      # 7. critic update
        if step >= cfg.critic.pretrain_steps or parts.critic is None:  # the critic trains alone at first
            policy_batch, _ = run_phase(parts.transforms, "policy", batch, None, io)  # 8. token selection
            policy_update(opts, parts, state, policy_batch, io, fused=fused)       # 9. policy update
    io.metrics.update(adv.metrics | timer.metrics() | step_metrics(batch, rollouts.trajs, timer, step=step)
                      | parts.guards.metrics())                                    # 10. metrics
    dump_rollouts(cfg, parts, batch, rollouts, step=step)
    return io.metrics


# ------------------------------------------------------------------------------------------------- 3. collate

def collate_rollouts(parts, rollouts) -> TrainBatch:
    """Reads the rollouts (trajectories, results, sampling); writes a new TrainBatch (rollout log-probs, scores,
    masks, the sampled flags and images as extras). Checks the behaviour log-probs (guard finite_logprobs)."""
    batch = collate(rollouts.trajs, rollouts.results, pad_id=parts.tokenizer.pad_token_id,
                    temperature=rollouts.sampling.temperature)
    check_behaviour_logprobs(parts.guards, batch)  # before any pass reads the batch
    return batch


# ------------------------------------------------------------------------------------------------- 4. passes

def old_logprob_pass(cfg, parts, batch: TrainBatch, io: StepIO, state) -> dict[str, torch.Tensor]:
    """The no-grad pass of the policy that collected. Reads the batch; writes ``old_logprobs``, ``entropy``, the
    entropy history and ``rollout/logprob_abs_diff``; rows the engine did not sample (extra ``sampled`` False, e.g.
    answers from a pool) take these log-probs as their ``rollout_logprobs``. Returns the token statistics the
    estimator reads (``parts.plan.pass_stats``)."""
    with io.timer("old_logprob"):
        stats = ("entropy",) + parts.plan.pass_stats
        batch.old_logprobs, token_stats = batched_logprobs(
            parts.model, batch, micro_batch_size=cfg.train.micro_batch_size,
            micro_batch_tokens=cfg.train.micro_batch_tokens, temperature=batch.temperature, stats=stats,
            opts=ForwardOptions.of(cfg))
        batch.entropy = token_stats["entropy"]
    state.entropy_history.append(float(masked_mean(batch.entropy, batch.response_mask)))
    unsampled = ~batch.extra(SAMPLED)
    batch.rollout_logprobs[unsampled] = batch.old_logprobs[unsampled]
    # sampler vs trainer log-probs of the same tokens (verl's rollout_probs_diff): ~0 on-policy, the policy lag's
    # effect in one-step-off mode
    io.metrics["rollout/logprob_abs_diff"] = float(masked_mean((batch.rollout_logprobs - batch.old_logprobs).abs(),
                                                               batch.response_mask))
    if cfg.rollout.one_step_off and cfg.rollout.off_policy_ratio == "behaviour":
        batch.old_logprobs = batch.rollout_logprobs  # the PPO ratio against the policy that generated
    return token_stats


def critic_values(cfg, parts, batch: TrainBatch, io: StepIO) -> None:
    """With a critic: reads the batch; writes ``values`` (and the critic loss's targets, e.g. a flow critic's)."""
    if parts.critic is None:
        return
    with io.timer("values"):
        critic_pass(CriticPassOptions.of(cfg), parts.critic, batch, step=io.step)


def reference_pass(cfg, parts, batch: TrainBatch, io: StepIO) -> None:
    """With a frozen reference (``parts.plan.reference``): reads the batch and ``old_logprobs``; writes
    ``ref_logprobs``, ``ref_entropy`` when something reads it, and ``actor/kl``. A LoRA policy is its own reference,
    run with its adapters disabled."""
    if parts.ref_model is None:
        return
    ref = parts.ref_model
    with io.timer("ref"), adapters_disabled(ref) if is_lora(ref) else contextlib.nullcontext():
        batch.ref_logprobs, stats = batched_logprobs(
            ref, batch, micro_batch_size=cfg.train.micro_batch_size, micro_batch_tokens=cfg.train.micro_batch_tokens,
            temperature=batch.temperature, stats=("entropy",) if parts.plan.ref_entropy else (),
            opts=ForwardOptions.of(cfg))
        if "entropy" in stats:
            batch.set_extra(REF_ENTROPY, stats["entropy"])
    io.metrics["actor/kl"] = kl_metric(batch, cfg.algo.kl_estimator)


# ------------------------------------------------------------------------------------------------- 6. advantages

def advantages(cfg, parts, batch: TrainBatch, rollouts, rewards: torch.Tensor, token_stats: dict, state,
               io: StepIO) -> AdvantageOutput:
    """The configured estimator. Reads ``rewards`` ((B,) scores or (B, T) token rewards) and the optional inputs it
    declares (credo.recipes.estimator_inputs); writes ``advantages``, ``returns`` (and return quantiles) and the extra
    ``token_rewards``. A critic the estimator does not read learns the undiscounted returns."""
    a = cfg.algo
    with io.timer("adv"):
        x = InputContext(cfg, parts, batch, rollouts, token_stats, state, io.timer)
        inputs = estimator_inputs(x, parts.plan.estimator_inputs)
        adv = compute_advantages(a.advantage, rewards=rewards, group_ids=batch.group_ids,
                                 response_mask=batch.response_mask, **inputs, **a.advantage_args)
        batch.advantages, batch.returns = adv.advantages, adv.returns
        if adv.return_quantiles is not None:
            batch.set_extra(RETURN_QUANTILES, adv.return_quantiles)
        batch.set_extra(TOKEN_REWARDS, token_rewards(rewards, batch.response_mask))  # r_t, for bootstrapping critics
        if parts.critic is not None and not {"values", "value_quantiles"} & set(parts.plan.estimator_inputs):
            batch.returns = discounted_returns(rewards, batch.response_mask, 1.0)
    return adv


# ------------------------------------------------------------------------------------------------- 7.-9. updates

def critic_update(opts: UpdateOptions, parts, batch: TrainBatch, io: StepIO) -> None:
    """With a critic: reads ``returns`` (and its loss's targets); updates the critic; writes ``critic/*``."""
    if parts.critic is None:
        return
    with io.timer("update_critic"):
        io.metrics.update(update_critic(opts, parts.critic, batch, parts.critic_optimizer, parts.critic_scheduler,
                                        step=io.step, dp=parts.dp))


def policy_update(opts: UpdateOptions, parts, state, batch: TrainBatch, io: StepIO, *, fused: bool) -> None:
    """Reads ``advantages``, ``old_logprobs`` (or, fused, the update's own detached log-probs) and what the loss
    terms read; updates the policy; writes ``actor/*`` and checks the first ratio (guard first_ratio)."""
    with io.timer("update"):
        io.metrics.update(update_policy(opts, parts.model, batch, parts.optimizer, parts.scheduler, step=io.step,
                                        dp=parts.dp))
    check_first_ratio(parts.guards, io.metrics, io.trajs, step=io.step)  # on-policy: ratio 1 against the sampler
    if fused and "actor/entropy" in io.metrics:  # absent when every row had zero advantage (skipped)
        state.entropy_history.append(io.metrics["actor/entropy"])


# ------------------------------------------------------------------------------------------------- 10. metrics

def step_metrics(batch: TrainBatch, trajs, timer: Timer, *, step: int) -> dict[str, float]:
    """Reads the batch and the timer; the step's throughput, advantage, policy-lag, entropy and critic metrics."""
    n_resp = float(batch.response_mask.sum())
    n_total = n_resp + sum(len(t.prompt_ids) for t in trajs)
    out = {"advantages/abs_mean": float(masked_mean(batch.advantages.abs(), batch.response_mask)),
           "advantages/std": float(masked_var(batch.advantages, batch.response_mask).sqrt()),  # over loss tokens
           "perf/tokens_per_s": n_total / max(timer.seconds["step"], 1e-9),
           "perf/gen_tokens_per_s": n_resp / max(timer.seconds["gen"], 1e-9), "perf/response_tokens": n_resp}
    versions = [t.policy_version for t in trajs]
    out["rollout/policy_version"] = sum(versions) / len(versions)
    out["rollout/policy_lag"] = step - min(versions)  # optimizer steps between the sampler's policy and the trainer's
    if batch.old_logprobs is not None:  # else the update reported it (old-log-prob pass fused into it)
        out["actor/entropy"] = float(masked_mean(batch.entropy, batch.response_mask))
    if batch.values is not None:
        out["critic/vf_explained_var"] = explained_variance(batch.returns, batch.values, batch.response_mask)
        out["critic/values_mean"] = float(masked_mean(batch.values, batch.response_mask))
    return out


def dump_rollouts(cfg, parts, batch: TrainBatch, rollouts, *, step: int) -> None:
    """Every ``log.rollouts_every`` steps: the step's rollouts to rollouts.jsonl."""
    every = cfg.log.rollouts_every
    if every and (step + 1) % every == 0:
        for row in rollout_records(batch, rollouts.trajs, rollouts.results, parts.tokenizer):
            parts.logger.log_record(step + 1, row, file="rollouts.jsonl")
