"""Output checkers and the function-call harness (all comparisons happen outside the sandbox)."""
from __future__ import annotations

import json
import math
from typing import Any

CHECKERS = ("exact", "tokens", "lines", "float", "program")


def check_output(checker: str, output: str, expected: str, *, float_tol: float = 1e-6) -> tuple[bool, str]:
    """(passed, detail) for the built-in checkers.

    exact: byte-for-byte equal; tokens: equal after splitting on any whitespace; lines (Klear's judge):
    equal after stripping each line and dropping leading / trailing blank lines; float: token-wise, numbers
    within ``float_tol`` absolute or relative error, other tokens equal.
    """
    if checker == "exact":
        ok = output == expected
    elif checker == "tokens":
        ok = output.split() == expected.split()
    elif checker == "lines":
        ok = _lines(output) == _lines(expected)
    elif checker == "float":
        return _float_tokens(output.split(), expected.split(), float_tol)
    else:
        raise ValueError(f"unknown checker {checker!r}; choose one of {', '.join(CHECKERS)}")
    return ok, "" if ok else f"expected {_head(expected)!r}, got {_head(output)!r}"


def _lines(text: str) -> list[str]:
    lines = [line.strip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _float_tokens(out: list[str], exp: list[str], tol: float) -> tuple[bool, str]:
    if len(out) != len(exp):
        return False, f"expected {len(exp)} tokens, got {len(out)}"
    for i, (a, b) in enumerate(zip(out, exp)):
        if a == b:
            continue
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False, f"token {i}: expected {b!r}, got {a!r}"
        if not (math.isfinite(x) and abs(x - y) <= tol * max(1.0, abs(y))):
            return False, f"token {i}: expected {b}, got {a} (tolerance {tol})"
    return True, ""


def _head(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


def checker_verdict(stdout: str) -> bool:
    """A checker program accepts by printing True / AC / OK / 1 as its first token (Klear prints True/False)."""
    first = stdout.split()[:1]
    return bool(first) and first[0].lower() in ("true", "ac", "ok", "1", "accepted", "yes")


# ----------------------------------------------------------------------------- function-call mode

PYTHON_HARNESS = r'''
import importlib.util, json, os, sys
# Bind everything the harness needs before the solution's top-level code runs, so that replacing
# json.dumps, print, sys.stdout or sys.stdin from the solution cannot change what is reported.
_dumps, _loads, _write, _read, _exit = json.dumps, json.loads, os.write, os.read, os._exit
_out = os.dup(1)
_spec = importlib.util.spec_from_file_location("solution", "/work/main.py")
_mod = importlib.util.module_from_spec(_spec)
sys.modules["solution"] = _mod
_spec.loader.exec_module(_mod)
# The payload (per-run random sentinel, function name, arguments) is read only now, from fd 0.
_chunks = []
while True:
    _c = _read(0, 65536)
    if not _c:
        break
    _chunks.append(_c)
_payload = _loads(b"".join(_chunks))
_mark, _fn_name, _args = _payload["sentinel"], _payload["fn"], _payload["args"]
del _payload, _chunks
_fn = getattr(_mod, _fn_name, None)
if _fn is None and hasattr(_mod, "Solution"):
    _fn = getattr(_mod.Solution(), _fn_name)
if _fn is None:
    raise SystemExit(f"no function {_fn_name!r} in the solution")
_result = _fn(*_args)
_write(_out, ("\n" + _mark + _dumps(_result) + "\n").encode())
_exit(0)
'''


def harness_payload(sentinel: str, fn_name: str, args: list[Any]) -> str:
    return json.dumps({"sentinel": sentinel, "fn": fn_name, "args": args})


def parse_return(stdout: str, sentinel: str) -> tuple[bool, Any]:
    """(found, value) of the last line carrying the sentinel."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(sentinel):
            try:
                return True, json.loads(line[len(sentinel):])
            except json.JSONDecodeError:
                return False, None
    return False, None


def returns_equal(value: Any, expected: Any, float_tol: float = 1e-6) -> bool:
    expected = json.loads(json.dumps(expected))  # tuples -> lists, as the harness serialised them
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected if isinstance(value, bool) and isinstance(expected, bool) else False
    if isinstance(value, (int, float)) and isinstance(expected, (int, float)):
        return abs(value - expected) <= float_tol * max(1.0, abs(expected))
    if isinstance(value, list) and isinstance(expected, list):
        return len(value) == len(expected) and all(returns_equal(a, b, float_tol) for a, b in zip(value, expected))
    if isinstance(value, dict) and isinstance(expected, dict):
        return value.keys() == expected.keys() and all(returns_equal(value[k], expected[k], float_tol) for k in value)
    return value == expected
