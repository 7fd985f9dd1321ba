"""Config field helpers, importable by any config module (method packages included) without importing the
schema: ``opt`` (a key with its default, help text and bounds), ``choice`` (a section whose ``type`` picks its
dataclass), ``section`` (an optional section, null = off) and ``resolve_class``.

A choice names its options, and an optional section its dataclass, as ``"package.module:Class"`` strings, so the
schema sits below the method packages that define them (nothing here imports a method); :func:`register_choice`
adds a user's own option.
"""
from __future__ import annotations

import importlib
from dataclasses import field
from typing import Any


def opt(default: Any, help: str = "", *, choices: tuple | None = None, min: float | None = None,
        max: float | None = None, factory: Any = None, read_if: str | tuple[str, ...] | None = None):
    """A config key: its default (or ``factory``), help text, allowed values and bounds; ``read_if`` names the
    reader(s) that read it when only some runs do (:mod:`credo.config.reads`)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max}
    if read_if is not None:
        meta["read_if"] = read_if
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def type_key(name: str, help: str = ""):
    """The ``type`` key of a choice's dataclass: fixed to ``name`` (the loader picks the class by it)."""
    return opt(name, help or f"this section's choice ({name})", choices=(name,))


def choice(default: str, options: dict[str, str], help: str = ""):
    """A section whose ``type`` key picks its dataclass among ``options`` (type name -> ``"module:Class"``); the
    default is ``default``'s dataclass with its defaults. ``options`` is kept (and extended by
    :func:`register_choice`) in the field's metadata."""
    return field(default_factory=lambda: resolve_class(options[default])(),
                 metadata={"help": help, "choice": options, "default_type": default})


def section(path: str, help: str = ""):
    """An optional section, null (off) by default, whose keys are those of the dataclass at ``path``
    (``"module:Class"``, imported when the section is set). The field is annotated ``Any``: the loader, the
    reference and the unknown-key suggestions read the class from the metadata."""
    return field(default=None, metadata={"help": help, "section": path})


def register_choice(options: dict[str, str], name: str, target: str | type) -> None:
    """Add option ``name`` to a choice's ``options`` (a schema field's ``metadata["choice"]``); ``target`` is a
    dataclass or its ``"module:Class"`` path."""
    options[name] = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"


def resolve_class(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
