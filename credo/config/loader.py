"""Load a :class:`RunConfig` from YAML presets plus ``key=value`` overrides, and validate it.

Every problem is reported as a one-line :class:`ConfigError` naming the key, with a suggestion
for typos, before any model is built. Validation has two layers: structure and types here, and
names that live in registries (tasks, rewards, losses, estimators, their hyperparameters) in
:func:`validate_registries`.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from credo.config import legacy
from credo.config.fields import resolve_class
from credo.config.schema import TRACKERS, RunConfig
from credo.config.yaml_safe import YamlConfigError, load_yaml, read_mapping
from credo.methods.distill.config import validate_distill

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# input paths a preset may give relative to its own folder (load_config); overrides stay relative to the cwd
PRESET_PATH_KEYS = ("model.path", "critic.path", "task.train_file", "task.eval_file", "rm.train_file", "rm.eval_file",
                    "replay.pool")


# estimator inputs that only some collectors record on their rows (a collector config's ``provides``)
ROW_INPUTS = {"tree_paths"}


class ConfigError(ValueError):
    """A bad configuration; the message is one line and names the key."""


# ----------------------------------------------------------------------------- public API

def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                root: type = RunConfig, untrusted_dir: str | Path | None = None) -> Any:
    """Defaults <- YAML preset (``path`` or a preset name in ``configs/``) <- ``key=value`` overrides, as a
    ``root`` (:class:`RunConfig` for ``credo train``; ``credo rm train`` has its own root).

    Relative input paths in the preset (:data:`PRESET_PATH_KEYS`) are relative to the preset's folder
    (:func:`resolve_preset_paths`); paths in overrides are used as given (relative to the working directory).
    Keys of the older layout are mapped to their new places with a deprecation notice (:mod:`credo.config.legacy`).
    ``untrusted_dir`` (a resumed run's directory): no plugin module may be imported from inside it."""
    rm_sections = "refuse" if root is RunConfig else "keep"
    data: dict[str, Any] = {}
    try:
        if path:
            preset = resolve_preset(path)
            data = legacy.upgrade(resolve_preset_paths(read_yaml(preset), preset), rm_sections=rm_sections)
        old: dict[str, Any] = {}
        for item in overrides:
            key, value = parse_override(item)
            if legacy.alias_key(key) != key:
                legacy.agent_collector(data, key)
                key = legacy.alias_key(key)
            if key.endswith("+"):  # key+=value: append to a list (--plugin M is plugins+=M)
                key, value = key[:-1].strip(), _appended(data, key[:-1].strip(), value)
            set_dotted(old if legacy.is_legacy_key(key) else data, key, value)
        if old:
            legacy.merge(data, legacy.upgrade_overrides(old, data))
    except legacy.LegacyError as exc:
        raise ConfigError(str(exc)) from None
    if root is RunConfig:
        import_plugins(data.get("plugins"), untrusted_dir=untrusted_dir)
    return config_from_dict(data, root=root)


def _appended(data: dict[str, Any], key: str, value: Any) -> list:
    """The list at dotted ``key`` of ``data`` (empty when unset) with ``value`` (or each item of a list) appended."""
    node: Any = data
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is not None and not isinstance(node, list):
        raise ConfigError(f"{key}+=...: {key} is not a list")
    extra = value if isinstance(value, list) else [value]
    return [*(node or []), *(v for v in extra if v not in (node or []))]


def import_plugins(plugins: Any, *, untrusted_dir: str | Path | None = None) -> None:
    """Import every module of ``plugins`` (a list of module names; the working directory is searched first), so
    that what they register (environments, AgentGym adapters, rewards, tasks, losses) is known before the config
    is checked. A module that is missing or fails to import is one ConfigError line. A module that would be
    loaded from inside ``untrusted_dir`` (a resumed run's directory: ``cd RUN && credo train --resume .``) is
    refused before it is imported: resuming never runs code from the run directory."""
    import importlib
    import sys

    if plugins is None:
        return
    if not isinstance(plugins, list) or not all(isinstance(m, str) and m for m in plugins):
        raise ConfigError(f"plugins: expected a list of module names, got {plugins!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in plugins:
        if untrusted_dir is not None and name not in sys.modules:
            _refuse_plugin_inside(name, Path(untrusted_dir))
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a user module may raise anything while it is imported
            raise ConfigError(f"plugins: importing {name!r} failed: {type(exc).__name__}: {exc}") from None


def _refuse_plugin_inside(name: str, run_dir: Path) -> None:
    """ConfigError when module ``name`` (or its top-level package) would be loaded from a file under
    ``run_dir``. Only the top-level package is located, which imports nothing (``find_spec`` of a dotted name
    would import its parents first)."""
    import importlib.util

    top = name.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return  # missing: the import below reports it
    if spec is None:
        return
    places = [spec.origin] if spec.origin and spec.has_location else []
    places += list(spec.submodule_search_locations or [])
    root = run_dir.resolve()
    for place in places:
        where = Path(place).resolve()
        if where == root or root in where.parents:
            raise ConfigError(f"plugins: {name!r} would be imported from the run directory ({where}); resuming "
                              f"never runs code from a run directory: install the module or put it on PYTHONPATH "
                              f"outside {run_dir}")


def config_from_dict(data: dict[str, Any], *, root: type = RunConfig) -> Any:
    cfg = build(root, data, prefix="", root=root)
    if root is RunConfig:
        validate_semantics(cfg)
    else:
        validate_common(cfg)
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_config(cfg: RunConfig, path: Path) -> None:
    """Write ``cfg`` as YAML to ``path`` atomically, through a temporary file of an unpredictable name (a link
    planted in a run directory is replaced, never written through)."""
    from credo.tracking.atomic import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None))


