"""Load a :class:`RunConfig` from YAML presets plus ``key=value`` overrides: parse, merge, migrate old keys
(:mod:`credo.config.legacy`), build the dataclasses with their types coerced and bounds checked, and report.

Every problem is reported as a one-line :class:`ConfigError` naming the key, with a suggestion for typos, before
any model is built. The checks that involve several keys, or names that live in registries (tasks, rewards,
losses, estimators, their hyperparameters), are :mod:`credo.config.validate`'s: its core checks and the
validators registered beside the configs they check (a method's in its own package).
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from credo.config import legacy
from credo.config.fields import resolve_class
from credo.config.hub_ref import parse_hub_id
from credo.config.schema import RunConfig
from credo.config.validate import ConfigError, validate_common, validate_run
from credo.config.yaml_safe import YamlConfigError, load_yaml, read_mapping

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# input paths a preset may give relative to its own folder (load_config); overrides stay relative to the cwd
PRESET_PATH_KEYS = ("model.path", "critic.path", "task.train_file", "task.eval_file", "rm.train_file", "rm.eval_file",
                    "replay.pool")
HUB_ID_KEYS = ("model.path", "critic.path")  # of those, the keys that may name a hub id instead


# ----------------------------------------------------------------------------- public API

def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                root: type = RunConfig, untrusted_dir: str | Path | None = None) -> Any:
    """:func:`load_config_sources` without the sources."""
    return load_config_sources(path, overrides, root=root, untrusted_dir=untrusted_dir)[0]


def load_run_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                    untrusted_dir: str | Path | None = None, resumed: bool = False) -> RunConfig:
    """:func:`load_config` for ``credo train``: a key the run will not read is refused (or, harmless, warned
    about) by :func:`credo.config.reads.check_reads` (no silent no-ops, docs/guarantees.md); ``resumed``: ``path``
    is the run directory's own config, whose keys were accepted when the run started (only overrides refused)."""
    from credo.config.reads import check_reads

    cfg, sources = load_config_sources(path, overrides, untrusted_dir=untrusted_dir)
    check_reads(cfg, sources, resumed=resumed)
    return cfg


def load_config_sources(path: str | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                        root: type = RunConfig, untrusted_dir: str | Path | None = None
                        ) -> tuple[Any, dict[str, str]]:
    """Defaults <- YAML preset (``path`` or a preset name in ``configs/``) <- ``key=value`` overrides, as a
    ``root`` (:class:`RunConfig` for ``credo train``; ``credo rm train`` has its own root).

    Relative input paths in the preset (:data:`PRESET_PATH_KEYS`) are relative to the preset's folder
    (:func:`resolve_preset_paths`); paths in overrides are used as given (relative to the working directory).
    Keys of the older layout are mapped to their new places with a deprecation notice (:mod:`credo.config.legacy`).
    ``untrusted_dir`` (a resumed run's directory): no plugin module may be imported from inside it.
    Returns the config and each key's source (``default``, ``preset`` or ``override``; :mod:`credo.config.reads`)."""
    from credo.config.reads import flat_paths, key_sources

    rm_sections = "refuse" if root is RunConfig else "keep"
    data: dict[str, Any] = {}
    given: set[str] = set()
    try:
        if path:
            preset = resolve_preset(path)
            data = legacy.upgrade(resolve_preset_paths(read_yaml(preset), preset), rm_sections=rm_sections)
        from_preset, preset_data = flat_paths(data), copy.deepcopy(data) if path else None
        old: dict[str, Any] = {}
        for item in overrides:
            key, value = parse_override(item)
            if legacy.alias_key(key) != key:
                if key.startswith(legacy.REMOTE_ALIAS[0]):
                    legacy.agent_collector(data, key)
                key = legacy.alias_key(key)
            if key.endswith("+"):  # key+=value: append to a list (--plugin M is plugins+=M)
                key, value = key[:-1].strip(), _appended(data, key[:-1].strip(), value)
            set_dotted(old if legacy.is_legacy_key(key) else data, key, value)
            given.add(key)
        if old:
            upgraded = legacy.upgrade_overrides(old, data)
            given |= flat_paths(upgraded)
            legacy.merge(data, upgraded)
    except legacy.LegacyError as exc:
        raise ConfigError(str(exc)) from None
    if root is RunConfig:
        import_plugins(data.get("plugins"), untrusted_dir=untrusted_dir)
    cfg = config_from_dict(data, root=root)
    return cfg, key_sources(cfg, from_preset, given, preset_cfg=_preset_alone(preset_data, root) if path else None)


def _preset_alone(data: dict[str, Any] | None, root: type) -> Any:
    """The preset built without the overrides (what it reads on its own), or None when it does not build alone."""
    try:
        return None if data is None else config_from_dict(data, root=root)
    except Exception:  # noqa: BLE001 - advisory only: a preset that needs its overrides to build reads unknown keys
        return None


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
    """``data`` built as a ``root`` and checked (:func:`credo.config.validate.validate_run` for a RunConfig, the
    sections every command's config has otherwise)."""
    cfg = build(root, data, prefix="", root=root)
    if root is RunConfig:
        validate_run(cfg)
    else:
        validate_common(cfg)
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_config(cfg: RunConfig, path: Path) -> None:
    """Write ``cfg`` as YAML to ``path`` atomically, through a temporary file of an unpredictable name (a link
    planted in a run directory is replaced, never written through), with the layout's ``format_version`` first
    (:func:`credo.config.legacy.upgrade` reads it back)."""
    from credo.tracking.atomic import atomic_write_text

    data = {legacy.VERSION_KEY: legacy.FORMAT_VERSION, **config_to_dict(cfg)}
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=None))


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
    ``replay.pool=warm_start``, a path that exists only relative to the working directory (older presets, a
    run's ``config.yaml`` written from cwd-relative overrides) and a model path that is a hub id
    (``org/name[@revision]``, :mod:`credo.config.hub_ref`) with no such folder beside the preset are left as they
    are."""
    base = preset.resolve().parent
    for key in PRESET_PATH_KEYS:
        section, name = key.split(".")
        node = data.get(section)
        value = node.get(name) if isinstance(node, dict) else None
        if not isinstance(value, str) or not value or value.startswith("~") or Path(value).is_absolute() \
                or (key == "replay.pool" and value == "warm_start"):
            continue
        here = Path(os.path.normpath(base / value))
        if not here.exists() and key in HUB_ID_KEYS and parse_hub_id(value) is not None:
            continue  # a hub id (org/name[@revision]), resolved through the hub cache (credo.models.hub)
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
        elif "section" in f.metadata:  # an optional section named by "module:Class" (credo.config.fields.section)
            kwargs[name] = None if value is None else build(resolve_class(f.metadata["section"]), value, full + ".",
                                                            root)
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
            [resolve_class(f.metadata["section"])] if "section" in f.metadata else \
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
