"""The synthetic scientific tool library of the ``toolgraph`` environment (SciAgentGym-style), its dependency
graph and its tiered tasks.

A *type* is a quantity and a unit (``mass[g]``; the lookups' input ``material`` has no unit). Every tool has
typed inputs and one typed output, and computes deterministically in SI:

* ``convert``: ``mass_g_to_kg(mass[g]) -> mass[kg]``, every unit of a quantity to and from its SI unit
  (``v_si = v * scale + offset``; the offset is for degC / degF);
* ``law``: ``force_from_mass_accel(mass[kg], accel[m/s2]) -> force[N]``, ``out = a^p * b^q`` in SI, enumerated
  from the quantities' dimension vectors (every product / quotient of two quantities, or reciprocal of one,
  whose dimension is another quantity's), plus a seeded share of *variants* taking and giving other units;
* ``lookup``: ``density_of(material) -> density[g/cm3]``, a seeded table per library seed.

The dependency graph has an edge ``t -> u`` when ``t``'s output type is one of ``u``'s input types
(:meth:`Library.consumers`). A task of tier ``k`` is drawn by walking that graph forward for ``k`` steps (each
step consumes the previous output; its other inputs are fresh given values) and is kept only when the
planning-graph layer of its goal type is exactly ``k`` (:func:`goal_layer`): no chain of fewer tool calls
yields a value of the goal type from the given types, so the tier is the task's minimum number of calls.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass

TypeKey = tuple[str, str]  # (quantity, unit id); ("material", "") for the lookups' input
MATERIAL: TypeKey = ("material", "")
BASE = ("M", "L", "T", "K", "A", "N")  # dimension exponents: mass, length, time, temperature, current, amount


@dataclass(frozen=True)
class Unit:
    id: str  # identifier-safe, used in tool names
    sym: str  # shown in types: mass[kg]
    scale: float  # value in SI = value * scale + offset
    offset: float = 0.0


@dataclass(frozen=True)
class Quantity:
    name: str
    dim: tuple[int, ...]  # exponents over BASE
    units: tuple[Unit, ...]  # the first is the SI unit


def _q(name: str, dim: str, *units: tuple) -> Quantity:
    return Quantity(name, tuple(int(x) for x in dim.split()), tuple(Unit(*u) for u in units))


QUANTITIES: tuple[Quantity, ...] = (
    _q("mass", "1 0 0 0 0 0", ("kg", "kg", 1), ("g", "g", 1e-3), ("mg", "mg", 1e-6), ("t", "t", 1e3),
       ("lb", "lb", 0.45359237)),
    _q("length", "0 1 0 0 0 0", ("m", "m", 1), ("cm", "cm", 1e-2), ("mm", "mm", 1e-3), ("km", "km", 1e3),
       ("in", "in", 0.0254), ("ft", "ft", 0.3048)),
    _q("time", "0 0 1 0 0 0", ("s", "s", 1), ("ms", "ms", 1e-3), ("min", "min", 60), ("h", "h", 3600)),
    _q("area", "0 2 0 0 0 0", ("m2", "m2", 1), ("cm2", "cm2", 1e-4), ("km2", "km2", 1e6)),
    _q("volume", "0 3 0 0 0 0", ("m3", "m3", 1), ("L", "L", 1e-3), ("mL", "mL", 1e-6)),
    _q("speed", "0 1 -1 0 0 0", ("m_s", "m/s", 1), ("km_h", "km/h", 1 / 3.6), ("cm_s", "cm/s", 1e-2)),
    _q("accel", "0 1 -2 0 0 0", ("m_s2", "m/s2", 1), ("cm_s2", "cm/s2", 1e-2), ("gee", "g0", 9.80665)),
    _q("force", "1 1 -2 0 0 0", ("N", "N", 1), ("kN", "kN", 1e3), ("dyn", "dyn", 1e-5)),
    _q("energy", "1 2 -2 0 0 0", ("J", "J", 1), ("kJ", "kJ", 1e3), ("cal", "cal", 4.184), ("kWh", "kWh", 3.6e6)),
    _q("power", "1 2 -3 0 0 0", ("W", "W", 1), ("kW", "kW", 1e3), ("hp", "hp", 745.7)),
    _q("pressure", "1 -1 -2 0 0 0", ("Pa", "Pa", 1), ("kPa", "kPa", 1e3), ("bar", "bar", 1e5),
       ("atm", "atm", 101325)),
    _q("density", "1 -3 0 0 0 0", ("kg_m3", "kg/m3", 1), ("g_cm3", "g/cm3", 1e3), ("g_L", "g/L", 1)),
    _q("momentum", "1 1 -1 0 0 0", ("kg_m_s", "kg*m/s", 1), ("g_cm_s", "g*cm/s", 1e-5)),
    _q("frequency", "0 0 -1 0 0 0", ("Hz", "Hz", 1), ("kHz", "kHz", 1e3), ("rpm", "rpm", 1 / 60)),
    _q("temperature", "0 0 0 1 0 0", ("K", "K", 1), ("degC", "degC", 1, 273.15),
       ("degF", "degF", 5 / 9, 273.15 - 32 * 5 / 9)),
    _q("charge", "0 0 1 0 1 0", ("C", "C", 1), ("mC", "mC", 1e-3), ("Ah", "Ah", 3600)),
    _q("current", "0 0 0 0 1 0", ("A", "A", 1), ("mA", "mA", 1e-3)),
    _q("voltage", "1 2 -3 0 -1 0", ("V", "V", 1), ("mV", "mV", 1e-3), ("kV", "kV", 1e3)),
    _q("resistance", "1 2 -3 0 -2 0", ("ohm", "ohm", 1), ("kohm", "kohm", 1e3)),
    _q("amount", "0 0 0 0 0 1", ("mol", "mol", 1), ("mmol", "mmol", 1e-3)),
    _q("molar_mass", "1 0 0 0 0 -1", ("kg_mol", "kg/mol", 1), ("g_mol", "g/mol", 1e-3)),
    _q("concentration", "0 -3 0 0 0 1", ("mol_m3", "mol/m3", 1), ("mol_L", "mol/L", 1e3)),
    _q("flow", "0 3 -1 0 0 0", ("m3_s", "m3/s", 1), ("L_min", "L/min", 1e-3 / 60)),
    _q("mass_flow", "1 0 -1 0 0 0", ("kg_s", "kg/s", 1), ("g_s", "g/s", 1e-3)),
)
QUANTITY = {q.name: q for q in QUANTITIES}
MATERIALS = ("iron", "copper", "aluminium", "water", "glycerol", "granite", "oak", "lead", "silver", "quartz",
             "ethanol", "nickel")
# lookup property -> (output type, [lo, hi) of its seeded values, in that unit)
LOOKUPS: dict[str, tuple[TypeKey, tuple[float, float]]] = {
    "density_of": (("density", "g_cm3"), (0.5, 12.0)), "sound_speed_of": (("speed", "m_s"), (1000.0, 6000.0)),
    "melting_point_of": (("temperature", "degC"), (-120.0, 1500.0)), "molar_mass_of": (("molar_mass", "g_mol"),
                                                                                     (18.0, 210.0))}


def unit(t: TypeKey) -> Unit:
    return next(u for u in QUANTITY[t[0]].units if u.id == t[1])


def type_text(t: TypeKey) -> str:
    """``mass[kg]``; ``material`` for the lookups' input."""
    return t[0] if t == MATERIAL else f"{t[0]}[{unit(t).sym}]"


