"""Structured-tools variants of ``calc`` and ``toolgraph`` (``EnvSpec.tools``; credo.tools, docs/tools.md).

The model calls tools in its native format (``<tool_call>{"name": "calc", "arguments": {"expr": "3+4"}}</tool_call>``
for ``rollout.collector.tools.parser=hermes``); the loop parses the call and sends the environment the action
``call:{"name": ..., "arguments": ...}``; a turn without a call is the final answer (``answer:text``).

``calc_tools``      - the ``calc`` tasks; one tool, ``calc(expr: str)`` (generated from the typed
                      function below), answering the value; the final answer is the number.
``toolgraph_tools`` - the ``toolgraph`` tasks; the task's listed tools as schemas (``a1``, ``a2``, ...: references
                      ``x<i>`` / ``r<j>``, described by their types), answering ``r<j> = value type``; the final
                      answer is a result reference or a number with a unit. The first observation is the goal and
                      the givens (the tools go to the chat template).
"""
from __future__ import annotations

import json

from credo.envs.base import ActionParser, EnvSpec, StepResult, register_env
from credo.envs.builtin import CalcEnv, safe_eval
from credo.envs.toolgraph import PARAMS as TOOLGRAPH_PARAMS
from credo.envs.toolgraph import ToolGraphEnv, toolgraph_group
from credo.envs.toolgraph_lib import type_text
from credo.tools.parsers import ToolCall
from credo.tools.schema import ToolSet, check_arguments

TOOLS_PARSER = ActionParser(("call", "answer"))


def decode_call(arg: str) -> tuple[str, dict] | None:
    """(name, arguments) of a ``call:`` action's JSON, or None when it is not ``{"name": str, "arguments": {}}``."""
    try:
        obj = json.loads(arg)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("arguments"), dict):
        return None
    return obj["name"], obj["arguments"]


def _error(text: str) -> StepResult:
    return StepResult(f"error: {text}", info={"tool_call": True, "tool_error": True})


# ------------------------------------------------------------------------------------------------ calc_tools

def calc(expr: str) -> str:
    """Evaluate an arithmetic expression of integers with + - * and parentheses.

    Args:
        expr: the expression, e.g. 12+3*4
    """
    value = safe_eval(expr)
    if value is None:
        raise ValueError("not an expression of integers, + - * and parentheses")
    return str(value)


CALC_TOOLS = ToolSet.of(calc)


class CalcToolsEnv(CalcEnv):
    def tool_schemas(self) -> list[dict]:
        return CALC_TOOLS.schemas()

    def step(self, action: str) -> StepResult:
        kind, _, arg = action.partition(":")
        if kind == "call":
            call = decode_call(arg)
            if call is None:
                return _error("a call is {\"name\": ..., \"arguments\": {...}}")
            text, ok = CALC_TOOLS.call(*call)
            if ok:
                self.tool_results.append(int(text))
            return StepResult(text, info={"tool_call": True, "tool_error": not ok})
        if kind == "answer":
            return super().step(action)
        return StepResult("invalid action", info={"invalid_action": True})


def calc_tools_oracle(env: CalcToolsEnv, observation: str) -> ToolCall | str:
    """Call the calculator on the expression, then answer its value."""
    return str(env.tool_results[-1]) if env.tool_results else ToolCall("calc", {"expr": env.expr})


register_env(EnvSpec(
    name="calc_tools", factory=CalcToolsEnv, parser=TOOLS_PARSER, params={"digits": 2, "terms": 3}, tools=True,
    instruction="Compute it with the calc tool, then reply with the number.", oracle=calc_tools_oracle))


# ------------------------------------------------------------------------------------------------ toolgraph_tools

class ToolGraphToolsEnv(ToolGraphEnv):
    def reset(self, task_id: int) -> str:
        return super().reset(task_id).split("\ntools:", 1)[0]

    def tool_schemas(self) -> list[dict]:
        out = []
        for name in self.task.listed:
            tool = self.library.by_name[name]
            props = {f"a{i}": {"type": "string", "description": f"{type_text(t)}: a reference x<i> or r<j>"}
                     for i, t in enumerate(tool.inputs, 1)}
            params = {"type": "object", "properties": props, "required": list(props)}
            out.append({"type": "function", "function": {"name": name, "description": tool.signature(),
                                                         "parameters": params}})
        return out

    def step(self, action: str) -> StepResult:
        kind, _, arg = action.partition(":")
        if kind != "call":
            return super().step(action)
        call = decode_call(arg)
        if call is None:
            return _error("a call is {\"name\": ..., \"arguments\": {...}}")
        name, args = call
        schema = next((s["function"]["parameters"] for s in self.tool_schemas() if s["function"]["name"] == name), None)
        why = "" if schema is None else check_arguments(schema, args)  # an unknown name: toolgraph's own message
        if why:
            return _error(f"{name}: {why}")
        refs = [str(args[f"a{i}"]) for i in range(1, len(args) + 1)] if schema is not None else []
        return super().step(f"tool:{name}({', '.join(refs)})")


def toolgraph_tools_oracle(env: ToolGraphToolsEnv, observation: str) -> ToolCall | str:
    """The next call of the task's chain by name, then the last result's reference (or value, ``oracle_answer``)."""
    done = sum(r.startswith("r") for r in env.values)
    chain = env.task.chain
    if done < len(chain):
        return ToolCall(chain[done].tool, {f"a{i}": a for i, a in enumerate(chain[done].args, 1)})
    if env.oracle_answer == "value":
        return f"{env.target:.4g} {type_text(env.task.goal)}"
    return f"r{done}"


register_env(EnvSpec(
    name="toolgraph_tools", factory=ToolGraphToolsEnv, parser=TOOLS_PARSER, params=TOOLGRAPH_PARAMS, tools=True,
    instruction="Reach the goal with the tools, then reply with the result (r1, r2, ...).",
    oracle=toolgraph_tools_oracle, task_group=toolgraph_group))
