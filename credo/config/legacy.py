"""Configs of older layouts upgraded to the current one: :func:`upgrade`, the one entry point, keyed by the
config's ``format_version``. Applied to config files (presets, a run directory's ``config.yaml`` written by an
older credo) and to ``key=value`` overrides, so old commands and ``--resume`` of old run directories keep working.

Versions (``format_version``, an int that :func:`credo.config.dump_config` writes into ``RUN_DIR/config.yaml``;
a config without it, every preset and override included, is version 0):

0  the keys of the layout before the choice sections (issue 18), mapped to their new places with one deprecation
   notice per moved section (table below). A version-0 config already in the new layout passes unchanged.
1  the layout of issue 34's first commits (``format_version: 1``).
2  the current layout (:data:`FORMAT_VERSION`): two keys renamed so that no key means two things (table below).

A config of a newer version than this code knows is refused in one line naming both versions. A later change of
the layout adds a step to :data:`STEPS` (its keys named literally) and raises :data:`FORMAT_VERSION`.

Version 0 -> 1:

=====================================  =====================================================================
old                                    new
=====================================  =====================================================================
``attnrl: {enabled: true, ...}``       ``rollout.collector: {type: tree, ...}``
``agent: {envs: [...], ...}``          ``rollout.collector: {type: agent, envs: [...], ...}``
``algo.filter_groups`` (and            ``rollout.collector.filter_groups`` (type group)
``dynamic_sampling``,
``max_gen_batches``)
``algo.top_entropy_quantile: q < 1``   ``token_select: {type: entropy, quantile: q}``
``vepo: {enabled: true, ...}``         ``token_select: {type: vepo, ...}``
``replay: {pool: null, ...}``          ``replay: null``
``rollout.vllm_dtype``,                ``rollout.vllm.dtype``, ``rollout.vllm.gpu_memory_utilization``
``rollout.vllm_gpu_memory_utilization``
``rm``, ``birm`` (in ``credo train``)  ``credo rm train``'s own config; a section with the old defaults (an old
                                       run's full dump) is dropped, anything else is an error
=====================================  =====================================================================

A switched-off old section (``attnrl.enabled: false``, ``agent.envs: []``, ``vepo.enabled: false``) is dropped.

Version 1 -> 2 (also applied to ``key=value`` overrides of the old names, :func:`alias_key`):

=====================================  =====================================================================
``critic.warmup_steps``                ``critic.pretrain_steps`` (RL steps that train the critic alone; not an
                                       lr warm-up like ``train.warmup_steps``)
``token_select.quantile`` (entropy)    ``token_select.top_fraction`` (the share of tokens kept, VEPO's name)
=====================================  =====================================================================
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from credo.config.fields import resolve_class

log = logging.getLogger("credo.config")

GROUP_KEYS = ("filter_groups", "dynamic_sampling", "max_gen_batches")
RM_SECTIONS = {"rm": "credo.methods.reward_models.config:RewardModelConfig",
               "birm": "credo.methods.birm.config:BiRMConfig"}
_told: set[str] = set()


class LegacyError(ValueError):
    """An old-layout config that has no single new meaning (the loader reports it as a ConfigError)."""


def notice(old: str, new: str) -> None:
    """One deprecation line per old section per process."""
    if old not in _told:
        _told.add(old)
        log.warning("config: %s is deprecated, now %s (credo.config.legacy)", old, new)


def upgrade(data: dict[str, Any], *, rm_sections: str = "refuse") -> dict[str, Any]:
    """``data`` (a config mapping of any version, not modified) in the current layout, without its
    ``format_version``: the steps of :data:`STEPS` from its version on (module docstring). ``rm_sections``:
    ``refuse`` (``credo train``: old ``rm`` / ``birm`` sections are dropped when they hold only the old defaults,
    refused otherwise) or ``keep`` (``credo rm train``, whose config has them). :class:`LegacyError` for a newer or
    malformed version."""
    data = copy.deepcopy(data)
    version = data.pop(VERSION_KEY, 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise LegacyError(f"{VERSION_KEY}: {version!r} is not a config version (an int, {FORMAT_VERSION} for "
                          "this credo)")
    if version > FORMAT_VERSION:
        raise LegacyError(f"{VERSION_KEY}: the config has version {version}, newer than this credo's "
                          f"{FORMAT_VERSION}: load it with the credo that wrote it (or a newer one)")
    for v in range(version, FORMAT_VERSION):
        data = STEPS[v](data, rm_sections=rm_sections)
    return data


def _v0_to_v1(data: dict[str, Any], *, rm_sections: str) -> dict[str, Any]:
    """Version 0 (the keys before the choice sections; module docstring) -> 1."""
    _collector_sections(data)
    _algo_keys(data)
    _selector_sections(data)
    _rollout_keys(data)
    replay = data.get("replay")
    if isinstance(replay, dict) and "pool" in replay and replay["pool"] is None:
        data["replay"] = None  # the old way to switch replay off
    if rm_sections == "refuse":
        for name, path in RM_SECTIONS.items():
            if name in data:
                _drop_default_section(data, name, path)
    return data


# version 1 -> 2: (section path, old key, new key)
RENAMED_KEYS = ((("critic",), "warmup_steps", "pretrain_steps"), (("token_select",), "quantile", "top_fraction"))


def _v1_to_v2(data: dict[str, Any], *, rm_sections: str) -> dict[str, Any]:
    """Version 1 -> 2: the keys of :data:`RENAMED_KEYS` under their new names."""
    for path, old, new in RENAMED_KEYS:
        node: Any = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and old in node:
            notice(".".join((*path, old)), ".".join((*path, new)))
            node.setdefault(new, node.pop(old))
    return data


FORMAT_VERSION = 2  # the layout this code writes (RUN_DIR/config.yaml's format_version)
VERSION_KEY = "format_version"
# STEPS[v] upgrades a version-v config (a mapping, changed in place or replaced) to version v + 1
STEPS: dict[int, Callable[..., dict[str, Any]]] = {0: _v0_to_v1, 1: _v1_to_v2}


REMOTE_ALIAS = ("agent.remote", "rollout.collector.remote")  # a public interface, not a deprecated key


def alias_key(key: str) -> str:
    """``agent.remote.*`` (the documented way to name an AgentGym server) as ``rollout.collector.remote.*``; a
    renamed key (:data:`RENAMED_KEYS`) under its new name, with a deprecation notice."""
    old, new = REMOTE_ALIAS
    if key == old or key.startswith(old + "."):
        return new + key[len(old):]
    for path, was, now in RENAMED_KEYS:
        if key == ".".join((*path, was)):
            notice(key, ".".join((*path, now)))
            return ".".join((*path, now))
    return key


def agent_collector(data: dict[str, Any], key: str) -> None:
    """Make ``data``'s collector the agent collector for ``key`` (an ``agent.remote`` key): its type is set when
    the config chose none; another type is an error."""
    collector = _section(data, ("rollout", "collector"))
    kind = collector.setdefault("type", "agent")
    if kind != "agent":
        raise LegacyError(f"{key}: an AgentGym server is an environment of the agent collector, but the config "
                          f"selects rollout.collector.type={kind} (use --config agent_agentgym)")


def _collector_sections(data: dict[str, Any]) -> None:
    attnrl, agent = data.pop("attnrl", None), data.pop("agent", None)
    if isinstance(agent, dict) and "remote" in agent:
        agent = dict(agent)
        agent_collector(data, "agent.remote")
        _section(data, ("rollout", "collector")).setdefault("remote", {}).update(agent.pop("remote") or {})
    if isinstance(attnrl, dict):
        attnrl = dict(attnrl)
        if attnrl.pop("enabled", False):
            notice("attnrl.*", "rollout.collector (type: tree)")
            _set_choice(data, ("rollout", "collector"), {"type": "tree", **attnrl}, "attnrl.enabled")
    if isinstance(agent, dict) and (agent.get("envs") or agent.get("stages")):
        notice("agent.*", "rollout.collector (type: agent)")
        _set_choice(data, ("rollout", "collector"), {"type": "agent", **agent}, "agent.envs")


def _algo_keys(data: dict[str, Any]) -> None:
    algo = data.get("algo")
    if not isinstance(algo, dict):
        return
    group = {k: algo.pop(k) for k in GROUP_KEYS if k in algo}
    if group:
        notice("algo.filter_groups / dynamic_sampling / max_gen_batches", "rollout.collector.* (type: group)")
        collector = _section(data, ("rollout", "collector"))
        kind = collector.get("type", "group")
        if kind == "group":
            collector.update(group)
        elif group.get("filter_groups") or group.get("dynamic_sampling"):
            raise LegacyError(f"algo.filter_groups: group filtering is for the group collector, not "
                              f"rollout.collector.type={kind}")
    if "top_entropy_quantile" in algo:
        q = algo.pop("top_entropy_quantile")
        notice("algo.top_entropy_quantile", "token_select (type: entropy, quantile)")
        if not (isinstance(q, (int, float)) and q >= 1.0):
            _set_choice(data, ("token_select",), {"type": "entropy", "quantile": q}, "algo.top_entropy_quantile")


VLLM_KEYS = {"vllm_dtype": "dtype", "vllm_gpu_memory_utilization": "gpu_memory_utilization"}


def _rollout_keys(data: dict[str, Any]) -> None:
    rollout = data.get("rollout")
    if not isinstance(rollout, dict) or not any(k in rollout for k in VLLM_KEYS):
        return
    notice("rollout.vllm_*", "rollout.vllm.*")
    vllm = _section(data, ("rollout", "vllm"))
    for old, new in VLLM_KEYS.items():
        if old in rollout:
            vllm[new] = rollout.pop(old)


def _selector_sections(data: dict[str, Any]) -> None:
    vepo = data.pop("vepo", None)
    if isinstance(vepo, dict):
        vepo = dict(vepo)
        if vepo.pop("enabled", False):
            notice("vepo.*", "token_select (type: vepo)")
            _set_choice(data, ("token_select",), {"type": "vepo", **vepo}, "vepo.enabled")


def _section(data: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = data
    for part in path:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    return node


def _set_choice(data: dict[str, Any], path: tuple[str, ...], value: dict[str, Any], old_key: str) -> None:
    """Put an old section's content at a choice section, refusing two different choices."""
    parent = _section(data, path[:-1])
    current = parent.get(path[-1])
    if isinstance(current, dict) and current.get("type", value["type"]) != value["type"]:
        raise LegacyError(f"{old_key}: selects {'.'.join(path)}.type={value['type']} but the config also selects "
                          f"{current['type']!r}; choose one")
    parent[path[-1]] = (current if isinstance(current, dict) else {}) | value


