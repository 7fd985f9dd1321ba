"""The recipe's pluggable stages, chosen once from the config: the collector (``rollout.collector.type``, wrapped
by RLEP's replay when ``replay`` is set) and the token selector (``token_select.type``).

    collector = build_collector(cfg, engine=..., runner=..., model=..., tokenizer=..., data=..., sampler=...)
    selector  = build_token_selector(cfg, model, tokenizer)

The RL step then calls ``collector.collect`` / ``collector.rewards`` and ``selector.select`` and asks their ``needs``
(:func:`needs_old_logprob_pass`); it never branches on which method was chosen. Checkpoints save the collector's
state under :data:`COLLECTOR_KEY`; :func:`collector_state` also reads the layout written before the seam existed.
The optional frozen reference and critic are decided here too (:func:`needs_reference`, :func:`needs_critic`), and
the step's reference pass (:func:`apply_reference`) and metrics (:func:`step_metrics`) live here.

``collector.start(run_dir)`` runs once on a new run after the step-0 evaluation (RLEP's ``replay.pool=warm_start``
collects its pool there, from the warm-started policy).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from credo.algo import (advantage_accepts, advantage_requirements, kl_penalty, masked_mean, policy_loss_requirements,
                        policy_loss_uses_rollout_logprobs)
from credo.algo.advantages import explained_variance, token_rewards
from credo.algo.critic import critic_loss_requirements
from credo.algo.rollout_correction import rollout_is_weights
from credo.collect.agent import AgentCollector, AgentOptions
from credo.collect.base import Collector
from credo.collect.group import GroupCollector, GroupOptions
from credo.config import RunConfig
from credo.data import PromptSampler
from credo.methods.attnrl.collector import TreeCollector, TreeOptions
from credo.methods.distill.stage import needs_student_logprobs
from credo.methods.rlep.collector import ReplayCollector
from credo.methods.vepo.grounding import prompt_offset
from credo.methods.vepo.select import VepoSelector
from credo.models import ValueModel, load_model, save_model
from credo.models.lora import adapters_disabled, is_lora
from credo.recipes.common import sampling_params, training_runner
from credo.train.forward import ForwardOptions, batched_logprobs
from credo.train.stats import Timer
from credo.train.token_select import AllTokens, EntropySelector, TokenSelector
from credo.train.update import rollout_correction_mode
from credo.types import SamplingParams, TrainBatch

COLLECTOR_KEY = "collector"  # the trainer state's key of the collector's state_dict


@dataclass(frozen=True)
class CollectorInputs:
    """What a collector may be built from (each builder takes what it uses)."""

    cfg: RunConfig
    engine: Any
    runner: Any  # the verifier runner (None for agent runs and on Ray follower ranks)
    model: Any  # the policy
    tokenizer: Any
    data: Any  # TaskData
    sampler: Any  # the prompt sampler (this rank's share when rollouts are sharded)
    run_dir: Path
    guards: Any = None  # the run's credo.guards.Guards (the agent collector checks tool_calls / env_failures)

    def runner_for(self, step: int):
        """The runner that scores step ``step``'s training rollouts (credo.recipes.common.training_runner)."""
        return training_runner(self.cfg, self.runner, step)


def _group(x: CollectorInputs) -> Collector:
    return GroupCollector(x.engine, x.runner_for, x.sampler, sampling_params(x.cfg), GroupOptions.of(x.cfg))


def _tree(x: CollectorInputs) -> Collector:
    return TreeCollector(TreeOptions.of(x.cfg), x.engine, x.runner_for, x.sampler, x.model, x.tokenizer)


def _agent(x: CollectorInputs) -> Collector:
    stage_samplers = [PromptSampler(exs, seed=x.cfg.seed + i) for i, exs in enumerate(x.data.stage_train)]
    return AgentCollector(AgentOptions.of(x.cfg), x.engine, x.tokenizer, x.sampler, stage_samplers,
                          sampling_params(x.cfg), guards=x.guards)


COLLECTORS: dict[str, Callable[[CollectorInputs], Collector]] = {"group": _group, "tree": _tree, "agent": _agent}