def resolve_preset(name: str) -> Path:
    p = Path(name)
    if p.is_file():
        return p
    for cand in (Path("configs") / name, Path("configs") / f"{name}.yaml", REPO_CONFIGS / name,
                 REPO_CONFIGS / f"{name}.yaml"):
        if cand.is_file():
            return cand
    known = sorted(q.stem for q in REPO_CONFIGS.glob("*.yaml")) if REPO_CONFIGS.is_dir() else []
    close = difflib.get_close_matches(p.stem, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"config file {name!r} not found{hint}; presets: {', '.join(known) or 'none'}")


def resolve_preset_paths(data: dict[str, Any], preset: Path) -> dict[str, Any]:
    """``data`` (a preset read from ``preset``) with each relative path of :data:`PRESET_PATH_KEYS` made absolute
    against the preset's folder, so a preset works from any working directory. Absolute and ``~`` paths,
    ``replay.pool=warm_start``, and a path that exists only relative to the working directory (older presets, a
    run's ``config.yaml`` written from cwd-relative overrides) are left as they are."""
    base = preset.resolve().parent
    for key in PRESET_PATH_KEYS:
        section, name = key.split(".")
        node = data.get(section)
        value = node.get(name) if isinstance(node, dict) else None
        if not isinstance(value, str) or not value or value.startswith("~") or Path(value).is_absolute() \
                or (key == "replay.pool" and value == "warm_start"):
            continue
        here = Path(os.path.normpath(base / value))
        if here.exists() or not Path(value).exists():
            node[name] = str(here)
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        return read_mapping(path)
    except YamlConfigError as exc:
        raise ConfigError(str(exc)) from None


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. train.lr=1e-3)")
    key, text = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        return key, parse_value(text, f"override {key}")
    except YamlConfigError as exc:
        raise ConfigError(str(exc)) from None


def parse_value(text: str, source: str = "value") -> Any:
    """YAML scalar/list parsing (:func:`load_yaml`: an alias bomb is a YamlConfigError naming ``source``), plus
    numbers YAML 1.1 leaves as strings (``1e-3``); text that is not YAML stays the string it is."""
    try:
        value = load_yaml(text, source) if text.strip() else ""
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        for conv in (int, float):
            try:
                return conv(value)
            except ValueError:
                pass
    return value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = child
    if parts[-1] == "type" and node.get("type", value) != value:
        node.clear()  # another choice: the keys of the previous one do not apply
    node[parts[-1]] = value