def _drop_default_section(data: dict[str, Any], name: str, path: str) -> None:
    section = data.get(name)
    defaults = dataclasses.asdict(resolve_class(path)())
    if section is None or (isinstance(section, dict) and all(defaults.get(k, object()) == v
                                                             for k, v in section.items())):
        data.pop(name)  # an older credo's full dump of its defaults
        return
    raise LegacyError(f"{name}: reward-model settings belong to `credo rm train` (its own config), not to "
                      f"`credo train`")


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` deep-merged into ``base``; a section whose ``type`` changes is replaced, not merged."""
    for key, value in extra.items():
        old = base.get(key)
        if isinstance(old, dict) and isinstance(value, dict) and old.get("type", value.get("type")) == \
                value.get("type", old.get("type")):
            merge(old, value)
        else:
            base[key] = value
    return base


def is_legacy_key(key: str) -> bool:
    """Whether an override key is an old-layout key that :func:`upgrade` maps."""
    head, _, rest = key.partition(".")
    return head in ("attnrl", "agent", "vepo") or (head == "algo" and rest in (*GROUP_KEYS, "top_entropy_quantile")) \
        or (head == "rollout" and rest in VLLM_KEYS)


def upgrade_overrides(legacy: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """Old-layout ``key=value`` overrides (``legacy``, a nested mapping) in the new layout, read against ``data``
    (the config they override): ``attnrl.num_splits=3`` on a tree collector sets its key, ``attnrl.enabled=false``
    (``agent.envs=[]``, ``vepo.enabled=false``, ``algo.top_entropy_quantile=1``) switches the choice back to its
    default."""
    collector = (data.get("rollout") or {}).get("collector") or {}
    selector = data.get("token_select") or {}
    legacy = copy.deepcopy(legacy)
    off: dict[str, Any] = {}
    for name, kind, flag in (("attnrl", "tree", "enabled"), ("vepo", "vepo", "enabled")):
        section = legacy.get(name)
        current = (collector if name == "attnrl" else selector).get("type")
        if isinstance(section, dict):
            section.setdefault(flag, current == kind)
            if section[flag] is False and current == kind:
                off |= {"rollout": {"collector": {"type": "group"}}} if name == "attnrl" else \
                    {"token_select": {"type": "none"}}
            elif section[flag] is False and set(section) != {flag}:
                raise LegacyError(f"{name}.*: these keys are now {'rollout.collector' if name == 'attnrl' else 'token_select'}"
                                  f".* and need its type {kind}")
    agent = legacy.get("agent")
    if isinstance(agent, dict) and not (agent.get("envs") or agent.get("stages")):
        if "envs" in agent or "stages" in agent:
            off |= {"rollout": {"collector": {"type": "group"}}}
            legacy.pop("agent")
        elif collector.get("type") == "agent":
            legacy["agent"] = {"envs": collector.get("envs") or [], "stages": collector.get("stages") or []} | agent
        else:
            raise LegacyError(f"agent.{next(iter(agent))}: agent keys are now rollout.collector.* with "
                              f"rollout.collector.type=agent")
    q = (legacy.get("algo") or {}).get("top_entropy_quantile")
    if isinstance(q, (int, float)) and q >= 1.0 and selector.get("type") == "entropy":
        off |= {"token_select": {"type": "none"}}
    new = upgrade(legacy)
    for path, current, default in ((("rollout", "collector"), collector, "group"), (("token_select",), selector, "none")):
        node = new
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        kind = node.get("type") if isinstance(node, dict) else None
        if kind and current.get("type", default) not in (default, kind):
            raise LegacyError(f"{'.'.join(path)}: an old key selects type {kind} but the config selects "
                              f"{current['type']!r}; choose one (set {'.'.join(path)}.type)")
    if "algo" in legacy and any(k in legacy["algo"] for k in GROUP_KEYS) and collector.get("type", "group") != "group":
        raise LegacyError(f"algo.filter_groups: group filtering is for the group collector, not "
                          f"rollout.collector.type={collector.get('type')}")
    return merge(new, off) if off else new