def build_collector(cfg: RunConfig, *, engine, runner, model, tokenizer, data, sampler, run_dir: Path,
                    guards=None) -> Collector:
    """The run's collector: ``rollout.collector.type``'s, its groups mixed with replayed answers when ``replay`` is
    set (RLEP; the loader allows it with single-turn group collection only)."""
    x = CollectorInputs(cfg, engine, runner, model, tokenizer, data, sampler, Path(run_dir), guards)
    kind = cfg.rollout.collector.type
    if kind not in COLLECTORS:
        raise NotImplementedError(f"rollout.collector.type={kind}: a config option without a collector; add a "
                                  f"builder to credo.recipes.stages.COLLECTORS (docs/extending.md)")
    collector = COLLECTORS[kind](x)
    if cfg.replay is not None:
        collector = ReplayCollector(collector, cfg, run_dir=x.run_dir, tokenizer=tokenizer, runner_for=x.runner_for,
                                    engine=engine, runner=runner, data=data)
    return collector


def shardable(cfg: RunConfig) -> bool:
    """Whether the collector's rollouts may be split over data-parallel ranks (``distributed.rollout=shard``): not
    agent episodes, not filtered groups (whose refills depend on the whole batch)."""
    c = cfg.rollout.collector
    return c.type != "agent" and not getattr(c, "filter_groups", False)


def _entropy(cfg: RunConfig, model, tokenizer) -> TokenSelector:
    return EntropySelector(cfg.token_select.quantile)


def _vepo(cfg: RunConfig, model, tokenizer) -> TokenSelector:
    offset = prompt_offset(cfg.task.prompt_template, chat=cfg.task.chat_template, tokenizer=tokenizer)
    return VepoSelector(cfg.token_select, model, tokenizer, seed=cfg.seed, offset=offset,
                        micro_batch_size=cfg.train.micro_batch_size, opts=ForwardOptions.of(cfg))


# token_select.type -> builder(cfg, model, tokenizer); a new option (credo.config.fields.register_choice) adds one
TOKEN_SELECTORS: dict[str, Callable[[RunConfig, Any, Any], TokenSelector]] = {
    "none": lambda cfg, model, tokenizer: AllTokens(), "entropy": _entropy, "vepo": _vepo}


def build_token_selector(cfg: RunConfig, model, tokenizer) -> TokenSelector:
    """The run's token selector: ``token_select.type``'s builder in :data:`TOKEN_SELECTORS`."""
    kind = cfg.token_select.type
    if kind not in TOKEN_SELECTORS:
        raise NotImplementedError(f"token_select.type={kind}: a config option without a selector; add a builder "
                                  f"to credo.recipes.stages.TOKEN_SELECTORS (docs/extending.md)")
    return TOKEN_SELECTORS[kind](cfg, model, tokenizer)


def needs_old_logprob_pass(collector: Collector, selector: TokenSelector) -> bool:
    """Whether the collected rows or the token selection require the separate old-log-prob pass."""
    return collector.needs.old_logprob_pass or selector.needs.old_logprob_pass


def collector_state(saved: dict[str, Any]) -> dict[str, Any]:
    """The collector's state in a trainer state: under :data:`COLLECTOR_KEY`, or in a checkpoint written before the
    collector seam, gathered from its old places (the prompt samplers, RLEP's ``replay``, AttnRL's run-state
    field ``attnrl``)."""
    if COLLECTOR_KEY in saved:
        return saved[COLLECTOR_KEY]
    return {"sampler": saved["sampler"], "stage_samplers": saved.get("stage_samplers") or [],
            "replay": saved.get("replay"), "attnrl": dict(saved["run"].get("attnrl") or {})}


# ----------------------------------------------------------------------------- the optional reference and critic

def needs_reference(cfg: RunConfig) -> bool:
    """A frozen reference policy: a KL term, or a loss / critic loss that reads its log-probs or entropy."""
    a = cfg.algo
    return a.kl_coef > 0 or "ref_logprobs" in policy_loss_requirements(a.policy_loss, a.policy_loss_args) \
        or bool({"ref_logprobs", "ref_entropy"} & set(critic_requirements(cfg)))


def critic_requirements(cfg: RunConfig) -> tuple[str, ...]:
    """Inputs the configured critic loss needs (none without a critic)."""
    return critic_loss_requirements(cfg.critic.loss, cfg.critic.loss_args) if needs_critic(cfg) else ()


def needs_critic(cfg: RunConfig) -> bool:
    """``critic.enabled``, or when null whether the advantage estimator reads values."""
    if cfg.critic.enabled is not None:
        return cfg.critic.enabled
    return bool({"values", "value_quantiles"} & set(advantage_requirements(cfg.algo.advantage,
                                                                             cfg.algo.advantage_args)))