# ----------------------------------------------------------------------------- structure and types

def build(cls: type, data: Any, prefix: str, root: type = RunConfig) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a section (mapping), got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            raise ConfigError(_unknown_key(prefix, key, list(fields), root))
    kwargs = {}
    for name, value in data.items():
        f, hint, full = fields[name], hints[name], prefix + name
        section = section_class(hint)
        if "choice" in f.metadata:
            kwargs[name] = build_choice(f, value, full, root)
        elif section is not None and value is None and type(None) in _union_args(hint):
            kwargs[name] = None  # an optional section switched off
        elif section is not None:
            kwargs[name] = build(section, value if value is not None else {}, full + ".", root)
        else:
            kwargs[name] = _check_value(full, _coerce(full, _word_of_bool(value, f.metadata), hint), f.metadata)
    return cls(**kwargs)


def _word_of_bool(value: Any, meta: dict) -> Any:
    """YAML reads ``off`` / ``on`` as booleans: a field whose choices name ``off`` (``on``) takes False (True) back
    as that word (``guards.first_ratio=off``)."""
    word = {False: "off", True: "on"}.get(value) if isinstance(value, bool) else None
    return word if word is not None and word in (meta.get("choices") or ()) else value


def build_choice(f: dataclasses.Field, value: Any, key: str, root: type) -> Any:
    """A choice section: its ``type`` (default: the field's) picks the dataclass, which checks the other keys."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a section (mapping) with a type, got {value!r}")
    options, kind = f.metadata["choice"], value.get("type", f.metadata["default_type"])
    if kind not in options:
        close = difflib.get_close_matches(str(kind), list(options), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key}.type: {kind!r} is not one of {', '.join(options)}{hint}")
    cls = resolve_class(options[kind])
    names = {g.name for g in dataclasses.fields(cls)}
    for other in value:
        if other not in names:
            owners = [t for t, c in options.items() if other in {g.name for g in dataclasses.fields(resolve_class(c))}]
            if owners:
                raise ConfigError(f"unknown key {key + '.' + other!r} for {key}.type={kind} (a key of type "
                                  f"{' / '.join(owners)})")
    return build(cls, value, key + ".", root)


def section_class(hint: Any) -> type | None:
    """The dataclass of a (possibly optional, ``X | None``) section hint, else None."""
    for t in _union_args(hint):
        if dataclasses.is_dataclass(t):
            return t
    return None


MOVED = {"rm": "reward-model settings belong to `credo rm train` (its own config)",
         "birm": "BiRM settings belong to `credo rm train rm.method=birm` (its own config)"}


def _unknown_key(prefix: str, key: str, siblings: list[str], root: type = RunConfig) -> str:
    full = prefix + key
    if not prefix and key in MOVED and root is RunConfig:
        return f"unknown key {full!r}: {MOVED[key]}"
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6)
    if close:
        return f"unknown key {full!r} (did you mean {prefix + close[0]!r}?)"
    elsewhere = [p for p in _all_paths(root) if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f"unknown key {full!r} (did you mean {' or '.join(repr(p) for p in elsewhere[:3])}?)"
    scope = f"section {prefix.rstrip('.')!r}" if prefix else "the top level"
    return f"unknown key {full!r}; {scope} has: {', '.join(siblings)}"


def _all_paths(cls: type, prefix: str = "") -> list[str]:
    """Every key under ``cls``; a choice section's keys are the union of its options' (each once)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        subs = [resolve_class(c) for c in f.metadata["choice"].values()] if "choice" in f.metadata else \
            [s for s in [section_class(hints[f.name])] if s is not None]
        for sub in subs:
            out += [k for k in _all_paths(sub, prefix + f.name + ".") if k not in out]
        if not subs:
            out.append(prefix + f.name)
    return out


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Return ``value`` converted to ``hint`` where lossless, else raise ConfigError."""
    options = _union_args(hint)
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(f"{key}: may not be null (expected {_type_name(hint)})")
    for opt_type in options:
        if opt_type is type(None):
            continue
        ok, converted = _try(value, opt_type)
        if ok:
            return converted
    raise ConfigError(f"{key}: expected {_type_name(hint)}, got {value!r}")


def _union_args(hint: Any) -> tuple:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _try(value: Any, typ: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(typ) or typ
    if origin is bool:
        return isinstance(value, bool), value
    if origin is int:
        return (isinstance(value, int) and not isinstance(value, bool)), value
    if origin is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if origin is str:
        return isinstance(value, str), value
    if origin is dict:
        return isinstance(value, dict), value
    if origin is list:
        if isinstance(value, (list, tuple)):
            return True, list(value)
        return False, value
    return isinstance(value, origin), value


def _type_name(hint: Any) -> str:
    names = []
    for t in _union_args(hint):
        names.append("null" if t is type(None) else getattr(typing.get_origin(t) or t, "__name__", str(t)))
    return " or ".join(names)


def _check_value(key: str, value: Any, meta: Any) -> Any:
    if value is None:
        return value
    choices = meta.get("choices")
    if choices and value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, choices))}{hint}")
    lo, hi = meta.get("min"), meta.get("max")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if lo is not None and value < lo:
            raise ConfigError(f"{key}: must be >= {lo}, got {value!r}")
        if hi is not None and value > hi:
            raise ConfigError(f"{key}: must be <= {hi}, got {value!r}")
    return value


# ----------------------------------------------------------------------------- cross-field checks

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
    validate_trackers(cfg.log)


def validate_trackers(log: Any) -> None:
    """``log.trackers`` names known trackers (:data:`credo.config.schema.TRACKERS`), each once; whether their
    packages are installed is the preflight's check (:func:`credo.tracking.trackers.check_trackers`)."""
    for name in log.trackers:
        if name not in TRACKERS:
            close = difflib.get_close_matches(str(name), TRACKERS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"log.trackers: unknown tracker {name!r}{hint}; trackers: {', '.join(TRACKERS)}")
        if log.trackers.count(name) > 1:
            raise ConfigError(f"log.trackers: {name} is listed twice")


