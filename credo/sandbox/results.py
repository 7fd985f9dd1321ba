"""Typed requests and results of the sandbox (plain dataclasses: they cross process boundaries).

Requests validate their fields on construction (:class:`~credo.sandbox.limits.FieldError` names the field);
:func:`parse_run` and :func:`parse_judge` build them from the HTTP API's plain dicts.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from credo.sandbox.checkers import CHECKERS
from credo.sandbox.languages import LANGUAGES, get_language
from credo.sandbox.limits import (
    COMPILE_LIMITS,
    FieldError,
    LimitCaps,
    Limits,
    check_number,
    parse_limits,
    type_name,
)
from credo.sandbox.workfiles import check_fetch, check_inputs

HEAD_BYTES = 1024  # stdout / stderr heads kept per judged test


@dataclass
class RunResult:
    verdict: str  # OK | CE | RE | TLE | MLE | OLE | SE
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: int | None = None
    cpu_time_s: float = 0.0
    wall_time_s: float = 0.0
    memory_peak_bytes: int = 0
    detail: str = ""
    language: str = ""
    files: dict[str, str] = field(default_factory=dict)  # fetched files, base64 (RunRequest.fetch_files)
    # the compile step of a compiled language, with its own verdict (OK | RE | TLE | MLE | OLE | SE); a failed
    # compile makes this result CE (SE when the step was SE); None for interpreted languages
    compile: RunResult | None = None


@dataclass
class TestResult:
    index: int
    verdict: str  # AC | WA | RE | TLE | MLE | OLE | SE
    cpu_time_s: float = 0.0
    wall_time_s: float = 0.0
    memory_peak_bytes: int = 0
    stdout_head: str = ""
    stderr_head: str = ""
    detail: str = ""


@dataclass
class JudgeResult:
    verdict: str  # AC | WA | CE | RE | TLE | MLE | OLE | SE
    passed: int = 0
    total: int = 0
    tests: list[TestResult] = field(default_factory=list)
    language: str = ""
    compile_output: str = ""
    detail: str = ""

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclass
class RunRequest:
    source: str
    language: str | None = None  # None: detect from the source
    stdin: str = ""
    limits: Limits = field(default_factory=Limits)
    files: dict = field(default_factory=dict)  # work-dir path -> base64 content, written before the run (null: skip)
    fetch_files: list = field(default_factory=list)  # work-dir paths read back after the run (RunResult.files)
    compile_timeout_s: float | None = None  # compile step's CPU and wall-clock limit (None: COMPILE_LIMITS)
    # ``files`` decoded (normalised path -> bytes; null and skipped entries left out), set on construction
    inputs: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        _check_common(self)
        _check_type(self.stdin, "stdin", str)
        self.inputs = check_inputs(self.files, own_files(self.language),
                                   max_file_bytes=self.limits.file_size_mb << 20)
        check_fetch(self.fetch_files)
        _check_compile_timeout(self.compile_timeout_s, "compile_timeout_s")


@dataclass
class JudgeRequest:
    source: str
    tests: list[dict[str, Any]]  # {"stdin", "expected_stdout"} or {"args", "expected_return"} (fn_name mode)
    language: str | None = None
    limits: Limits = field(default_factory=Limits)
    checker: str = "tokens"  # exact | tokens | lines | float | program
    checker_source: str | None = None  # checker program (checker="program"), python unless checker_language
    checker_language: str = "python"
    float_tol: float = 1e-6
    fn_name: str | None = None
    stop_on_first_failure: bool = False
    compile_timeout_s: float | None = None  # compile step's CPU and wall-clock limit (None: COMPILE_LIMITS)

    def __post_init__(self) -> None:
        _check_common(self)
        _check_tests(self.tests)
        _check_compile_timeout(self.compile_timeout_s, "compile_timeout_s")
        if not isinstance(self.checker, str) or self.checker not in CHECKERS:
            raise FieldError(f"checker must be one of {', '.join(CHECKERS)}, got {self.checker!r:.40}")
        _check_type(self.checker_source, "checker_source", (str, type(None)))
        _check_type(self.checker_language, "checker_language", str)
        check_number(self.float_tol, "float_tol")
        _check_type(self.fn_name, "fn_name", (str, type(None)))
        _check_type(self.stop_on_first_failure, "stop_on_first_failure", bool)


def own_files(language: Any) -> tuple[str, ...]:
    """The work-dir files a language's program occupies (input files may not replace them, nor lie under
    them); every language's when ``language`` is None (it is detected later); none for an unknown name."""
    if language is None:
        return tuple(sorted({name for lang in LANGUAGES.values() for name in (lang.source_file, *lang.artifacts)}))
    try:
        lang = get_language(language) if isinstance(language, str) else None
    except ValueError:
        return ()
    return (lang.source_file, *lang.artifacts) if lang else ()