def new_critic(cfg: RunConfig, policy) -> ValueModel:
    """A new run's critic: loaded from ``critic.path``, else a value head on a copy of the policy."""
    critic = ValueModel.load(cfg.critic.path, cfg.model.device) if cfg.critic.path else \
        ValueModel.from_policy(policy, cfg.critic.head, **cfg.critic.head_args)
    if not isinstance(critic, ValueModel):  # ValueModel.load also loads implicit (LM-only) reward models
        raise ValueError(f"critic.path={cfg.critic.path}: a {type(critic).__name__} has no value head and cannot "
                         "be a critic")
    return critic


def save_reference(cfg: RunConfig, policy, tokenizer, run_dir: Path) -> None:
    """A new run saves its frozen reference (when one is needed); a LoRA policy's is its base, nothing to save."""
    if needs_reference(cfg) and cfg.model.lora is None:
        save_model(policy, tokenizer, run_dir / "reference")


def load_reference(cfg: RunConfig, run_dir: Path, policy=None):
    """The frozen reference policy saved in the run directory at the start (None when none is needed); for a LoRA
    policy the policy itself, which :func:`apply_reference` runs with its adapters disabled (no second copy)."""
    if not needs_reference(cfg):
        return None
    if cfg.model.lora is not None:
        return policy
    ref, _ = load_model(run_dir / "reference", cfg.model)
    ref.eval().requires_grad_(False)
    return ref


# estimator inputs that every trajectory carries in its ``info`` (the input name -> the info key)
TRAJECTORY_INPUTS = {"tree_paths": "tree_path"}  # AttnRL's tree collector: each row's TreePath


# token statistics of the behaviour policy the old-log-prob pass computes when the estimator needs them, and every
# estimator input that comes from that pass (an estimator needing one keeps the pass)
PASS_STATS = ("entropy_direction", "sum_pi_squared")
PASS_OUTPUTS = {"entropy_direction", "entropy_history", "sum_pi_squared", "old_logprobs"}


def reward_components(results) -> dict[str, torch.Tensor]:
    """name -> (B,) score of each reward component every row's result names (``info["components"]``: the
    ``reward.mix`` components, or the extra numeric keys of a verifier that returns a dict), in the first row's
    order; {} when some row has none."""
    comps = [r.info.get("components") or {} for r in results]
    names = [n for n in (comps[0] if comps else {}) if all(n in c for c in comps)]
    return {n: torch.tensor([float(c[n]) for c in comps]) for n in names}


def estimator_rollout_weights(cfg: RunConfig, batch: TrainBatch) -> dict[str, torch.Tensor]:
    """{"rollout_is_weights": (B, T)} for an estimator that accepts them (the Optimal Token Baseline scales its
    energy by w^2), when ``algo.rollout_correction`` is on and the old-log-prob pass ran; {} otherwise."""
    mode = rollout_correction_mode(cfg)
    if "rollout_is_weights" not in advantage_accepts(cfg.algo.advantage) or mode == "none" \
            or batch.old_logprobs is None:
        return {}
    weights, _ = rollout_is_weights(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask, mode=mode,
                                    low=cfg.algo.rollout_is_low, high=cfg.algo.rollout_is_high)
    return {"rollout_is_weights": weights}


def trajectory_inputs(trajs) -> dict[str, Callable[[], list]]:
    """Providers of the :data:`TRAJECTORY_INPUTS` of ``trajs`` (for the advantage inputs' table)."""
    return {name: (lambda key=key: [t.info[key] for t in trajs]) for name, key in TRAJECTORY_INPUTS.items()}


# ----------------------------------------------------------------------------- the reference pass and step metrics

def apply_reference(cfg: RunConfig, ref_model, batch: TrainBatch, metrics: dict, timer: Timer,
                    rewards: torch.Tensor) -> torch.Tensor:
    """Reference log-probs when a KL term needs them; returns ``rewards`` ((B,) scores or (B, T) token rewards),
    KL-penalised per token if ``algo.kl_in_reward``."""
    a = cfg.algo
    if ref_model is None:
        return rewards
    entropy = "ref_entropy" in critic_requirements(cfg)  # VRPO's critic reads the frozen LM's entropy
    with timer("ref"), adapters_disabled(ref_model) if is_lora(ref_model) else contextlib.nullcontext():
        batch.ref_logprobs, stats = batched_logprobs(
            ref_model, batch, micro_batch_size=cfg.train.micro_batch_size,
            micro_batch_tokens=cfg.train.micro_batch_tokens, temperature=batch.temperature,
            stats=("entropy",) if entropy else (), opts=ForwardOptions.of(cfg))
        batch.ref_entropy = stats.get("entropy")
    kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, a.kl_estimator) * batch.response_mask  # (B, T)
    metrics["actor/kl"] = float(masked_mean(kl, batch.response_mask))
    if not (a.kl_in_reward and a.kl_coef > 0):
        return rewards
    # token-level rewards, as verl: the score on its token minus kl_coef * KL_t on every token
    metrics["actor/reward_kl_penalty"] = float((a.kl_coef * kl.sum(-1)).mean())
    metrics["actor/reward_kl_penalty_coeff"] = a.kl_coef
    token_scores = rewards if rewards.dim() == 2 else token_rewards(rewards, batch.response_mask)
    return token_scores - a.kl_coef * kl


