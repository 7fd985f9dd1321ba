"""Resource limits of one sandboxed run, their validation, the server-side maxima, and the verdict names."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

# run verdicts
OK, CE, RE, TLE, MLE, OLE, SE = "OK", "CE", "RE", "TLE", "MLE", "OLE", "SE"
# judge verdicts add accepted / wrong answer
AC, WA = "AC", "WA"
RUN_VERDICTS = (OK, CE, RE, TLE, MLE, OLE, SE)
JUDGE_VERDICTS = (AC, WA, CE, RE, TLE, MLE, OLE, SE)
# worst-first order used to summarise many tests (SE is an infrastructure failure, never a wrong answer)
SEVERITY = {SE: 0, CE: 1, RE: 2, MLE: 3, TLE: 4, OLE: 5, WA: 6, AC: 7, OK: 7}

MAX_INT = 1 << 40  # absolute ceiling of every integer limit (rlimits and cgroup values must not overflow)
MAX_ENV_ENTRIES = 64
MAX_ENV_BYTES = 64 << 10
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class FieldError(ValueError):
    """A request or limit field has the wrong type or is out of range (the message names the field)."""


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def check_number(value: Any, name: str, *, integer: bool = False, minimum: float = 0.0,
                 strict: bool = False) -> None:
    """Raise :class:`FieldError` unless ``value`` is a finite number (an int when ``integer``; never a bool)
    that is ``>= minimum`` (``> minimum`` when ``strict``) and at most :data:`MAX_INT`."""
    kinds = (int,) if integer else (int, float)
    what = "an integer" if integer else "a number"
    bound = f"{'>' if strict else '>='} {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise FieldError(f"{name} must be {what} {bound}, got {type_name(value)} {value!r:.40}")
    if not math.isfinite(value) or value > MAX_INT or value < minimum or (strict and value == minimum):
        raise FieldError(f"{name} must be {what} {bound} and at most {MAX_INT}, got {value!r}")


def check_env(value: Any, name: str) -> None:
    """``extra_env`` must map at most 64 variable names to strings (no NUL bytes, 64 KiB in all)."""
    if not isinstance(value, dict):
        raise FieldError(f"{name} must be an object of strings, got {type_name(value)}")
    if len(value) > MAX_ENV_ENTRIES:
        raise FieldError(f"{name} has {len(value)} variables, more than {MAX_ENV_ENTRIES}")
    for key, text in value.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise FieldError(f"{name} has an invalid variable name {key!r:.40}")
        if not isinstance(text, str) or "\0" in text:
            raise FieldError(f"{name}.{key} must be a string without NUL bytes, got {type_name(text)}")
    if sum(len(k) + len(v) for k, v in value.items()) > MAX_ENV_BYTES:
        raise FieldError(f"{name} is larger than {MAX_ENV_BYTES} bytes")


# field -> (integer?, minimum, strict?) for every numeric limit
_NUMBERS = {"time_s": (False, 0.0, True), "memory_mb": (True, 1, False), "output_bytes": (True, 1, False),
            "processes": (True, 1, False), "file_size_mb": (True, 0, False), "open_files": (True, 1, False),
            "wall_factor": (False, 1.0, False), "wall_time_s": (False, 0.0, False)}


def check_limit(name: str, value: Any, label: str | None = None) -> None:
    """Validate one :class:`Limits` field's type and range; errors are named ``label`` (default ``name``)."""
    label = label or name
    if name == "extra_env":
        check_env(value, label)
    elif name in _NUMBERS:
        integer, minimum, strict = _NUMBERS[name]
        check_number(value, label, integer=integer, minimum=minimum, strict=strict)
    else:
        raise FieldError(f"{label} is not a limit (known: {', '.join(LIMIT_FIELDS)})")