def to_si(value: float, t: TypeKey) -> float:
    u = unit(t)
    return value * u.scale + u.offset


def from_si(value: float, t: TypeKey) -> float:
    u = unit(t)
    return (value - u.offset) / u.scale


@dataclass(frozen=True)
class Tool:
    name: str
    kind: str  # convert | law | lookup
    inputs: tuple[TypeKey, ...]
    output: TypeKey
    powers: tuple[int, ...] = ()  # law / convert: out_si = prod(in_si ** p)
    table: tuple[tuple[str, float], ...] = ()  # lookup: material -> value in the output unit

    def signature(self) -> str:
        return f"{self.name}({', '.join(type_text(t) for t in self.inputs)}) -> {type_text(self.output)}"

    def apply(self, args: tuple) -> float:
        """The output value (in the output unit) of ``args`` (floats in the input units; a material name for a
        lookup). Raises ArithmeticError (ZeroDivisionError, OverflowError) on a value it cannot compute."""
        if self.kind == "lookup":
            return dict(self.table)[args[0]]
        out = 1.0
        for value, t, p in zip(args, self.inputs, self.powers):
            out *= to_si(value, t) ** p
        return from_si(out, self.output)


@dataclass(frozen=True)
class Library:
    seed: int
    tools: tuple[Tool, ...]

    @functools.cached_property
    def by_name(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}

    @functools.cached_property
    def consumers(self) -> dict[TypeKey, tuple[Tool, ...]]:
        """The dependency graph: type -> the tools taking it as an input (the edges ``t -> u`` of every tool
        ``t`` whose output is that type)."""
        out: dict[TypeKey, list[Tool]] = {}
        for tool in self.tools:
            for t in set(tool.inputs):
                out.setdefault(t, []).append(tool)
        return {t: tuple(v) for t, v in out.items()}


