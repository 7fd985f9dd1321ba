"""Built-in generated tasks with verifiable answers, registered by name.

A task is a small dataclass whose fields are its keyword parameters (with defaults). It generates
one :class:`~credo.types.Example` at a time from a caller-owned ``random.Random`` and knows a correct
response text (:meth:`Task.demonstration`) for supervised warm starts::

    task = get_task("reversal", alphabet_size=4)
    train, eval_ = build_splits(task, train_size=1000, eval_size=100, seed=0)

Every prompt is short printable ASCII so a character-level tokenizer covers it.

Built-ins:

- ``reversal``: ``"rev abc="`` -> ``"cba"`` (verifier ``exact_match``)
- ``addition``: ``"12+34="`` -> ``"46"`` (verifier ``exact_match``)
- ``countdown``: ``"3 5 2 to 16:"`` -> ``"(3+5)*2"`` (verifier ``countdown``: the expression must use
  each number exactly once and evaluate to the target in exact rational arithmetic)

Each built-in marks its grounding span(s) in ``Example.meta["grounding"]``: half-open character spans of the
prompt holding what the answer is computed from (the string to reverse, the operands, the numbers and the
target), which VEPO perturbs (``credo.methods.vepo.grounding``).

Task libraries (``docs/tasks.md``): ``rg:<dataset>`` names a reasoning-gym dataset
(:mod:`credo.data.reasoning_gym_task`, resolved by :func:`get_task`, imported only when named) and
``humaneval`` the HumanEval problems (:mod:`credo.data.humaneval_task`).
"""
from __future__ import annotations

import dataclasses
import difflib
import random
import string
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, ClassVar, TypeVar

from credo.registry import Registry
from credo.types import Example

__all__ = [
    "Task",
    "ReversalTask",
    "AdditionTask",
    "CountdownTask",
    "register_task",
    "get_task",
    "list_tasks",
    "task_param_names",
    "build_splits",
    "RG_PREFIX",
    "TASKS",
]

# A split gives up after this many consecutive draws that collide (eval duplicates, or train prompts
# that are held out in eval): the task's prompt space is then too small for the requested sizes.
MAX_CONSECUTIVE_COLLISIONS = 1000


# --------------------------------------------------------------------------------------------------
# Base class and registry
# --------------------------------------------------------------------------------------------------


