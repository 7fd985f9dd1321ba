"""The run's pieces, built once from the config: the collector (credo.collect.registry), the batch transforms
(credo.train.transforms), the loss terms (credo.train.loss_terms, built by the update's options), the step's plan
(which passes run: credo.train.plan), the optional frozen reference and critic.

    collector  = build_collector(cfg, engine=..., runner=..., model=..., tokenizer=..., data=..., sampler=...)
    transforms = build_transforms(BuildContext(cfg, model, tokenizer, run_dir))
    plan       = build_plan(cfg, collector, transforms)

Each piece is registered by the package that owns it; nothing here names a method. Checkpoints save the collector's
state under :data:`COLLECTOR_KEY`.
"""
from __future__ import annotations

from pathlib import Path

from credo.algo import advantage_requirements, policy_loss_requirements, policy_loss_uses_rollout_logprobs
from credo.algo.critic import critic_loss_requirements
from credo.collect.base import Collector
from credo.collect.registry import CollectorInputs
from credo.collect.registry import build_collector as _build
from credo.config import RunConfig
from credo.models import ValueModel, load_model, save_model
from credo.recipes.common import training_runner
from credo.train.loss_terms import build_loss_terms
from credo.train.plan import StepPlan, step_plan

COLLECTOR_KEY = "collector"  # the trainer state's key of the collector's state_dict


def build_collector(cfg: RunConfig, *, engine, runner, model, tokenizer, data, sampler, run_dir: Path,
                    guards=None) -> Collector:
    """The run's collector: ``rollout.collector.type``'s, through the registered wrappers (RLEP's replay when
    ``replay`` is set)."""
    x = CollectorInputs(cfg, engine, runner, model, tokenizer, data, sampler, Path(run_dir), guards,
                        runner_for=lambda step: training_runner(cfg, runner, step))
    return _build(x)


def shardable(cfg: RunConfig) -> bool:
    """Whether the collector's rollouts may be split over data-parallel ranks (``distributed.rollout=shard``): not
    agent episodes, not filtered groups (whose refills depend on the whole batch)."""
    c = cfg.rollout.collector
    return c.type != "agent" and not getattr(c, "filter_groups", False)


def build_plan(cfg: RunConfig, transforms) -> StepPlan:
    """The passes of the run's steps, from what the estimator, the policy loss, the loss terms, the transforms and
    the critic loss declare (credo.train.plan; the collector's ``needs`` are asked every step)."""
    a = cfg.algo
    critic = needs_critic(cfg)
    return step_plan(
        estimator_inputs=tuple(advantage_requirements(a.advantage, a.advantage_args)),
        loss_reads=tuple(policy_loss_requirements(a.policy_loss, a.policy_loss_args)),
        term_reads=tuple(r for t in build_loss_terms(cfg) for r in t.reads),
        transform_reads=tuple(r for t in transforms for r in t.reads),
        critic_reads=critic_loss_requirements(cfg.critic.loss, cfg.critic.loss_args) if critic else (),
        critic=critic, one_step_off=cfg.rollout.one_step_off, bypass_loss=policy_loss_uses_rollout_logprobs(a.policy_loss))


# ----------------------------------------------------------------------------- the optional reference and critic

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


def save_reference(cfg: RunConfig, plan: StepPlan, policy, tokenizer, run_dir: Path) -> None:
    """A new run saves its frozen reference (when the plan reads one); a LoRA policy's is its base, nothing to
    save."""
    if plan.reference and cfg.model.lora is None:
        save_model(policy, tokenizer, run_dir / "reference")


def load_reference(cfg: RunConfig, plan: StepPlan, run_dir: Path, policy=None):
    """The frozen reference policy saved in the run directory at the start (None when the plan reads none); for a
    LoRA policy the policy itself, which the reference pass runs with its adapters disabled (no second copy)."""
    if not plan.reference:
        return None
    if cfg.model.lora is not None:
        return policy
    ref, _ = load_model(run_dir / "reference", cfg.model)
    ref.eval().requires_grad_(False)
    return ref
