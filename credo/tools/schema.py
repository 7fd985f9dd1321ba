"""Tools as OpenAI function schemas: declared as JSON, or generated from typed Python functions.

A tool's schema is the OpenAI function format the chat templates' ``tools=`` argument takes::

    {"type": "function", "function": {"name": "calculator", "description": "...",
     "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "..."}},
                    "required": ["expression"]}}}

:func:`function_schema` writes it from a function's signature and docstring (annotations ``int``, ``float``,
``str``, ``bool``, ``list`` / ``list[X]``, ``Literal[...]``, ``Optional[X]`` / ``X | None``; the docstring's first
paragraph is the description, its ``Args:`` lines ``name: text`` or ``name (type): text`` describe the
parameters). :class:`ToolSet` checks a call's arguments against the schema (:func:`check_arguments`) and runs it.
"""
from __future__ import annotations

import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Tool:
    """One callable tool: its name, description, JSON-schema parameters and (for local tools) the function."""

    name: str
    description: str
    parameters: dict  # a JSON schema of type object
    fn: Callable[..., Any] | None = None

    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def tool_from_schema(schema: dict, fn: Callable[..., Any] | None = None) -> Tool:
    """A :class:`Tool` of an OpenAI function schema (``{"type": "function", "function": {...}}`` or the inner
    ``{"name", "description", "parameters"}``); ValueError in one line for a malformed one."""
    inner = schema.get("function", schema) if isinstance(schema, dict) else None
    if not isinstance(inner, dict) or not isinstance(inner.get("name"), str) or not _NAME.fullmatch(inner["name"]):
        raise ValueError(f"tool schema needs a function name (letters, digits, _ . -): {str(schema)[:120]}")
    params = inner.get("parameters") or {"type": "object", "properties": {}}
    if params.get("type") != "object" or not isinstance(params.get("properties", {}), dict):
        raise ValueError(f"tool {inner['name']!r}: parameters must be a JSON schema of type object")
    return Tool(inner["name"], str(inner.get("description", "")), params, fn)


def _type_schema(tp: Any) -> tuple[dict, bool]:
    """(JSON schema of annotation ``tp``, whether it admits None)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"only Optional[X] unions are supported, got {tp}")
        return _type_schema(rest[0])[0], True
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in _JSON_TYPES:
            raise TypeError(f"Literal values must share one JSON type, got {tp}")
        return {"type": _JSON_TYPES[next(iter(kinds))], "enum": list(args)}, False
    if origin is list:
        return {"type": "array", **({"items": _type_schema(args[0])[0]} if args else {})}, False
    if origin is dict:
        return {"type": "object"}, False
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}, False
    raise TypeError(f"no JSON schema for annotation {tp!r} (int, float, str, bool, list, Literal, Optional)")


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """(description, {parameter: text}) of a Google-style docstring."""
    doc = inspect.getdoc(fn) or ""
    head, _, rest = doc.partition("\nArgs:")
    described: dict[str, str] = {}
    for line in rest.splitlines():
        m = re.match(r"\s+([A-Za-z_][A-Za-z0-9_]*)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
        if m:
            described[m.group(1)] = m.group(2).strip()
        elif line.strip() and not line.startswith(" "):
            break  # the next section (Returns:, ...)
    return " ".join(head.split("\n\n")[0].split()), described


def function_schema(fn: Callable[..., Any]) -> dict:
    """The OpenAI function schema of a typed Python function (module docstring); TypeError for an unannotated or
    unsupported parameter, ``*args`` or ``**kwargs``."""
    description, described = _docstring(fn)
    hints = typing.get_type_hints(fn)
    props, required = {}, []
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{fn.__name__}: *args / **kwargs have no schema")
        if name not in hints:
            raise TypeError(f"{fn.__name__}: parameter {name!r} has no type annotation")
        schema, nullable = _type_schema(hints[name])
        if nullable:
            schema = {**schema, "type": [schema["type"], "null"]}
        if name in described:
            schema["description"] = described[name]
        props[name] = schema
        if p.default is p.empty:
            required.append(name)
    params = {"type": "object", "properties": props, "required": required}
    return {"type": "function", "function": {"name": fn.__name__, "description": description, "parameters": params}}


def tool_from_function(fn: Callable[..., Any]) -> Tool:
    return tool_from_schema(function_schema(fn), fn)


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "array": list, "object": dict,
                              "null": type(None)}.get(kind, object))


def check_arguments(parameters: dict, arguments: Any) -> str:
    """'' when ``arguments`` fit the object schema ``parameters`` (required keys, no unknown ones, JSON types and
    enums of the top-level properties), else the first reason they do not."""
    if not isinstance(arguments, dict):
        return "arguments must be a JSON object"
    props = parameters.get("properties", {})
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        return f"missing argument(s) {', '.join(missing)}"
    for key, value in arguments.items():
        if key not in props:
            return f"unknown argument {key!r} (takes: {', '.join(props) or 'none'})"
        spec = props[key]
        kinds = spec.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds] if kinds else []
        if kinds and not any(_type_ok(value, k) for k in kinds):
            return f"argument {key!r} must be {' or '.join(kinds)}, got {json.dumps(value)[:40]}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument {key!r} must be one of {spec['enum']}"
    return ""


class ToolSet:
    """Tools by name: their schemas for the chat template and :meth:`call`, which checks and runs a call."""

    def __init__(self, tools: list[Tool]) -> None:
        self.tools = {t.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise ValueError("tool names must be distinct")

    @classmethod
    def of(cls, *fns: Callable[..., Any]) -> "ToolSet":
        return cls([tool_from_function(f) for f in fns])

    def schemas(self) -> list[dict]:
        return [t.schema() for t in self.tools.values()]

    def call(self, name: str, arguments: Any) -> tuple[str, bool]:
        """(result text, ok): the tool's answer (a string as is, anything else as JSON), or an error text when the
        tool is unknown, the arguments do not fit its schema or it raised."""
        tool = self.tools.get(name)
        if tool is None:
            return f"error: unknown tool {name!r} (tools: {', '.join(self.tools)})", False
        why = check_arguments(tool.parameters, arguments)
        if why:
            return f"error: {name}: {why}", False
        if tool.fn is None:
            raise NotImplementedError(f"tool {name!r} has a schema but no local function; call it through its server")
        try:
            out = tool.fn(**arguments)
        except Exception as exc:  # a failing tool is the model's problem to handle, not a crash of the run
            return f"error: {name} failed: {type(exc).__name__}: {str(exc)[:120]}", False
        return (out if isinstance(out, str) else json.dumps(out)), True
