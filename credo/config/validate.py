"""Cross-field checks of a loaded config, before any model is built: the core ones here, the rest beside the
config they check.

The core checks need nothing above ``credo.config`` but the registries of :mod:`credo.algo` (losses, estimators,
critic losses): the model / task / log sections every command's config has (:func:`validate_common`), the batch
sizes, ``distributed``, the algorithm's names and hyperparameters, the estimator's inputs and the critic.

A check that needs a package above ``credo.config`` (environments, rewards, tasks, models, a method) lives in that
package, beside the config dataclass it checks, and registers itself in :data:`VALIDATORS`::

    from credo.config.validate import ConfigError, register_validator

    @register_validator("rollout.collector.tree")      # one registration per choice / section
    def validate_tree(cfg) -> None:                     # the whole RunConfig; a no-op when its section is off
        if cfg.rollout.collector.type == "tree" and ...:
            raise ConfigError("rollout.one_step_off: not implemented with rollout.collector.type=tree (...)")

The table's built-ins are named by module (:data:`BUILTIN_VALIDATORS`, imported on the first check), so this
module imports none of them; a plugin (``plugins:``, ``--plugin``) registers its own the same way, by being
imported before the config is checked. The registered validators run after the core checks, in the order of
their names; each raises a one-line :class:`ConfigError` naming the key.
"""
from __future__ import annotations

import difflib
from typing import Any, Callable

from credo.errors import ConfigError
from credo.registry import Registry
from credo.tracking.trackers import validate_trackers

# estimator inputs that only some collectors record on their rows (a collector config's ``provides``)
ROW_INPUTS = {"tree_paths"}

# the modules whose import registers the built-in validators (by name: they sit above credo.config)
BUILTIN_VALIDATORS = (
    "credo.models.validate",           # critic.head (critic.head_args build a head), model.vision
    "credo.data.validate",             # task (task.name, task.params)
    "credo.rewards.validate",          # reward (reward.name, reward.by_data_source, reward.mix, reward.noise)
    "credo.collect.config",            # rollout.collector.agent
    "credo.distributed.validate",      # rollout.async (bounded staleness, partial rollouts)
    "credo.methods.attnrl.config",     # rollout.collector.tree
    "credo.methods.vepo.config",       # token_select.vepo
    "credo.methods.rlep.config",       # replay
    "credo.methods.distill.config",    # distill
    "credo.config.ext",                # ext (plugin sections)
)

Validator = Callable[[Any], None]
VALIDATORS: Registry[Validator] = Registry("config validator", builtins=BUILTIN_VALIDATORS)


def register_validator(name: str) -> Callable[[Validator], Validator]:
    """Decorator: register ``fn(cfg) -> None`` (raising :class:`ConfigError`) as the check named ``name`` (the
    config key or choice it checks, e.g. ``replay`` or ``rollout.collector.agent``)."""
    return VALIDATORS.register(name)


