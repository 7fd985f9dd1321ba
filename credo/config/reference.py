"""Markdown reference of every config key, generated from the dataclasses (``python -m credo.config.reference``).

The README embeds this output between its ``config-reference`` markers
(``python -m credo.config.reference --readme README.md``); a test keeps them in sync.
"""
from __future__ import annotations

import dataclasses
import typing

from credo.config.fields import resolve_class
from credo.config.loader import section_class as _section_class
from credo.config.schema import RunConfig


def reference_markdown(root: type = RunConfig) -> str:
    lines = ["| key | default | meaning |", "|---|---|---|"]
    lines += _rows(root, "")
    return "\n".join(lines) + "\n"


def _rows(cls: type, prefix: str, note: str = "") -> list[str]:
    """One row per key; a choice section gets a ``type`` row and each option's keys (marked with its type); an
    optional section (``X | None``) a row of its own (default null) and its keys."""
    hints = typing.get_type_hints(cls)
    out, nested = [], []
    for f in dataclasses.fields(cls):
        key, section = prefix + f.name, _section_class(hints[f.name])
        if "choice" in f.metadata:
            nested.append((f, key))
            continue
        if "section" in f.metadata:  # an optional section named by "module:Class" (credo.config.fields.section)
            section = resolve_class(f.metadata["section"])
        if section is not None and f.default is None:
            nested.append((f"| `{key}` | `null` | {f.metadata.get('help', '')} |", None))
            nested.append((section, key + "."))
            continue
        if section is not None:
            nested.append((section, key + "."))
            continue
        if f.name == "type" and note:
            continue  # the choice's own type row lists the options
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        meta = f.metadata
        help_text = meta.get("help", "")
        if meta.get("choices"):
            help_text += f" ({' / '.join(map(str, meta['choices']))})"
        out.append(f"| `{key}` | `{_fmt(default)}` | {note}{help_text} |")
    for sub, sub_prefix in nested:
        if isinstance(sub, str):
            out.append(sub)
        else:
            out += _choice_rows(sub, sub_prefix) if isinstance(sub, dataclasses.Field) else _rows(sub, sub_prefix)
    return out


def _choice_rows(f: dataclasses.Field, key: str) -> list[str]:
    options = f.metadata["choice"]
    out = [f"| `{key}.type` | `{f.metadata['default_type']}` | {f.metadata.get('help', '')} "
           f"({' / '.join(options)}) |"]
    for name, path in options.items():
        cls = resolve_class(path)
        type_help = next(g.metadata.get("help", "") for g in dataclasses.fields(cls) if g.name == "type")
        out.append(f"| `{key}.type: {name}` | | {type_help} |")
        out += _rows(cls, key + ".", note=f"[{name}] ")
    return out


def _fmt(value: typing.Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
RM_START, RM_END = "<!-- config-reference-rm:start -->", "<!-- config-reference-rm:end -->"
RM_ROOT = "credo.methods.reward_models.config:RmRunConfig"  # credo rm train's root config (a method's: by name)


def rm_reference_markdown() -> str:
    """``credo rm train``'s own sections (its other sections are those of ``credo train``)."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    rows = _rows(resolve_class(RM_ROOT), "")
    lines += [r for r in rows if r.startswith(("| `rm.", "| `birm.", "| `idrm."))]
    return "\n".join(lines) + "\n"


def embed(readme_text: str) -> str:
    """``readme_text`` with the references placed between their markers."""
    for start, end, table in ((START, END, reference_markdown), (RM_START, RM_END, rm_reference_markdown)):
        if start not in readme_text:
            continue
        head, rest = readme_text.split(start, 1)
        _, tail = rest.split(end, 1)
        readme_text = f"{head}{start}\n{table()}{end}{tail}"
    return readme_text


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if len(sys.argv) > 2 and sys.argv[1] == "--readme":
        path = Path(sys.argv[2])
        path.write_text(embed(path.read_text()))
    else:
        print(reference_markdown(), end="")
