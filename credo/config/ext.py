"""Plugin sections: ``ext.<name>`` of a run config, checked against the dataclass a plugin registered for it.

A method written outside credo (docs/extending.md) keeps its settings under ``ext.<name>`` (``ext.my_method.coef=
0.1`` on the command line, or an ``ext:`` mapping in YAML). It registers its dataclass once; the config check then
builds the section from it, with the same unknown-key suggestions, coercions and bounds as credo's own sections,
and its builders read the section back with :func:`ext_section`::

    EXT_SECTIONS.add("my_method", MyMethodConfig)
    ext_section(cfg, "my_method")      # -> MyMethodConfig, or None when the run does not set ext.my_method
"""
from __future__ import annotations

from typing import Any

from credo.config.validate import register_validator
from credo.errors import ConfigError
from credo.registry import Registry

EXT_SECTIONS: Registry[type] = Registry("plugin section (ext.NAME)")


def ext_section(cfg: Any, name: str) -> Any:
    """``ext.<name>`` of ``cfg`` built as its registered dataclass; None when the run does not set it."""
    from credo.config.loader import build

    data = (cfg.ext or {}).get(name)
    if data is None:
        return None
    cls = EXT_SECTIONS.get(name)
    return build(cls, data, f"ext.{name}.", root=cls)


@register_validator("ext")
def check_ext(cfg: Any) -> None:
    """Every ``ext.<name>`` names a registered section and builds (ConfigError naming the key otherwise)."""
    for name in cfg.ext or {}:
        if name not in EXT_SECTIONS:
            raise ConfigError(f"ext.{name}: {EXT_SECTIONS.unknown(name)} (a plugin registers its section when "
                              "it is imported: --plugin MODULE or plugins: [MODULE])")
        ext_section(cfg, name)
