"""``toolgraph``: a SciAgentGym-style scientific tool-use environment over a seeded library of typed tools.

The library (:mod:`credo.envs.toolgraph_lib`: 265 tools at seed 0: unit conversions, dimensional laws, lookups)
and its dependency graph give tasks in tiers by chain length (SciAgentBench's tiers by horizon). Task ``id``
has tier ``min_chain + (id mod EVAL_OFFSET) mod (max_chain - min_chain + 1)``, so held-out ids
``EVAL_OFFSET + i`` cycle through the tiers evenly, from the first. One episode::

    goal: find force[kN]
    given: x1 = 350 mass[g]; x2 = 9.8 accel[m/s2]
    tools:
    t1: force_N_to_kN(force[N]) -> force[kN]
    t2: force_from_accel_times_mass(accel[m/s2], mass[kg]) -> force[N]
    t3: mass_g_to_kg(mass[g]) -> mass[kg]
    ...                                         (the chain's tools and ``distractors`` others, sorted by name)
    <tool>mass_g_to_kg(x1)</tool>                ->  r1 = 0.35 mass[kg]
    <tool>force_from_accel_times_mass(x2, r1)</tool>  ->  r2 = 3.43 force[N]
    <tool>force_N_to_kN(r2)</tool>               ->  r3 = 0.00343 force[kN]
    <answer>r3</answer>                          ->  correct (reward 1, done)

Calls are parsed strictly (nothing is evaluated): a tool name of the library or a listing handle (``t2``: the
second listed tool; what ``oracle_calls=handle`` demonstrates, for models too small to copy long names) and
positional arguments that are references to given values (``x<i>``) or earlier results (``r<j>``) of exactly
the input's type. A bad call
(unknown tool or reference, wrong arity, wrong type, a value the tool cannot compute) is an ``error: ...``
observation and the episode goes on. ``<answer>`` ends the episode: a result reference of the goal's exact type,
or a number with an optional unit of the goal's quantity (``3.43 N``, ``0.00343 force[kN]``; no unit = the
goal's unit), converted to the goal's unit and accepted within ``rtol`` (relative).
"""
from __future__ import annotations

import difflib
import functools
import math
import re
from typing import Any

from credo.envs.base import EVAL_OFFSET, ActionParser, EnvSpec, StepResult, register_env
from credo.envs.toolgraph_lib import (MATERIAL, QUANTITY, Library, Task, TypeKey, build_library, from_si, make_task,
                                      to_si, type_text)

MAX_ACTION_CHARS = 200  # a longer call or answer is refused unread
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(([^()]*)\)")
_REF = re.compile(r"[xr][1-9][0-9]*")
_NUMBER = re.compile(r"([-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*(.*)")


def tier_of(task_id: int, min_chain: int, max_chain: int) -> int:
    """``min_chain + (id mod EVAL_OFFSET) mod n_tiers``: held-out ids ``EVAL_OFFSET + i`` start at the first tier."""
    return min_chain + task_id % EVAL_OFFSET % (max_chain - min_chain + 1)


@functools.lru_cache(maxsize=4096)
def cached_task(seed: int, variant_rate: float, task_id: int, tier: int, distractors: int) -> Task:
    return make_task(build_library(seed, variant_rate), task_id, tier, distractors)


def _fmt(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.4g}"


def parse_unit(text: str, quantity: str) -> TypeKey | None:
    """The type of unit ``text`` (``kN``, ``force[kN]``, or the unit's id ``km_h``) within ``quantity``, or None."""
    text = text.strip()
    m = re.fullmatch(r"([a-z_]+)\[(.+)\]", text)
    if m:
        if m.group(1) != quantity:
            return None
        text = m.group(2)
    for u in QUANTITY[quantity].units:
        if text in (u.sym, u.id):
            return quantity, u.id
    return None