def validate_semantics(cfg: RunConfig) -> None:
    """Checks that involve several keys or the registries (still before any model is built)."""
    validate_common(cfg)
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
    if len(t.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in t.betas):
        raise ConfigError(f"train.betas: expected two numbers in [0, 1), got {t.betas!r}")
    validate_distributed(cfg)
    validate_registries(cfg)


def validate_distributed(cfg: RunConfig) -> None:
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
    if d.strategy == "fsdp2" and d.backend == "none":
        raise ConfigError("distributed.strategy=fsdp2: needs several ranks (distributed.backend=torchrun or ray)")
    if d.backend != "ray" and (d.world_size > 1 or d.inject_faults):
        raise ConfigError("distributed.world_size / inject_faults: only used with distributed.backend=ray "
                          "(torchrun sets the world size with --nproc-per-node)")


def validate_estimator_inputs(cfg: RunConfig) -> None:
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


def validate_critic(cfg: RunConfig) -> None:
    """The critic's head, loss and the estimator fit together (a run would fail at its first update otherwise)."""
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
    from credo.models.value import build_head

    try:
        build_head(c.head, 8, **c.head_args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"critic.head_args: {exc}") from None


def validate_flow_critic(cfg: RunConfig) -> None:
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


def validate_reward_mix(cfg: RunConfig) -> None:
    r = cfg.reward
    for i, comp in enumerate(r.mix):
        key = f"reward.mix[{i}]"
        if not isinstance(comp, dict) or not isinstance(comp.get("name"), str) \
                or set(comp) - {"name", "weight", "kwargs", "executor"}:
            raise ConfigError(f"{key}: expected {{name: VERIFIER, weight: NUMBER, kwargs: {{...}}}}, got {comp!r}")
        if not isinstance(comp.get("weight", 1.0), (int, float)) or not isinstance(comp.get("kwargs", {}), dict):
            raise ConfigError(f"{key}: weight must be a number and kwargs a mapping, got {comp!r}")
        _check_reward(f"{key}.name", comp["name"])
    if r.noise > 0 and cfg.rollout.collector.type == "agent":
        raise ConfigError("reward.noise: single-turn tasks only (agent rewards come from the environments)")