def _laws() -> list[tuple[str, tuple[str, ...], tuple[int, ...]]]:
    """(output quantity, input quantities, powers) of every product ``a * b``, quotient ``a / b`` and reciprocal
    ``1 / a`` of quantities whose dimension is another quantity's (temperature takes part in none)."""
    by_dim = {q.dim: q.name for q in QUANTITIES}
    out = []
    for a in QUANTITIES:
        inv = tuple(-x for x in a.dim)
        if inv in by_dim and by_dim[inv] != a.name:
            out.append((by_dim[inv], (a.name,), (-1,)))
        for b in QUANTITIES:
            prod = tuple(x + y for x, y in zip(a.dim, b.dim))
            quot = tuple(x - y for x, y in zip(a.dim, b.dim))
            if a.name <= b.name and prod in by_dim and by_dim[prod] not in (a.name, b.name):
                out.append((by_dim[prod], (a.name, b.name), (1, 1)))
            if a.name != b.name and quot in by_dim and by_dim[quot] not in (a.name, b.name):
                out.append((by_dim[quot], (a.name, b.name), (1, -1)))
    return out


def _law_name(out: TypeKey, ins: tuple[TypeKey, ...], powers: tuple[int, ...], variant: bool) -> str:
    """``force_from_accel_times_mass``, ``frequency_from_inverse_time``; a variant names its units too
    (``speed_km_h_from_length_km_per_time_h``)."""
    def word(t: TypeKey) -> str:
        return f"{t[0]}_{t[1]}" if variant else t[0]

    if len(ins) == 1:
        return f"{word(out)}_from_inverse_{word(ins[0])}"
    op = "per" if powers == (1, -1) else "times"
    return f"{word(out)}_from_{word(ins[0])}_{op}_{word(ins[1])}"


@functools.lru_cache(maxsize=8)
def build_library(seed: int = 0, variant_rate: float = 0.5) -> Library:
    """The seeded library: conversions, SI laws, a ``variant_rate`` share of laws in seeded other units, and
    lookups with seeded tables. Deterministic per ``(seed, variant_rate)``."""
    rng = random.Random(f"credo/toolgraph/library/{seed}")
    tools: list[Tool] = []
    for q in QUANTITIES:
        si = (q.name, q.units[0].id)
        for u in q.units[1:]:
            t = (q.name, u.id)
            tools.append(Tool(f"{q.name}_{u.id}_to_{si[1]}", "convert", (t,), si, (1,)))
            tools.append(Tool(f"{q.name}_{si[1]}_to_{u.id}", "convert", (si,), t, (1,)))
    for out_q, in_qs, powers in _laws():
        ins = tuple((n, QUANTITY[n].units[0].id) for n in in_qs)
        out = (out_q, QUANTITY[out_q].units[0].id)
        tools.append(Tool(_law_name(out, ins, powers, False), "law", ins, out, powers))
        if rng.random() < variant_rate:
            vins = tuple((n, rng.choice(QUANTITY[n].units).id) for n in in_qs)
            vout = (out_q, rng.choice(QUANTITY[out_q].units).id)
            if (vins, vout) != (ins, out):
                tools.append(Tool(_law_name(vout, vins, powers, True), "law", vins, vout, powers))
    for name, (out, (lo, hi)) in LOOKUPS.items():
        table = tuple((m, round(rng.uniform(lo, hi), 2)) for m in MATERIALS)
        tools.append(Tool(name, "lookup", (MATERIAL,), out, table=table))
    names = [t.name for t in tools]
    assert len(set(names)) == len(names), "tool names must be unique"
    return Library(seed, tuple(tools))


# ----------------------------------------------------------------------------------------------- tasks

@dataclass(frozen=True)
class Given:
    ref: str  # x1, x2, ...
    type: TypeKey
    value: float | str  # a material name for MATERIAL


@dataclass(frozen=True)
class Call:
    tool: str
    args: tuple[str, ...]  # refs: x<i> (given) or r<j> (the j-th call's result)


@dataclass(frozen=True)
class Task:
    tier: int
    goal: TypeKey
    givens: tuple[Given, ...]
    chain: tuple[Call, ...]  # the oracle's calls; len(chain) == tier
    listed: tuple[str, ...]  # the tool names the observation lists (the chain's and distractors), sorted


