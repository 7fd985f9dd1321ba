"""Typed requests and results of the sandbox (plain dataclasses: they cross process boundaries)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from credo.sandbox.limits import Limits

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