def validate_replay(cfg: RunConfig) -> None:
    p, kind = cfg.replay, cfg.rollout.collector.type
    if p is None or p.pool is None:  # a section without a pool: `credo rlep collect` settings (training: preflight)
        return
    if kind != "group":
        why = "agent episodes are not replayed" if kind == "agent" else "replayed answers have no rollout tree"
        raise ConfigError(f"replay.pool: experience replay is for single-turn groups, rollout.collector.type=group "
                          f"({why})")
    if p.num == 0 and p.negative == 0:
        raise ConfigError("replay.pool: set with replay.num=0 and replay.negative=0 replays nothing")
    if p.pool == "warm_start" and cfg.distributed.backend != "none":
        raise ConfigError("replay.pool=warm_start: not with distributed training (each rank would collect its own "
                          "pool); collect one with `credo rlep collect` and set replay.pool to its path")


def validate_vepo(cfg: RunConfig) -> None:
    """VEPO: a known perturbation with accepted arguments, single-turn prompts, one token selection at a time."""
    from credo.methods.vepo.grounding import check_perturbation_args, get_perturbation

    v = cfg.token_select
    if v.type != "vepo":
        return
    _wrap("token_select.perturb", lambda: get_perturbation(v.perturb))
    _wrap("token_select.perturb_args", lambda: check_perturbation_args(v.perturb, v.perturb_args))
    from credo.methods.vepo.image import check_image_perturbation_args, get_image_perturbation

    _wrap("token_select.image_perturb", lambda: get_image_perturbation(v.image_perturb))
    _wrap("token_select.image_perturb_args", lambda: check_image_perturbation_args(v.image_perturb,
                                                                                  v.image_perturb_args))
    if cfg.rollout.collector.type == "agent":
        raise ConfigError("token_select.type=vepo: not implemented for multi-turn agent episodes (VEPO perturbs the "
                          "grounding span of a single-turn prompt)")


def _vision_policy(cfg: RunConfig) -> bool:
    """Whether the policy is a vision-language model: a freshly built ``model.arch=llava``, a local directory
    whose config.json names a vision-language type, or a task whose examples carry images."""
    from credo.models.vision import VISION_MODEL_TYPES

    m = cfg.model
    if m.path is None:
        return m.arch == "llava" or cfg.task.name == "shapes"
    config = Path(m.path).expanduser() / "config.json"
    try:
        model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    except (OSError, ValueError):
        model_type = None
    return model_type in VISION_MODEL_TYPES or cfg.task.name == "shapes"


def validate_vision(cfg: RunConfig) -> None:
    """Vision-language policies (``model.arch=llava``, image tasks): the paths that cannot carry images refused."""
    m, v = cfg.model, cfg.model.vision
    if m.path is None and m.arch == "llava":
        if v.image_size % v.patch_size:
            raise ConfigError(f"model.vision.image_size: {v.image_size} must be a multiple of model.vision.patch_size="
                              f"{v.patch_size}")
        if v.hidden % v.heads:
            raise ConfigError(f"model.vision.hidden: {v.hidden} must be divisible by model.vision.heads={v.heads}")
    if m.path is None and cfg.task.name == "shapes" and m.arch != "llava":
        raise ConfigError(f"task.name=shapes: its examples are images; set model.arch=llava (got {m.arch!r})")
    if not _vision_policy(cfg):
        return
    if cfg.rollout.engine == "vllm":
        raise ConfigError("rollout.engine=vllm: not implemented for vision-language policies (credo sends vLLM token "
                          "ids, not images); use rollout.engine=hf")
    if cfg.train.pack:
        raise ConfigError("train.pack: not implemented with images (packing does not order the images with their "
                          "token blocks); set train.pack=false")
    if cfg.rollout.collector.type != "group":
        raise ConfigError(f"rollout.collector.type={cfg.rollout.collector.type}: not implemented for vision-language "
                          "policies (single-turn groups only)")