def goal_layer(lib: Library, given: set[TypeKey], goal: TypeKey, limit: int) -> int:
    """The planning-graph layer of ``goal``: the least ``L`` such that ``L`` rounds of "call every tool whose
    inputs are all available" produce it from ``given`` (0 if given; ``limit + 1`` if not within ``limit``).
    A value made at layer ``L`` depends on a chain of ``L`` calls, so no plan has fewer calls than ``L``."""
    have = set(given)
    for layer in range(limit + 1):
        if goal in have:
            return layer
        have |= {t.output for t in lib.tools if all(i in have for i in t.inputs)}
    return limit + 1


def _given_value(rng: random.Random, t: TypeKey) -> float | str:
    if t == MATERIAL:
        return rng.choice(MATERIALS)
    return float(f"{rng.uniform(1, 10) * 10.0 ** rng.choice((-1, 0, 0, 1, 2)):.2g}")  # two significant digits


def _walk(lib: Library, rng: random.Random, tier: int) -> tuple[list[Given], list[Call], TypeKey] | None:
    """A forward walk of ``tier`` steps on the dependency graph; each step after the first consumes the previous
    output in one input, every other input is a fresh given value. None as soon as a step's output can be made
    from the givens so far in fewer calls than the steps taken (the walk would not give a task of its tier)."""
    givens: list[Given] = []
    calls: list[Call] = []
    prev: TypeKey | None = None
    for step in range(1, tier + 1):
        tool = rng.choice(lib.tools if prev is None else lib.consumers.get(prev, lib.tools))
        slot = tool.inputs.index(prev) if prev in tool.inputs else -1
        args = []
        for i, t in enumerate(tool.inputs):
            if i == slot:
                args.append(f"r{len(calls)}")  # the previous call's result (results count from r1)
                continue
            givens.append(Given(f"x{len(givens) + 1}", t, _given_value(rng, t)))
            args.append(givens[-1].ref)
        calls.append(Call(tool.name, tuple(args)))
        prev = tool.output
        if goal_layer(lib, {g.type for g in givens}, prev, step) != step:
            return None
    return givens, calls, prev


MAX_DRAWS = 2000  # walks tried per task before the reset fails (an env failure, never an endless loop)


def make_task(lib: Library, task_id: int, tier: int, distractors: int) -> Task:
    """The task of ``task_id`` at ``tier``: a walk whose goal's planning layer is exactly ``tier`` and whose
    given values every call accepts (finite results), and ``distractors`` further listed tools that take one of
    the task's types. Deterministic per (library seed, task id, tier, distractors)."""
    rng = random.Random(f"credo/toolgraph/task/{lib.seed}/{tier}/{distractors}/{task_id}")
    for _ in range(MAX_DRAWS):
        walk = _walk(lib, rng, tier)
        if walk is None:
            continue
        givens, calls, goal = walk
        if goal_layer(lib, {g.type for g in givens}, goal, tier) != tier or not _computes(lib, givens, calls):
            continue
        used = {c.tool for c in calls}
        types = {g.type for g in givens} | {lib.by_name[c].output for c in used}
        pool = sorted({t.name for ty in types for t in lib.consumers.get(ty, ())} - used)
        extra = rng.sample(pool, min(distractors, len(pool)))
        return Task(tier, goal, tuple(givens), tuple(calls), tuple(sorted(used | set(extra))))
    raise RuntimeError(f"toolgraph: no tier-{tier} task for id {task_id} in {MAX_DRAWS} draws (seed {lib.seed})")


def _computes(lib: Library, givens: list[Given], calls: list[Call]) -> bool:
    """Every call of the chain gives a finite value of sane magnitude."""
    values: dict[str, float | str] = {g.ref: g.value for g in givens}
    for j, call in enumerate(calls):
        try:
            out = lib.by_name[call.tool].apply(tuple(values[a] for a in call.args))
        except ArithmeticError:
            return False
        if not 1e-9 < abs(out) < 1e12:
            return False
        values[f"r{j + 1}"] = out
    return True


def library_stats(lib: Library) -> dict[str, int]:
    """Tool counts per kind and the number of dependency edges (type-matched tool pairs)."""
    kinds = {k: sum(t.kind == k for t in lib.tools) for k in ("convert", "law", "lookup")}
    edges = sum(len(lib.consumers.get(t.output, ())) for t in lib.tools)
    return {"tools": len(lib.tools), **kinds, "edges": edges}


__all__ = ["BASE", "Call", "Given", "Library", "LOOKUPS", "MATERIAL", "MATERIALS", "QUANTITIES", "QUANTITY", "Task",
           "Tool", "TypeKey", "Unit", "build_library", "from_si", "goal_layer", "library_stats", "make_task",
           "to_si", "type_text", "unit"]
