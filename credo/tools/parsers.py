"""Parsers of the models' native tool-call formats, by name (``rollout.collector.tools.parser``).

``hermes`` (Qwen2.5, Hermes, many chat templates)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3+4"}}
    </tool_call>

``qwen3_coder`` (Qwen3-Coder's XML)::

    <tool_call>
    <function=calculator>
    <parameter=expression>
    3+4
    </parameter>
    </function>
    </tool_call>

A parser splits an assistant turn into its text content, the well-formed calls and one error per malformed call
(bad JSON, no name, arguments not an object, a ``<tool_call>`` never closed); ``attempted`` counts both. It never
raises on model text. :meth:`format` writes calls in the same format (the oracle's demonstrations).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from credo.registry import Registry

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ParsedTurn:
    content: str  # the turn's text outside the calls, stripped
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line per malformed call

    @property
    def attempted(self) -> int:
        return len(self.calls) + len(self.errors)


class ToolParser(Protocol):
    name: str

    def parse(self, text: str, tools: dict[str, dict] | None = None) -> ParsedTurn: ...

    def format(self, calls: list[ToolCall]) -> str: ...


def _blocks(text: str) -> tuple[list[str], str, bool]:
    """(bodies of the closed ``<tool_call>`` blocks, the text outside them, whether one was left unclosed)."""
    bodies = [m.group(1) for m in _BLOCK.finditer(text)]
    rest = _BLOCK.sub("", text)
    unclosed = _OPEN in rest
    if unclosed:
        rest = rest[:rest.index(_OPEN)]
    return bodies, rest.strip(), unclosed


class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (``arguments`` may also be a JSON string of an
    object, as some models write it)."""

    name = "hermes"

    def parse(self, text: str, tools: dict[str, dict] | None = None) -> ParsedTurn:
        bodies, content, unclosed = _blocks(text)
        out = ParsedTurn(content)
        for body in bodies:
            call, error = self._one(body)
            if call is not None:
                out.calls.append(call)
            else:
                out.errors.append(error)
        if unclosed:
            out.errors.append("a <tool_call> was not closed with </tool_call>")
        return out

    @staticmethod
    def _one(body: str) -> tuple[ToolCall | None, str]:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            return None, f"the tool call is not valid JSON ({str(exc)[:60]})"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None, 'the tool call needs {"name": ..., "arguments": {...}}'
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None, f"{obj['name']}: arguments is a string that is not a JSON object"
        if not isinstance(args, dict):
            return None, f"{obj['name']}: arguments must be a JSON object"
        return ToolCall(obj["name"], args), ""

    def format(self, calls: list[ToolCall]) -> str:
        return "\n".join(f'<tool_call>\n{json.dumps({"name": c.name, "arguments": c.arguments})}\n</tool_call>'
                         for c in calls)  # one call per block, blocks a newline apart (as the templates write them)


_FUNCTION = re.compile(r"\s*<function=([^>\s]+)>(.*?)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)


def _convert(raw: str, spec: dict | None) -> Any:
    """A Qwen3-Coder parameter value (one newline stripped each side) converted by its schema type, as the reference
    parser does: string as is; integer / number / boolean / array / object parsed, kept as the string when that
    fails (the argument check then refuses it); no schema: the string."""
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    kind = (spec or {}).get("type")
    kind = next((k for k in kind if k != "null"), None) if isinstance(kind, list) else kind
    if kind in (None, "string"):
        return value
    try:
        if kind == "integer":
            return int(value.strip())
        if kind == "number":
            num = float(value.strip())
            return int(num) if num.is_integer() and "." not in value and "e" not in value.lower() else num
        if kind == "boolean":
            return {"true": True, "false": False}[value.strip().lower()]
        return json.loads(value)
    except (ValueError, KeyError):
        return value


class Qwen3CoderParser:
    """``<tool_call><function=NAME><parameter=P>V</parameter>...</function></tool_call>``; values converted by the
    tool's parameter schema when ``tools`` (name -> parameters schema) is given."""

    name = "qwen3_coder"

    def parse(self, text: str, tools: dict[str, dict] | None = None) -> ParsedTurn:
        bodies, content, unclosed = _blocks(text)
        out = ParsedTurn(content)
        for body in bodies:
            m = _FUNCTION.fullmatch(body)
            if not m:
                out.errors.append("a tool call is <function=NAME><parameter=P>value</parameter></function>")
                continue
            name, inner = m.group(1), m.group(2)
            leftover = _PARAMETER.sub("", inner).strip()
            if leftover:
                out.errors.append(f"{name}: text outside <parameter=...> blocks: {leftover[:40]!r}")
                continue
            props = ((tools or {}).get(name) or {}).get("properties", {})
            args = {p: _convert(v, props.get(p)) for p, v in _PARAMETER.findall(inner)}
            out.calls.append(ToolCall(name, args))
        if unclosed:
            out.errors.append("a <tool_call> was not closed with </tool_call>")
        return out

    def format(self, calls: list[ToolCall]) -> str:
        def value(v: Any) -> str:
            return v if isinstance(v, str) else json.dumps(v)

        return "\n".join("<tool_call>\n<function=" + c.name + ">\n"
                       + "".join(f"<parameter={k}>\n{value(v)}\n</parameter>\n" for k, v in c.arguments.items())
                       + "</function>\n</tool_call>" for c in calls)


PARSERS: Registry[ToolParser] = Registry("tool-call parser")
PARSERS.add("hermes", HermesParser())
PARSERS.add("qwen3_coder", Qwen3CoderParser())


def get_parser(name: str) -> ToolParser:
    """The parser registered as ``name`` (KeyError ``unknown tool-call parser ... (did you mean ...)``)."""
    return PARSERS.get(name)