def validate_attnrl(cfg: RunConfig) -> None:
    """AttnRL's tree collector: the pieces that assume plain groups or another process's policy are refused."""
    kind, d = cfg.rollout.collector.type, cfg.distributed
    if kind != "tree":
        return
    if cfg.algo.advantage == "attnrl" and cfg.algo.kl_in_reward:
        raise ConfigError("algo.kl_in_reward: not implemented with algo.advantage=attnrl (the tree values use the "
                          "leaf scores); put the KL in the loss (kl_in_reward=false)")
    for key, bad, why in (
            ("distributed.rollout", d.backend == "torchrun" and d.rollout == "shard",
             "the dynamic batch size is per run, not per rank; use distributed.rollout=replicate"),
            ("rollout.one_step_off", cfg.rollout.one_step_off and (d.backend == "ray" or cfg.rollout.engine != "hf"),
             "the FCI pass needs the sampling policy's in-process copy (rollout.engine=hf without Ray)")):
        if bad:
            raise ConfigError(f"{key}: not implemented with rollout.collector.type=tree ({why})")


def validate_registries(cfg: RunConfig) -> None:
    from credo import algo
    from credo.algo.critic import check_critic_loss_hparams, critic_loss_requirements
    from credo.data import get_task, list_tasks, task_param_names

    a = cfg.algo
    for key, fn in (("algo.policy_loss", lambda: algo.check_policy_loss_hparams(a.policy_loss, {})),
                    ("algo.advantage", lambda: algo.check_advantage_hparams(a.advantage, {})),
                    ("algo.policy_loss_args", lambda: algo.check_policy_loss_hparams(a.policy_loss, a.policy_loss_args)),
                    ("algo.advantage_args", lambda: algo.check_advantage_hparams(a.advantage, a.advantage_args)),
                    ("algo.kl_estimator", lambda: algo.canonical_kl(a.kl_estimator)),
                    ("critic.loss", lambda: check_critic_loss_hparams(cfg.critic.loss, {})),
                    ("critic.loss_args", lambda: check_critic_loss_hparams(cfg.critic.loss, cfg.critic.loss_args)),
                    ("critic.loss_args", lambda: critic_loss_requirements(cfg.critic.loss, cfg.critic.loss_args))):
        _wrap(key, fn)
    validate_estimator_inputs(cfg)
    validate_critic(cfg)
    validate_reward_mix(cfg)
    validate_attnrl(cfg)
    validate_vepo(cfg)
    validate_vision(cfg)
    validate_replay(cfg)
    _wrap("distill", lambda: validate_distill(cfg))  # credo.methods.distill.config
    if cfg.task.name != "file":
        if cfg.task.name not in list_tasks() and not cfg.task.name.startswith("rg:"):  # rg:<dataset>: reasoning-gym
            close = difflib.get_close_matches(cfg.task.name, list_tasks(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"task.name: unknown task {cfg.task.name!r}{hint}; tasks: {', '.join(list_tasks())}, file")
        _wrap("task.name", lambda: task_param_names(cfg.task.name))
        known = task_param_names(cfg.task.name)
        for key in cfg.task.params:
            if key not in known:
                close = difflib.get_close_matches(key, list(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"task.params.{key}: task {cfg.task.name!r} has no parameter {key!r}{hint}; "
                                  f"it takes: {', '.join(known)}")
        _wrap("task.params", lambda: get_task(cfg.task.name, curriculum=cfg.task.curriculum, **cfg.task.params))
    if cfg.reward.name is not None:
        _check_reward("reward.name", cfg.reward.name)
    _check_routes(cfg)
    if cfg.rollout.collector.type == "agent":
        validate_agent(cfg)


def _known_env(key: str, name: Any) -> str:
    from credo.envs import list_envs

    if isinstance(name, str) and name.startswith("agentgym:"):
        from credo.envs.agentgym import get_adapter

        _wrap(key, lambda: get_adapter(name))
        return name
    if not isinstance(name, str) or name not in list_envs():
        close = difflib.get_close_matches(str(name), list_envs(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key}: unknown environment {name!r}{hint}; environments: {', '.join(list_envs())}")
    return name


def _check_remote(cfg: RunConfig) -> None:
    """``rollout.collector.remote`` (``agent.remote``): a known adapter, an http(s) URL, id ranges, contract fields;
    no warm start from demonstrations (an AgentGym server has no oracle credo can call)."""
    from credo.collect.config import remote_adapter, remote_name

    r = cfg.rollout.collector.remote
    if r.env is None:
        for key in ("url", "train_ids", "eval_ids", "instruction"):
            if getattr(r, key) is not None:
                raise ConfigError(f"agent.remote.{key}: set agent.remote.env too (the AgentGym environment it serves)")
        return
    if not isinstance(r.url, str) or not r.url.startswith(("http://", "https://")):
        raise ConfigError(f"agent.remote.url: expected the http(s) URL of the {r.env} server, got {r.url!r}")
    for key in ("train_ids", "eval_ids"):
        value = getattr(r, key)
        if value is not None and not (isinstance(value, list) and len(value) == 2):
            raise ConfigError(f"agent.remote.{key}: expected [lo, hi), got {value!r}")
    a = cfg.rollout.collector
    _wrap("agent.remote", lambda: remote_adapter(a, remote_name(a)))
    if cfg.warm_start.enabled is not False and cfg.warm_start.steps > 0:
        raise ConfigError("warm_start.steps: an AgentGym environment has no oracle to imitate; set "
                          "warm_start.steps=0 (or start from a model trained elsewhere: model.path)")


def validate_agent(cfg: RunConfig) -> None:
    """The agent collector (``rollout.collector``, ``type: agent``): env names, their parameters, stages, horizon schedule and branching arguments."""
    from credo.collect.config import with_remote
    from credo.envs import make_env

    _check_remote(cfg)
    a = with_remote(cfg.rollout.collector)
    if cfg.model.path is None and cfg.model.max_position_embeddings < a.max_response_tokens + 64:
        raise ConfigError(f"model.max_position_embeddings: {cfg.model.max_position_embeddings} positions cannot hold "
                          f"an episode of rollout.collector.max_response_tokens={a.max_response_tokens} plus its prompt; set it "
                          f"to >= {a.max_response_tokens + 64} or lower rollout.collector.max_response_tokens")
    if a.envs and a.stages:
        raise ConfigError("rollout.collector.stages: set either rollout.collector.envs (one mixture) or rollout.collector.stages (a sequence), not both")
    for i, env in enumerate(a.envs):
        _known_env(f"rollout.collector.envs[{i}]", env)
    if a.env_weights is not None:
        if len(a.env_weights) != len(a.envs) or not all(isinstance(w, (int, float)) and w >= 0 for w in a.env_weights) \
                or not sum(a.env_weights) > 0:
            raise ConfigError(f"rollout.collector.env_weights: expected {len(a.envs)} non-negative numbers (one per rollout.collector.envs "
                              f"entry) with a positive sum, got {a.env_weights!r}")
    for i, stage in enumerate(a.stages):
        if not isinstance(stage, dict) or set(stage) != {"envs", "steps"} or not isinstance(stage["envs"], list) \
                or not stage["envs"] or not isinstance(stage["steps"], int) or stage["steps"] < 1:
            raise ConfigError(f"rollout.collector.stages[{i}]: expected {{envs: [name, ...], steps: N>=1}}, got {stage!r}")
        for j, env in enumerate(stage["envs"]):
            _known_env(f"rollout.collector.stages[{i}].envs[{j}]", env)
    used = set(a.envs) | {e for s in a.stages for e in s["envs"]}
    for i, env in enumerate(a.eval_envs):
        _known_env(f"rollout.collector.eval_envs[{i}]", env)
    for section in ("env_params", "server_urls"):
        for env in getattr(a, section):
            _known_env(f"rollout.collector.{section}.{env}", env)
    for env, params in a.env_params.items():
        if env.startswith("agentgym:"):
            raise ConfigError(f"rollout.collector.env_params.{env}: an AgentGym server takes no parameters from credo "
                              f"(its contract: agent.remote.contract)")
        if not isinstance(params, dict):
            raise ConfigError(f"rollout.collector.env_params.{env}: expected a mapping of parameters, got {params!r}")
        _wrap(f"rollout.collector.env_params.{env}", lambda: make_env(env, **params))
    for env, url in a.server_urls.items():
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"rollout.collector.server_urls.{env}: expected an http(s) URL, got {url!r}")
        if env not in used and env not in a.eval_envs:
            raise ConfigError(f"rollout.collector.server_urls.{env}: {env!r} is neither trained nor evaluated")
    for env in sorted(used | set(a.eval_envs)):
        if env.startswith("agentgym:") and env not in a.server_urls:
            raise ConfigError(f"{env}: an AgentGym environment needs its server's URL (agent.remote.url, or "
                              f"rollout.collector.server_urls.{env})")
    _check_horizon_and_branching(a)


def _check_horizon_and_branching(a) -> None:
    """The agent collector's horizon schedule and branching arguments."""
    from credo.rollout.branching import AEPO_DEFAULTS, ARPO_DEFAULTS

    if a.horizon_schedule == "stepwise":
        if not a.horizon_rounds or not all(isinstance(h, int) and h >= 1 for h in a.horizon_rounds):
            raise ConfigError(f"rollout.collector.horizon_rounds: stepwise needs a non-empty list of turn caps >= 1, "
                              f"got {a.horizon_rounds!r}")
    elif a.horizon_rounds:
        raise ConfigError("rollout.collector.horizon_rounds: only used with rollout.collector.horizon_schedule=stepwise")
    if a.branching == "none" and a.branch_args:
        raise ConfigError("rollout.collector.branch_args: only used with rollout.collector.branching=arpo or aepo")
    if a.branching != "none":
        known = ARPO_DEFAULTS if a.branching == "arpo" else AEPO_DEFAULTS
        for key in a.branch_args:
            if key not in known:
                close = difflib.get_close_matches(key, list(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"rollout.collector.branch_args.{key}: {a.branching} has no parameter {key!r}{hint}; "
                                  f"it takes: {', '.join(known)}")


def _check_routes(cfg: RunConfig) -> None:
    """``reward.by_data_source``: data_source -> a verifier name or {name, kwargs}, each verifier resolvable."""
    for source, spec in cfg.reward.by_data_source.items():
        key = f"reward.by_data_source.{source}"
        name = spec.get("name") if isinstance(spec, dict) else spec
        if not isinstance(name, str) or (isinstance(spec, dict) and not set(spec) <= {"name", "kwargs"}) \
                or not isinstance(spec.get("kwargs", {}) if isinstance(spec, dict) else {}, dict):
            raise ConfigError(f"{key}: expected a verifier name or {{name: VERIFIER, kwargs: {{...}}}}, got {spec!r}")
        _check_reward(key, name)
    if cfg.reward.by_data_source and cfg.distributed.backend == "ray":
        raise ConfigError("reward.by_data_source: not implemented with distributed.backend=ray (its reward workers "
                          "run one verifier); use one verifier, or backend none / torchrun")


def _check_reward(key: str, name: str) -> None:
    """The verifier ``name`` resolves. A user module (``package.module:function``) that fails to import is one
    line naming the key, whatever it raised (a syntax error, an exception of its own at import time)."""
    from credo.rewards import get_reward_fn

    try:
        get_reward_fn(name)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(f"{key}: {msg}") from None
    except Exception as exc:  # noqa: BLE001 - a user module may raise anything while it is imported
        raise ConfigError(f"{key}: importing {name!r} failed: {type(exc).__name__}: {exc}") from None


def _wrap(key: str, fn: Any) -> None:
    try:
        fn()
    except (KeyError, TypeError, ValueError, ImportError, AttributeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(f"{key}: {msg}") from None