def greedy_baselines(rollout, trajs, timer: Timer, *, max_new_tokens: int) -> torch.Tensor:
    """ReMax baseline: the score of one greedy response per prompt, repeated over the prompt's samples (generated
    and scored by the leader's engine and runner of ``rollout``, a RolloutCoordinator)."""
    first = {}
    for t in trajs:
        first.setdefault(t.group_id, t.example)

    def leader() -> list[float]:
        rollout.idle()  # one engine call at a time
        greedy = rollout.engine.generate(list(first.values()), 1,
                                       SamplingParams(greedy=True, max_new_tokens=max_new_tokens))
        return [r.score for r in rollout.runner.score([g.response_text for g in greedy], [g.example for g in greedy])]

    with timer("gen_baseline"):
        scores = rollout.leader(leader)
    by_group = dict(zip(first, scores))
    return torch.tensor([by_group[t.group_id] for t in trajs], dtype=torch.float32)


def step_metrics(batch: TrainBatch, trajs, timer: Timer, *, step: int) -> dict[str, float]:
    n_resp = float(batch.response_mask.sum())
    n_total = n_resp + sum(len(t.prompt_ids) for t in trajs)
    out = {"advantages/abs_mean": float(masked_mean(batch.advantages.abs(), batch.response_mask)),
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


def advantage_inputs(cfg: RunConfig, parts, batch: TrainBatch, rollouts, needs: tuple[str, ...],
                     token_stats: dict[str, torch.Tensor], state, timer: Timer) -> dict[str, Any]:
    """The optional inputs the configured estimator declares it needs, and only those; plus the rollout-correction
    weights for an estimator that accepts them, when ``algo.rollout_correction`` is on."""
    trajs = rollouts.trajs
    providers = {
        "values": lambda: batch.values,
        "value_quantiles": lambda: batch.value_quantiles,
        "entropy_direction": lambda: token_stats["entropy_direction"],
        "sum_pi_squared": lambda: token_stats["sum_pi_squared"],
        "old_logprobs": lambda: batch.old_logprobs,
        "entropy_history": lambda: list(state.entropy_history),
        "reward_baselines": lambda: greedy_baselines(parts.rollout, trajs, timer,
                                                     max_new_tokens=cfg.rollout.max_new_tokens),
        "reward_components": lambda: reward_components(rollouts.results),
        **trajectory_inputs(trajs),  # inputs each row carries from its collector
    }
    return {name: providers[name]() for name in needs} | estimator_rollout_weights(cfg, batch)


def fuse_old_logprobs(cfg: RunConfig, parts, adv_needs: tuple[str, ...], batch_size: int) -> bool:
    """Whether the old-log-prob pass can be skipped: no reference KL on old log-probs, no estimator that reads the
    pass's outputs, no critic (whose warm-up steps skip the policy update), not one-step-off, and neither the
    collector nor the token selector needs the pass (``needs``: e.g. rows the engine did not sample, a selection made
    from the behaviour policy before the update); and either one optimizer step on the whole batch (so the policy
    has not moved when the loss is computed) or a loss whose old log-probs are the sampler's (verl's bypass mode)."""
    t = cfg.train
    one_step = t.ppo_epochs == 1 and (t.mini_batch_size or batch_size) >= batch_size
    return (t.old_logprob_pass == "auto" and (one_step or policy_loss_uses_rollout_logprobs(cfg.algo.policy_loss))
            and parts.ref_model is None and not PASS_OUTPUTS & set(adv_needs)
            and parts.critic is None and not cfg.rollout.one_step_off
            and not needs_old_logprob_pass(parts.collector, parts.selector)
            and not needs_student_logprobs(cfg))  # distillation reads the student's no-grad log-probs