@dataclass
class Task:
    """Base of generated tasks. Subclasses add their keyword parameters as dataclass fields."""

    name: ClassVar[str] = ""
    default_reward: ClassVar[str] = "exact_match"  # verifier name

    def make_example(self, rng: random.Random, index: int, split: str) -> Example:
        """One example drawn from ``rng``; ``index`` and ``split`` only name it (uid)."""
        raise NotImplementedError

    def demonstration(self, example: Example) -> str:
        """A correct response for ``example`` (no EOS; the tokenizer appends it)."""
        return example.answer

    def params(self) -> dict[str, Any]:
        """The task's keyword parameters and their current values."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def splits(self, *, train_size: int, eval_size: int, seed: int) -> tuple[list[Example], list[Example]]:
        """``(train, eval)`` of :func:`build_splits`: by default examples drawn one at a time from
        :meth:`make_example`; a task with its own generator or a fixed problem set overrides this."""
        eval_examples = _eval_split(self, eval_size, _split_rng(seed, self, "eval"))
        held_out = {ex.prompt for ex in eval_examples}
        return _train_split(self, train_size, _split_rng(seed, self, "train"), held_out), eval_examples

    def _uid(self, split: str, index: int) -> str:
        return f"{self.name}/{split}/{index}"


TaskT = TypeVar("TaskT", bound=type[Task])

# credo.data imports these modules itself; naming them keeps the listing whole for a caller of this module alone
TASKS: Registry[type[Task]] = Registry("task", builtins=("credo.data.code_task", "credo.data.humaneval_task",
                                                         "credo.data.shapes"))


def register_task(name: str) -> Callable[[TaskT], TaskT]:
    """Class decorator: register a :class:`Task` dataclass under ``name`` (also sets ``cls.name``)."""

    def deco(cls: TaskT) -> TaskT:
        if not (isinstance(cls, type) and issubclass(cls, Task) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"register_task({name!r}) expects a Task dataclass, got {cls!r}")
        TASKS.refuse_taken(name, cls)
        cls.name = name
        return TASKS.add(name, cls)

    return deco


def _hint(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _task_class(name: str) -> type[Task]:
    return TASKS.get(name)


def list_tasks() -> list[str]:
    """Names of all registered tasks, sorted (``rg:<dataset>`` names are resolved on use, not listed)."""
    return TASKS.names()


RG_PREFIX = "rg:"  # task names "rg:<dataset>": a reasoning-gym dataset (credo.data.reasoning_gym_task)
RG_MODULE = "credo.data.reasoning_gym_task"  # imported by name: it builds on this module (no import cycle)


def _rg():
    import importlib

    return importlib.import_module(RG_MODULE)


def task_param_names(name: str) -> dict[str, Any]:
    """Parameter name -> default for task ``name`` (for config validation)."""
    if name.startswith(RG_PREFIX):
        return _rg().rg_param_defaults(name[len(RG_PREFIX):])
    return field_defaults(_task_class(name))


def field_defaults(cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Field name -> default of dataclass ``cls`` (None for a field without one), ``skip`` left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = None
    return out


def get_task(name: str, *, curriculum: dict | None = None, **params: Any) -> Task:
    """Instantiate task ``name``. Unknown name -> KeyError, unknown parameter -> TypeError,
    out-of-range value -> ValueError. ``curriculum`` (``task.curriculum``) is for ``rg:`` tasks only."""
    if name.startswith(RG_PREFIX):
        return _rg().RgTask(dataset=name[len(RG_PREFIX):], config=params, curriculum=curriculum)
    if curriculum:
        raise ValueError(f"task.curriculum: task {name!r} has no curriculum (reasoning-gym tasks rg:<dataset> do)")
    cls = _task_class(name)
    known = task_param_names(name)
    for key in params:
        if key not in known:
            takes = ", ".join(known) or "none"
            raise TypeError(f"task {name!r} has no parameter {key!r}{_hint(key, list(known))}; it takes: {takes}")
    return cls(**params)


def _check_int(task: str, param: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"task {task!r}: parameter {param!r} must be an int, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"task {task!r}: parameter {param!r} must be {bound}, got {value}")


# --------------------------------------------------------------------------------------------------
# Built-in tasks
# --------------------------------------------------------------------------------------------------


@register_task("reversal")
@dataclass
class ReversalTask(Task):
    """Reverse a random lowercase string: ``"rev abc="`` -> ``"cba"``."""

    alphabet_size: int = 8  # strings use the first `alphabet_size` lowercase letters
    min_len: int = 3
    max_len: int = 6

    def __post_init__(self) -> None:
        _check_int(self.name, "alphabet_size", self.alphabet_size, 1, 26)
        _check_int(self.name, "min_len", self.min_len, 1)
        _check_int(self.name, "max_len", self.max_len, self.min_len)

    def make_example(self, rng: random.Random, index: int, split: str) -> Example:
        letters = string.ascii_lowercase[: self.alphabet_size]
        length = rng.randint(self.min_len, self.max_len)
        s = "".join(rng.choice(letters) for _ in range(length))
        return Example(prompt=f"rev {s}=", answer=s[::-1], uid=self._uid(split, index),
                       meta={"grounding": [(4, 4 + len(s))]})


@register_task("addition")
@dataclass
class AdditionTask(Task):
    """Add two ``digits``-digit numbers: ``"12+34="`` -> ``"46"``."""

    digits: int = 2  # each operand has exactly this many digits (0..9 when digits == 1)

    def __post_init__(self) -> None:
        _check_int(self.name, "digits", self.digits, 1, 18)

    def make_example(self, rng: random.Random, index: int, split: str) -> Example:
        lo = 10 ** (self.digits - 1) if self.digits > 1 else 0
        hi = 10**self.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        la, lb = len(str(a)), len(str(b))
        return Example(prompt=f"{a}+{b}=", answer=str(a + b), uid=self._uid(split, index),
                       meta={"grounding": [(0, la), (la + 1, la + 1 + lb)]})


# Countdown expression trees. A node is rendered with the fewest parentheses that keep its meaning:
# precedence 1 for + and -, 2 for * and /, 3 for a number.
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass(frozen=True)
class _Expr:
    text: str
    value: Fraction
    precedence: int


def _combine(op: str, left: _Expr, right: _Expr) -> _Expr:
    prec = _PRECEDENCE[op]
    lt = f"({left.text})" if left.precedence < prec else left.text
    # a-(b-c) and a/(b*c) need parentheses on the right; a+(b-c) and a*(b/c) do not (exact arithmetic).
    wrap_right = right.precedence < prec or (right.precedence == prec and op in "-/")
    rt = f"({right.text})" if wrap_right else right.text
    if op == "+":
        value = left.value + right.value
    elif op == "-":
        value = left.value - right.value
    elif op == "*":
        value = left.value * right.value
    else:
        value = left.value / right.value
    return _Expr(f"{lt}{op}{rt}", value, prec)


def _random_expr(rng: random.Random, numbers: list[int]) -> _Expr:
    """A random binary expression tree over ``numbers`` in the given order, each used once."""
    if len(numbers) == 1:
        return _Expr(str(numbers[0]), Fraction(numbers[0]), 3)
    split = rng.randint(1, len(numbers) - 1)
    left, right = _random_expr(rng, numbers[:split]), _random_expr(rng, numbers[split:])
    ops = ["+", "-", "*"]
    if right.value != 0 and (left.value / right.value).denominator == 1:
        ops.append("/")  # division only when it is exact
    return _combine(rng.choice(ops), left, right)


def _number_spans(numbers: list[int], target: int) -> list[tuple[int, int]]:
    """Character spans of each number and of the target in ``"n1 n2 ... to T:"``."""
    spans, at = [], 0
    for n in numbers:
        spans.append((at, at + len(str(n))))
        at += len(str(n)) + 1
    at += len("to ")
    return spans + [(at, at + len(str(target)))]


@register_task("countdown")
@dataclass
class CountdownTask(Task):
    """Reach a target with + - * / over all given numbers: ``"3 5 2 to 16:"`` -> ``"(3+5)*2"``."""

    default_reward: ClassVar[str] = "countdown"

    num_count: int = 3  # how many numbers (all must be used)
    max_number: int = 9  # numbers are drawn from [1, max_number]
    max_target: int = 100  # targets are positive integers <= max_target
    max_tries: int = 1000  # draws before giving up on finding a valid target

    def __post_init__(self) -> None:
        _check_int(self.name, "num_count", self.num_count, 1)
        _check_int(self.name, "max_number", self.max_number, 1)
        _check_int(self.name, "max_target", self.max_target, 1)
        _check_int(self.name, "max_tries", self.max_tries, 1)

    def make_example(self, rng: random.Random, index: int, split: str) -> Example:
        for _ in range(self.max_tries):
            numbers = [rng.randint(1, self.max_number) for _ in range(self.num_count)]
            order = numbers[:]
            rng.shuffle(order)
            expr = _random_expr(rng, order)
            if expr.value.denominator == 1 and 1 <= expr.value <= self.max_target:
                target = int(expr.value)
                return Example(
                    prompt=f"{' '.join(map(str, numbers))} to {target}:",
                    answer=expr.text,
                    uid=self._uid(split, index),
                    meta={"numbers": numbers, "target": target, "grounding": _number_spans(numbers, target)},
                )
        raise ValueError(
            f"task 'countdown' found no positive integer target <= max_target={self.max_target} in "
            f"{self.max_tries} draws (num_count={self.num_count}, max_number={self.max_number})"
        )


# --------------------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------------------


def _split_rng(seed: int, task: Task, split: str) -> random.Random:
    # String seeds are hashed with SHA-512 by `random`, so this is stable across processes and runs.
    return random.Random(f"credo/{task.name}/{split}/{seed}")


def _too_small(task: Task, what: str, have: int, want: int) -> ValueError:
    return ValueError(
        f"task {task.name!r} with {task.params()} could not produce {what} "
        f"({have} of {want} after {MAX_CONSECUTIVE_COLLISIONS} consecutive collisions): its prompt space "
        "is too small for the requested split sizes; reduce train_size/eval_size or enlarge the task"
    )


def _eval_split(task: Task, size: int, rng: random.Random) -> list[Example]:
    """``size`` examples with pairwise distinct prompts."""
    out: list[Example] = []
    seen: set[str] = set()
    misses = 0
    while len(out) < size:
        ex = task.make_example(rng, len(out), "eval")
        if ex.prompt in seen:
            misses += 1
            if misses >= MAX_CONSECUTIVE_COLLISIONS:
                raise _too_small(task, "enough distinct eval prompts", len(out), size)
            continue
        misses = 0
        seen.add(ex.prompt)
        out.append(ex)
    return out


def _train_split(task: Task, size: int, rng: random.Random, held_out: set[str]) -> list[Example]:
    """``size`` examples whose prompts are not in ``held_out`` (duplicates within train are allowed)."""
    out: list[Example] = []
    misses = 0
    while len(out) < size:
        ex = task.make_example(rng, len(out), "train")
        if ex.prompt in held_out:
            misses += 1
            if misses >= MAX_CONSECUTIVE_COLLISIONS:
                raise _too_small(task, "train prompts outside the held-out eval set", len(out), size)
            continue
        misses = 0
        out.append(ex)
    return out


def build_splits(task: Task, *, train_size: int, eval_size: int, seed: int) -> tuple[list[Example], list[Example]]:
    """Deterministic ``(train, eval)`` example lists for ``task``.

    Eval prompts are pairwise distinct and never appear in train (colliding draws are redrawn).
    Train and eval use separate RNGs derived from ``seed``. Raises ValueError when the task's prompt
    space is too small to satisfy this.
    """
    for label, n in (("train_size", train_size), ("eval_size", eval_size)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{label} must be a non-negative int, got {n!r}")
    return task.splits(train_size=train_size, eval_size=eval_size, seed=seed)
