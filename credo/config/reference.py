"""Markdown reference of every config key, generated from the dataclasses (``python -m credo.config.reference``).

The README embeds this output between its ``config-reference`` markers
(``python -m credo.config.reference --readme README.md``); a test keeps them in sync.
"""
from __future__ import annotations

import dataclasses
import typing

from credo.config.schema import RunConfig


def reference_markdown() -> str:
    lines = ["| key | default | meaning |", "|---|---|---|"]
    lines += _rows(RunConfig, "")
    return "\n".join(lines) + "\n"


def _rows(cls: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    out, nested = [], []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            nested.append((hints[f.name], prefix + f.name + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        meta = f.metadata
        help_text = meta.get("help", "")
        if meta.get("choices"):
            help_text += f" ({' / '.join(map(str, meta['choices']))})"
        out.append(f"| `{prefix}{f.name}` | `{_fmt(default)}` | {help_text} |")
    for sub, sub_prefix in nested:
        out += _rows(sub, sub_prefix)
    return out


def _fmt(value: typing.Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def embed(readme_text: str) -> str:
    """``readme_text`` with the reference placed between the markers."""
    head, rest = readme_text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{reference_markdown()}{END}{tail}"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if len(sys.argv) > 2 and sys.argv[1] == "--readme":
        path = Path(sys.argv[2])
        path.write_text(embed(path.read_text()))
    else:
        print(reference_markdown(), end="")