def wrap(key: str, fn: Callable[[], Any]) -> None:
    """``fn()``; a KeyError / TypeError / ValueError / ImportError / AttributeError it raises (a registry lookup, a
    constructor's argument check) becomes a ConfigError ``KEY: message``."""
    try:
        fn()
    except (KeyError, TypeError, ValueError, ImportError, AttributeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(f"{key}: {msg}") from None


def did_you_mean(name: Any, known: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to ``name``, or an empty string."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ----------------------------------------------------------------------------- the checks

def validate_common(cfg: Any) -> None:
    """Checks of the sections every command's config has (model, task, log), before any model is built."""
    m = cfg.model
    if m.path is None and m.num_heads and m.hidden_size % m.num_heads:
        raise ConfigError(f"model.hidden_size: {m.hidden_size} must be divisible by model.num_heads={m.num_heads}")
    if m.path is None and m.num_heads % m.num_kv_heads:
        raise ConfigError(f"model.num_kv_heads: {m.num_kv_heads} must divide model.num_heads={m.num_heads}")
    if "{prompt}" not in cfg.task.prompt_template:
        raise ConfigError(f"task.prompt_template: must contain {{prompt}}, got {cfg.task.prompt_template!r}")
    if cfg.task.name == "file" and not cfg.task.train_file:
        raise ConfigError("task.train_file: required when task.name=file")
    if cfg.task.name != "file" and (cfg.task.train_file or cfg.task.eval_file):
        raise ConfigError(f"task.train_file: only used with task.name=file (task.name is {cfg.task.name!r})")
    validate_hub_task(cfg.task)
    validate_trackers(cfg.log)


def validate_hub_task(t: Any) -> None:
    """``task.name=hf`` names its dataset by hub id (``task.dataset``), and only it takes the hub keys."""
    from credo.config.hub_ref import parse_hub_id

    if t.name == "hf":
        if not t.dataset:
            raise ConfigError("task.dataset: required when task.name=hf (a hub dataset id, e.g. openai/gsm8k)")
        if parse_hub_id(t.dataset) is None:
            raise ConfigError(f"task.dataset: {t.dataset!r} is not a hub dataset id (org/name, optionally "
                              "@revision); a local file is task.name=file task.train_file=PATH")
        if t.eval_split is not None and t.eval_split == t.split:
            raise ConfigError(f"task.eval_split: the same split as task.split ({t.split!r}) would evaluate on the "
                              "training rows; name another split, or null to hold out task.eval_fraction")
    if t.answer_transform is not None and t.name not in ("file", "hf"):
        raise ConfigError(f"task.answer_transform: only used with task.name=file or hf (task.name is {t.name!r})")
    if t.name != "hf" and (t.dataset or t.subset or t.eval_split or t.streaming):
        raise ConfigError(f"task.dataset / subset / eval_split / streaming: only used with task.name=hf (task.name "
                          f"is {t.name!r})")


def validate_run(cfg: Any) -> None:
    """Every check of a ``credo train`` config: the core ones, then each registered validator."""
    validate_common(cfg)
    validate_batches(cfg)
    validate_distributed(cfg)
    validate_algo(cfg)
    validate_estimator_inputs(cfg)
    validate_critic(cfg)
    for _, check in VALIDATORS.items():
        check(cfg)


def validate_batches(cfg: Any) -> None:
    """The mini- and micro-batch sizes divide the rollout batch; the optimizer's betas."""
    t = cfg.train
    batch = t.prompts_per_step * cfg.rollout.group_size
    if t.mini_batch_size is not None and batch % t.mini_batch_size:
        raise ConfigError(f"train.mini_batch_size: {t.mini_batch_size} must divide the rollout batch "
                          f"prompts_per_step * group_size = {batch}")
    mini = t.mini_batch_size or batch
    if t.micro_batch_size is not None and mini % t.micro_batch_size:
        raise ConfigError(f"train.micro_batch_size: {t.micro_batch_size} must divide the mini-batch size {mini}")
    if t.micro_batch_size is not None and t.micro_batch_tokens is not None:
        raise ConfigError("train.micro_batch_tokens: set either it or train.micro_batch_size, not both")
    if t.mixed_precision == "fp16" and cfg.distributed.strategy == "fsdp2":
        raise ConfigError("train.mixed_precision=fp16: not implemented with distributed.strategy=fsdp2 (loss "
                          "scaling of sharded gradients); use bf16")
    if t.mixed_precision != "none" and cfg.model.dtype != "float32":
        raise ConfigError(f"train.mixed_precision={t.mixed_precision}: needs model.dtype=float32 (the float32 master "
                          f"weights), got {cfg.model.dtype}")
    if t.budget != "steps" and t.budget_value <= 0:
        raise ConfigError(f"train.budget_value: train.budget={t.budget} needs a positive budget_value")
    if t.budget != "steps" and cfg.distributed.backend != "none":
        raise ConfigError(f"train.budget={t.budget}: not implemented with several ranks (the ranks would have to agree "
                          "on the step that spends the budget); use train.budget=steps or one process")
    if len(t.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in t.betas):
        raise ConfigError(f"train.betas: expected two numbers in [0, 1), got {t.betas!r}")


def validate_distributed(cfg: Any) -> None:
    """``distributed``: fault-injection entries, and the modes that need several ranks or another backend."""
    d = cfg.distributed
    for entry in d.inject_faults:
        parts = str(entry).split(":")
        if len(parts) != 3 or parts[0] not in ("rollout", "reward") or not all(p.isdigit() for p in parts[1:]) \
                or int(parts[2]) < 1:
            raise ConfigError(f"distributed.inject_faults: {entry!r} is not KIND:WORKER:CALL "
                              f"(KIND rollout or reward, CALL >= 1)")
    if d.backend == "ray" and cfg.reward.mix:
        raise ConfigError("reward.mix: not implemented with distributed.backend=ray (the Ray reward workers run one "
                          "verifier); mix in one process or under torchrun")
    if cfg.rollout.engine == "vllm" and d.backend == "ray" and cfg.rollout.vllm.mode == "server":
        raise ConfigError("rollout.vllm.mode=server: not implemented for Ray rollout workers (each worker runs its "
                          "own in-process vLLM); use rollout.vllm.mode=inprocess")
    sync = cfg.rollout.vllm.weight_sync
    if cfg.rollout.engine == "vllm" and sync in ("nccl", "ipc") and not str(cfg.model.device).startswith("cuda"):
        raise ConfigError(f"rollout.vllm.weight_sync={sync}: vLLM's {sync} engine moves CUDA tensors, but "
                          f"model.device={cfg.model.device}; use torchdist (or auto)")
    if d.strategy == "fsdp2" and d.backend == "none":
        raise ConfigError("distributed.strategy=fsdp2: needs several ranks (distributed.backend=torchrun or ray)")
    if d.backend != "ray" and (d.world_size > 1 or d.inject_faults):
        raise ConfigError("distributed.world_size / inject_faults: only used with distributed.backend=ray "
                          "(torchrun sets the world size with --nproc-per-node)")


def validate_algo(cfg: Any) -> None:
    """The policy loss, estimator, KL estimator and critic loss are registered, with the hyperparameters they take."""
    from credo import algo
    from credo.algo.critic import check_critic_loss_hparams, critic_loss_requirements

    a = cfg.algo
    for key, fn in (("algo.policy_loss", lambda: algo.check_policy_loss_hparams(a.policy_loss, {})),
                    ("algo.advantage", lambda: algo.check_advantage_hparams(a.advantage, {})),
                    ("algo.policy_loss_args", lambda: algo.check_policy_loss_hparams(a.policy_loss, a.policy_loss_args)),
                    ("algo.advantage_args", lambda: algo.check_advantage_hparams(a.advantage, a.advantage_args)),
                    ("algo.kl_estimator", lambda: algo.canonical_kl(a.kl_estimator)),
                    ("critic.loss", lambda: check_critic_loss_hparams(cfg.critic.loss, {})),
                    ("critic.loss_args", lambda: check_critic_loss_hparams(cfg.critic.loss, cfg.critic.loss_args)),
                    ("critic.loss_args", lambda: critic_loss_requirements(cfg.critic.loss, cfg.critic.loss_args))):
        wrap(key, fn)


def validate_estimator_inputs(cfg: Any) -> None:
    """What the estimator declares it needs (its registration) is there: a critic for ``values``, and groups of
    at least two samples for a group baseline (with G = 1 the baseline is the sample itself or nothing)."""
    from credo.algo import ADVANTAGE_ESTIMATORS

    a = cfg.algo
    entry = ADVANTAGE_ESTIMATORS[a.advantage]
    if {"values", "value_quantiles"} & set(entry.requirements(a.advantage_args)) and cfg.critic.enabled is False:
        raise ConfigError(f"critic.enabled: algo.advantage={a.advantage} reads a critic's values; set "
                          f"critic.enabled=true (or leave it null), or pick an estimator without a critic")
    rows = ROW_INPUTS & set(entry.requirements(a.advantage_args))
    provided = set(getattr(type(cfg.rollout.collector), "provides", ()))
    if rows - provided:
        raise ConfigError(f"algo.advantage={a.advantage}: reads {', '.join(sorted(rows - provided))} of every row, "
                          f"which rollout.collector.type={cfg.rollout.collector.type} does not provide"
                          f"{' (AttnRL: rollout.collector.type=tree)' if 'tree_paths' in rows else ''}")
    p = cfg.replay
    group = cfg.rollout.group_size + ((p.num + p.negative) if p is not None else 0)
    if entry.groups and group < 2:
        raise ConfigError(f"rollout.group_size: algo.advantage={a.advantage} compares each sample with the others "
                          f"of its prompt's group and needs rollout.group_size >= 2 (got {group}); use a larger "
                          f"group or an estimator without a group baseline (reinforce_pp, remax, gae)")


def validate_critic(cfg: Any) -> None:
    """The critic's head, loss and the estimator fit together (a run would fail at its first update otherwise);
    the head's arguments are checked by building one (``critic.head``, :mod:`credo.models.validate`)."""
    c, adv = cfg.critic, cfg.algo.advantage
    if "dvpo" in (c.loss, adv) and c.head != "quantile":
        raise ConfigError(f"critic.head: dvpo needs critic.head=quantile (got {c.head!r})")
    if c.loss == "dvpo" and adv != "dvpo":
        raise ConfigError(f"critic.loss=dvpo: needs algo.advantage=dvpo (its distributional GAE makes the quantile "
                          f"targets), got {adv!r}")
    if c.loss == "vrpo" and c.head != "vib":
        raise ConfigError(f"critic.loss=vrpo: needs critic.head=vib (got {c.head!r})")
    if "dfpo" in (c.loss, adv):
        validate_flow_critic(cfg)


def validate_flow_critic(cfg: Any) -> None:
    """DFPO: a flow head, and the loss, the estimator and their hyperparameters fit (credo.algo.dfpo)."""
    from credo.algo.critic import CRITIC_LOSSES
    from credo.algo.dfpo import check_dfpo_config
    from credo.algo.registry import ADVANTAGE_ESTIMATORS

    c, adv = cfg.critic, cfg.algo.advantage
    if c.head != "flow":
        raise ConfigError(f"critic.head: dfpo needs critic.head=flow (got {c.head!r})")
    gamma = {**ADVANTAGE_ESTIMATORS[adv].hparams, **cfg.algo.advantage_args}.get("gamma")
    try:
        check_dfpo_config(c.loss, {**CRITIC_LOSSES[c.loss].hparams, **c.loss_args}, adv, gamma,
                          int(c.head_args.get("quantiles", 32)))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