def check_answer(text: str, goal: TypeKey, target: float, results: dict[str, tuple[TypeKey, float | str]],
                 rtol: float) -> tuple[bool, str]:
    """(correct, why) for final answer ``text`` against ``target`` (in the goal's unit): a result reference of
    type ``goal``, or a number with an optional unit of the goal's quantity, converted to the goal's unit;
    correct when ``|v - target| <= rtol * |target|``."""
    text = text.strip()
    if _REF.fullmatch(text):
        if text not in results:
            return False, f"unknown reference {text}"
        t, value = results[text]
        if t != goal:
            return False, f"{text} is {type_text(t)}, the goal is {type_text(goal)}"
    else:
        m = _NUMBER.fullmatch(text)
        if not m:
            return False, "the answer is not a number or a result reference"
        t = parse_unit(m.group(2), goal[0]) if m.group(2) else goal
        if t is None:
            return False, f"{m.group(2)!r} is not a unit of {goal[0]}"
        value = float(m.group(1))
    if not isinstance(value, float) or not math.isfinite(value):
        return False, "the answer is not a finite number"
    converted = from_si(to_si(value, t), goal)
    return abs(converted - target) <= rtol * abs(target), f"{_fmt(converted)} {type_text(goal)}"


class ToolGraphEnv:
    """One episode at a time over the shared seeded library (parameters: :data:`PARAMS`, the module docstring)."""

    def __init__(self, seed: int = 0, min_chain: int = 1, max_chain: int = 4, distractors: int = 3,
                 rtol: float = 0.01, variant_rate: float = 0.5, max_calls: int = 16, oracle_answer: str = "ref",
                 oracle_calls: str = "name"):
        _check(min_chain, max_chain, distractors, rtol, variant_rate, max_calls, oracle_answer, oracle_calls)
        self.seed, self.min_chain, self.max_chain, self.distractors = seed, min_chain, max_chain, distractors
        self.rtol, self.variant_rate, self.max_calls = rtol, variant_rate, max_calls
        self.oracle_answer, self.oracle_calls = oracle_answer, oracle_calls
        self.library: Library = build_library(seed, variant_rate)
        self.task: Task | None = None
        self.values: dict[str, tuple[TypeKey, float | str]] = {}  # ref -> (type, value)
        self.calls = 0
        self.target = 0.0

    def reset(self, task_id: int) -> str:
        tier = tier_of(task_id, self.min_chain, self.max_chain)
        self.task = cached_task(self.seed, self.variant_rate, task_id, tier, self.distractors)
        self.values = {g.ref: (g.type, g.value) for g in self.task.givens}
        self.calls = 0
        self.target = self._oracle_value()
        given = "; ".join(f"{g.ref} = {_fmt(g.value)} {type_text(g.type)}" for g in self.task.givens)
        tools = "\n".join(f"t{i}: {self.library.by_name[n].signature()}" for i, n in enumerate(self.task.listed, 1))
        return f"goal: find {type_text(self.task.goal)}\ngiven: {given}\ntools:\n{tools}"

    def _oracle_value(self) -> float:
        values = {ref: v for ref, (_, v) in self.values.items()}
        for j, call in enumerate(self.task.chain, 1):
            values[f"r{j}"] = self.library.by_name[call.tool].apply(tuple(values[a] for a in call.args))
        return values[f"r{len(self.task.chain)}"]

    def step(self, action: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("toolgraph: step before reset")
        kind, _, arg = action.partition(":")
        arg = arg.strip()
        if len(arg) > MAX_ACTION_CHARS:
            return StepResult(f"error: action longer than {MAX_ACTION_CHARS} characters", info={"invalid_action": True})
        if kind == "answer":
            ok, why = check_answer(arg, self.task.goal, self.target, self.values, self.rtol)
            return StepResult(("correct: " if ok else "wrong: ") + why, reward=float(ok), done=True,
                              info={"success": ok, "tier": self.task.tier})
        if kind != "tool":
            return StepResult("invalid action", info={"invalid_action": True})
        if self.calls >= self.max_calls:
            return StepResult(f"error: call budget of {self.max_calls} spent", done=True,
                              info={"success": False, "tier": self.task.tier})
        self.calls += 1
        out, error = self._call(arg)
        if error:
            return StepResult(f"error: {error}", info={"tool_call": True, "tool_error": True})
        ref = f"r{sum(r.startswith('r') for r in self.values) + 1}"
        self.values[ref] = out
        return StepResult(f"{ref} = {_fmt(out[1])} {type_text(out[0])}", info={"tool_call": True})

    def _call(self, text: str) -> tuple[tuple[TypeKey, float] | None, str]:
        """(output type and value, '') of call ``text``, or (None, the reason it was refused)."""
        m = _CALL.fullmatch(text)
        if not m:
            return None, "a call is name(ref, ...) with refs x1.. (given) or r1.. (results)"
        name, raw = m.group(1), m.group(2).strip()
        handle = re.fullmatch(r"t([1-9][0-9]*)", name)  # t<i>: the i-th listed tool
        if handle and int(handle.group(1)) <= len(self.task.listed):
            name = self.task.listed[int(handle.group(1)) - 1]
        tool = self.library.by_name.get(name)
        if tool is None:
            close = difflib.get_close_matches(name, self.task.listed, n=1)
            return None, f"unknown tool {name}" + (f" (did you mean {close[0]}?)" if close else "")
        args = [a.strip() for a in raw.split(",")] if raw else []
        if len(args) != len(tool.inputs):
            return None, f"{name} takes {len(tool.inputs)} argument(s), got {len(args)}"
        for a, want in zip(args, tool.inputs):
            if not _REF.fullmatch(a):
                return None, f"argument {a[:20]!r} is not a reference (x1.., r1..)"
            if a not in self.values:
                return None, f"unknown reference {a}"
            if self.values[a][0] != want:
                return None, f"{a} is {type_text(self.values[a][0])}, {name} needs {type_text(want)}"
        try:
            value = tool.apply(tuple(self.values[a][1] for a in args))
        except (ArithmeticError, ValueError) as exc:
            return None, f"{name} cannot compute this: {type(exc).__name__}"
        if not isinstance(value, float) or not math.isfinite(value):
            return None, f"{name} gave a non-finite value"
        return (tool.output, value), ""

    def close(self) -> None:
        pass


def _check(min_chain: int, max_chain: int, distractors: int, rtol: float, variant_rate: float, max_calls: int,
           oracle_answer: str, oracle_calls: str) -> None:
    """One-line ValueErrors for out-of-range parameters (types are checked by ``check_env_params``)."""
    for key, value, lo, hi in (("min_chain", min_chain, 1, 5), ("max_chain", max_chain, min_chain, 5),
                               ("distractors", distractors, 0, 32), ("rtol", rtol, 1e-9, 0.5),
                               ("variant_rate", variant_rate, 0.0, 1.0), ("max_calls", max_calls, 1, 256)):
        if not lo <= value <= hi:
            raise ValueError(f"environment 'toolgraph': parameter {key}={value!r} must be in [{lo}, {hi}]")
    if oracle_answer not in ("ref", "value"):
        raise ValueError(f"environment 'toolgraph': parameter oracle_answer={oracle_answer!r} must be ref or value")
    if oracle_calls not in ("name", "handle"):
        raise ValueError(f"environment 'toolgraph': parameter oracle_calls={oracle_calls!r} must be name or handle")


def toolgraph_oracle(env: ToolGraphEnv, observation: str) -> str:
    """SciForge-style demonstration: the next call of the task's chain (drawn by walking the dependency graph), by
    name or, with ``oracle_calls=handle``, by its listing handle ``t<i>``; then the answer (the last result's
    reference, or its value and unit with ``oracle_answer=value``)."""
    done = sum(r.startswith("r") for r in env.values)
    chain = env.task.chain
    if done < len(chain):
        name = chain[done].tool
        if env.oracle_calls == "handle":
            name = f"t{env.task.listed.index(name) + 1}"
        return f"<tool>{name}({', '.join(chain[done].args)})</tool>"
    if env.oracle_answer == "value":
        return f"<answer>{_fmt(env.target)} {type_text(env.task.goal)}</answer>"
    return f"<answer>r{done}</answer>"


PARAMS: dict[str, Any] = {"seed": 0, "min_chain": 1, "max_chain": 4, "distractors": 3, "rtol": 0.01,
                          "variant_rate": 0.5, "max_calls": 16, "oracle_answer": "ref", "oracle_calls": "name"}


def toolgraph_group(params: dict[str, Any], task_id: int) -> str:
    """The label held-out success is reported by: the task's tier (``tier2``)."""
    return f"tier{tier_of(task_id, params['min_chain'], params['max_chain'])}"


register_env(EnvSpec(
    name="toolgraph", factory=ToolGraphEnv, parser=ActionParser(("tool", "answer")), params=PARAMS,
    instruction="Reach the goal with the tools. Use <tool>name(x1, r1)</tool>, then <answer>r1</answer>.",
    oracle=toolgraph_oracle, task_group=toolgraph_group))

__all__ = ["MATERIAL", "PARAMS", "ToolGraphEnv", "check_answer", "parse_unit", "tier_of", "toolgraph_group",
           "toolgraph_oracle"]