@dataclass(frozen=True)
class Limits:
    """Limits of one run. Time is CPU time; ``wall_factor`` gives the wall-clock backstop, or ``wall_time_s``
    (when > 0) an exact wall-clock limit (SandboxFusion's ``run_timeout``): exceeding either is TLE.

    Every field is validated on construction (:class:`FieldError` names the field)."""

    time_s: float = 2.0  # CPU seconds; exceeding it is TLE
    memory_mb: int = 256  # cgroup memory limit (RSS + page cache of the run); exceeding it is MLE
    output_bytes: int = 1 << 20  # cap on stdout and on stderr, each; exceeding the stdout cap is OLE
    processes: int = 32  # cgroup pids limit (threads count)
    file_size_mb: int = 16  # RLIMIT_FSIZE for files the program writes
    open_files: int = 64  # RLIMIT_NOFILE
    wall_factor: float = 3.0  # wall-clock backstop = wall_factor * time_s + 1 s (sleeping programs are TLE)
    extra_env: dict = field(default_factory=dict)  # extra environment variables (the environment is cleared)
    wall_time_s: float = 0.0  # > 0: the wall-clock limit itself (checked before CPU time); 0: the backstop

    def __post_init__(self) -> None:
        for name in LIMIT_FIELDS:
            check_limit(name, getattr(self, name))

    @property
    def wall_s(self) -> float:
        """The wall-clock limit: ``wall_time_s`` when set, else the backstop ``wall_factor * time_s + 1``."""
        return self.wall_time_s if self.wall_time_s > 0 else self.wall_factor * self.time_s + 1.0


LIMIT_FIELDS = tuple(f.name for f in fields(Limits))

COMPILE_LIMITS = Limits(time_s=20.0, memory_mb=1024, output_bytes=64 << 10, processes=64, file_size_mb=256,
                        open_files=256, wall_factor=2.0)


def compile_limits(timeout_s: float | None) -> Limits:
    """A compile step's limits: :data:`COMPILE_LIMITS`, or with ``timeout_s`` its CPU and wall-clock limit."""
    if timeout_s is None:
        return COMPILE_LIMITS
    return replace(COMPILE_LIMITS, time_s=timeout_s, wall_time_s=timeout_s)


@dataclass(frozen=True)
class LimitCaps:
    """Server-side maxima (``credo sandbox serve --max-*``): a request may lower any limit, never raise it.

    A limit a request leaves out takes its default lowered to the maximum; ``tests`` caps the tests of one
    judge request; ``compile_time_s`` caps a compile step's time (``compile_timeout_s``, SandboxFusion's
    ``compile_timeout``)."""

    time_s: float = 60.0
    memory_mb: int = 4096
    output_bytes: int = 16 << 20
    processes: int = 256
    file_size_mb: int = 256
    open_files: int = 1024
    wall_factor: float = 10.0
    tests: int = 1000
    compile_time_s: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "tests":
                check_number(self.tests, "maximum tests", integer=True, minimum=1)
            elif f.name == "compile_time_s":
                check_number(self.compile_time_s, "maximum compile_time_s", strict=True)
            else:
                check_limit(f.name, getattr(self, f.name), label=f"maximum {f.name}")

    @property
    def wall_time_s(self) -> float:
        """Largest ``wall_time_s`` a request may ask for: the largest backstop."""
        return self.wall_factor * self.time_s + 1.0

    def limits(self, data: Any = None, **kwargs: Any) -> Limits:
        """:func:`parse_limits` under these maxima."""
        return parse_limits(data, self, **kwargs)


def parse_limits(data: Any = None, caps: LimitCaps | None = None, *, where: str = "limits",
                 labels: dict[str, str] | None = None, defaults: dict[str, Any] | None = None) -> Limits:
    """Limits from a request's ``limits`` object (or a :class:`Limits`), checked against ``caps`` if given.

    Unknown fields, wrong types, out-of-range values and values above a maximum raise :class:`FieldError`
    naming the field (``labels[name]`` or ``where.name``). A field left out takes ``defaults[name]`` (else the
    Limits default), lowered to the maximum."""
    if isinstance(data, Limits):
        data = asdict(data)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise FieldError(f"{where} must be an object, got {type_name(data)}")
    for name in data:
        if name not in LIMIT_FIELDS:
            check_limit(name, data[name], f"{where}.{name}")  # raises: not a limit
    values = {**asdict(Limits()), **(defaults or {})}
    for name in LIMIT_FIELDS:
        label = (labels or {}).get(name, f"{where}.{name}")
        cap = getattr(caps, name, None) if caps is not None else None
        if name in data:
            check_limit(name, data[name], label)
            if cap is not None and data[name] > cap:
                raise FieldError(f"{label}={data[name]!r} exceeds the server maximum {cap!r}")
            values[name] = data[name]
        elif cap is not None:
            values[name] = min(values[name], cap)
    return Limits(**values)