def _check_compile_timeout(value: Any, label: str) -> None:
    if value is not None:
        check_number(value, label, strict=True)


def capped_compile_timeout(value: Any, caps: LimitCaps | None, label: str = "compile_timeout_s") -> float | None:
    """A request's compile time limit checked against ``caps.compile_time_s`` (the one place it is): above it,
    :class:`FieldError`; None (not given) stays None (:data:`COMPILE_LIMITS`) unless the maximum is lower than
    COMPILE_LIMITS' time, which it then becomes."""
    if value is None:
        if caps is not None and caps.compile_time_s < COMPILE_LIMITS.time_s:
            return caps.compile_time_s
        return None
    check_number(value, label, strict=True)
    if caps is not None and value > caps.compile_time_s:
        raise FieldError(f"{label}={value!r} exceeds the server maximum {caps.compile_time_s:g}")
    return float(value)


def _check_type(value: Any, name: str, kinds: type | tuple[type, ...]) -> None:
    if not isinstance(value, kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in (kinds if isinstance(kinds, tuple)
                                                                                else (kinds,)))
        raise FieldError(f"{name} must be {names}, got {type_name(value)}")


def _check_common(req: RunRequest | JudgeRequest) -> None:
    _check_type(req.source, "source", str)
    _check_type(req.language, "language", (str, type(None)))
    _check_type(req.limits, "limits", Limits)


def _check_tests(tests: Any) -> None:
    """``tests``: a list of objects; ``stdin`` / ``expected_stdout`` text or numbers, ``args`` a list."""
    _check_type(tests, "tests", list)
    for i, test in enumerate(tests):
        _check_type(test, f"tests[{i}]", dict)
        for key in ("stdin", "expected_stdout"):
            if key in test and (isinstance(test[key], bool) or not isinstance(test[key], (str, int, float))):
                raise FieldError(f"tests[{i}].{key} must be a string or number, got {type_name(test[key])}")
        if "args" in test:
            _check_type(test["args"], f"tests[{i}].args", list)


def _fields_of(cls: type, data: Any, where: str) -> dict[str, Any]:
    """``data`` as keyword arguments of ``cls``: an object with every required field and no unknown one."""
    if not isinstance(data, dict):
        raise FieldError(f"{where.rstrip('.') or 'request'} must be an object, got {type_name(data)}")
    known = {f.name for f in fields(cls) if f.init}
    for name in data:
        if name not in known:
            raise FieldError(f"{where}{name} is not a field of a {cls.__name__} (known: {', '.join(sorted(known))})")
    for f in fields(cls):
        if f.init and f.name not in data and f.default is MISSING and f.default_factory is MISSING:
            raise FieldError(f"{where}{f.name} is required")
    return dict(data)


def parse_run(data: Any, caps: LimitCaps | None = None, *, where: str = "") -> RunRequest:
    """A :class:`RunRequest` from a plain dict; its limits are checked against ``caps`` when given."""
    kwargs = _fields_of(RunRequest, data, where)
    kwargs["limits"] = parse_limits(kwargs.get("limits"), caps, where=f"{where}limits")
    kwargs["compile_timeout_s"] = capped_compile_timeout(kwargs.get("compile_timeout_s"), caps,
                                                         f"{where}compile_timeout_s")
    return _build(RunRequest, kwargs, where)


def parse_judge(data: Any, caps: LimitCaps | None = None, *, where: str = "") -> JudgeRequest:
    """A :class:`JudgeRequest` from a plain dict; limits and the number of tests are checked against ``caps``."""
    kwargs = _fields_of(JudgeRequest, data, where)
    kwargs["limits"] = parse_limits(kwargs.get("limits"), caps, where=f"{where}limits")
    kwargs["compile_timeout_s"] = capped_compile_timeout(kwargs.get("compile_timeout_s"), caps,
                                                         f"{where}compile_timeout_s")
    req = _build(JudgeRequest, kwargs, where)
    if caps is not None and len(req.tests) > caps.tests:
        raise FieldError(f"{where}tests has {len(req.tests)} tests, more than the server maximum {caps.tests}")
    return req


def _build(cls: type, kwargs: dict[str, Any], where: str):
    try:
        return cls(**kwargs)
    except FieldError as exc:
        raise FieldError(f"{where}{exc}") from None
