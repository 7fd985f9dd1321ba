"""HTTP service over a :class:`Sandbox` (``credo sandbox serve``; FastAPI + uvicorn, 127.0.0.1 by default).

    POST /run          {"source", "language"?, "stdin"?, "limits"?, "files"?, "fetch_files"?,
                        "compile_timeout_s"?}                                  -> RunResult
    POST /judge        {"source", "tests", "language"?, "limits"?, "checker"?, "fn_name"?, "compile_timeout_s"?,
                        ...}                                                   -> JudgeResult
    POST /judge_batch  {"requests": [judge request, ...]}                   -> {"results": [JudgeResult, ...]}
    POST /run_code     SandboxFusion's request and response, field by field (docs/sandbox.md), so verl configs
                       and SandboxFusion's own client (``sandbox_fusion.run_code``) can point at credo
    GET  /v1/ping      "pong" (SandboxFusion's liveness check)
    GET  /health       {"status": "ok", "workers", "pending", "stats"}

Every field is validated: a wrong type, an out-of-range value or an unknown field is answered 422 with a
one-line ``detail`` naming the field. Limits are capped by the server's :class:`LimitCaps` (``--max-*``): a
request may lower a limit, never raise it (above a maximum: 422; ``limits.wall_time_s`` at most the largest
backstop; ``compile_timeout_s`` / ``compile_timeout`` at most ``--max-compile-time-s``). With a token
(``--token`` or ``$CREDO_SANDBOX_TOKEN``) every request needs ``Authorization: Bearer <token>`` (401
otherwise). When more than ``max_queue`` jobs are waiting, requests are answered 429 (retry later) instead of
queueing without bound. Connections, request heads and bodies are bounded by :class:`credo.http_server.ServerLimits`
(:data:`SERVER_LIMITS`: a body over 64 MiB is 413, ``--max-request-mb``; larger ``files`` need the flag).
SIGTERM shuts down cleanly: running requests get a few seconds, then the workers stop and the sandbox's
temporary directory is removed.
"""
from __future__ import annotations

import asyncio
import signal
from dataclasses import asdict, replace
from typing import Any

from credo.http_auth import install_bearer_auth, resolve_token, warn_if_exposed
from credo.http_server import MiB, ServerLimits, install_body_limit
from credo.http_server import serve as serve_http
from credo.sandbox.limits import (
    CE,
    MAX_INT,
    MLE,
    OK,
    OLE,
    SE,
    TLE,
    FieldError,
    LimitCaps,
    check_number,
    parse_limits,
    type_name,
)
from credo.sandbox.pool import Sandbox
from credo.sandbox.results import RunRequest, RunResult, capped_compile_timeout, parse_judge, parse_run

# SandboxFusion's language names credo runs -> credo's (c and javascript are credo's own names, accepted too)
_FUSION_LANGUAGES = {"python": "python", "cpp": "cpp", "c": "c", "nodejs": "javascript", "javascript": "javascript",
                     "bash": "bash", "java": "java", "go": "go", "rust": "rust"}
# the rest of SandboxFusion's languages (its RunCodeRequest.language): answered SandboxError, not 422
_FUSION_OTHERS = ("go_test", "php", "csharp", "typescript", "sql", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala",
                  "julia", "pytest", "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift",
                  "racket", "python2", "gtest", "react")
# SandboxFusion /run_code fields credo reads, and their types (other fields are ignored, as SandboxFusion does)
_FUSION_TYPES = {"code": str, "language": str, "stdin": (str, type(None)), "files": dict, "fetch_files": list}
_FUSION_LABELS = {"time_s": "run_timeout", "memory_mb": "memory_limit_MB"}
_FUSION_DEFAULTS = {"time_s": 10.0, "memory_mb": 1024}
FUSION_COMPILE_TIMEOUT_S = 10.0  # SandboxFusion's default compile_timeout
FUSION_POD = "credo"  # executor_pod_name
SHUTDOWN_GRACE_S = 5  # seconds running requests get after SIGTERM
SERVER_LIMITS = ServerLimits(max_body_bytes=64 * MiB)  # fits /run_code's 64 files of 32 MiB decoded in all


def create_app(sandbox: Sandbox, *, max_queue: int = 256, caps: LimitCaps | None = None, token: str | None = None,
               server_limits: ServerLimits | None = None):
    """The FastAPI app (module docstring); request bodies are bounded by ``server_limits`` (default
    :data:`SERVER_LIMITS`), after the bearer check."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse

    caps = caps or LimitCaps()
    app = FastAPI(title="credo sandbox", version="1")
    install_body_limit(app, server_limits or SERVER_LIMITS)
    install_bearer_auth(app, token)

    @app.exception_handler(FieldError)
    async def bad_field(request, exc: FieldError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    def admit(n: int = 1) -> None:
        if sandbox.pending + n > max_queue:
            raise HTTPException(status_code=429, detail=f"sandbox queue is full ({sandbox.pending} waiting)")

    async def wait(future):
        return await asyncio.wrap_future(future)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "workers": sandbox.workers, "pending": sandbox.pending, "stats": sandbox.stats,
                "unsafe": sandbox.unsafe}

    @app.post("/run")
    async def run(body: dict[str, Any]) -> dict[str, Any]:
        req = parse_run(body, caps)
        admit()
        return asdict(await wait(sandbox.submit(req)))

    @app.post("/judge")
    async def judge(body: dict[str, Any]) -> dict[str, Any]:
        req = parse_judge(body, caps)
        admit()
        return _judge_dict(await wait(sandbox.submit(req)))

    @app.post("/judge_batch")
    async def judge_batch(body: dict[str, Any]) -> dict[str, Any]:
        requests = _batch(body, caps)
        admit(len(requests))
        results = await asyncio.gather(*(wait(sandbox.submit(r)) for r in requests))
        return {"results": [_judge_dict(r) for r in results]}

    @app.post("/run_code")
    async def run_code(body: dict[str, Any]) -> dict[str, Any]:
        req = fusion_request(body, caps)
        if req is None:
            return fusion_error(f"credo's sandbox does not run {body['language']} (it runs "
                                f"{', '.join(sorted(_FUSION_LANGUAGES))})")
        admit()
        return fusion_response(await wait(sandbox.submit(req)))

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"  # SandboxFusion's liveness answer

    return app


def _batch(body: dict[str, Any], caps: LimitCaps) -> list:
    """The judge requests of a /judge_batch body (``requests[i].field`` names a bad field)."""
    for name in body:
        if name != "requests":
            raise FieldError(f"{name} is not a field of a judge_batch request (known: requests)")
    requests = body.get("requests", [])
    if not isinstance(requests, list):
        raise FieldError(f"requests must be a list, got {type_name(requests)}")
    return [parse_judge(r, caps, where=f"requests[{i}].") for i, r in enumerate(requests)]


def fusion_request(body: dict[str, Any], caps: LimitCaps) -> RunRequest | None:
    """The RunRequest of a SandboxFusion /run_code body (None: one of SandboxFusion's languages credo does not run).

    ``code`` and ``language`` are required; ``run_timeout`` (wall clock; also the CPU limit) and
    ``memory_limit_MB`` (<= 0: the default 1024 MB) map to the limits under ``caps``; ``compile_timeout`` is the
    compile step's limit; ``files`` / ``fetch_files`` are checked by :mod:`credo.sandbox.workfiles`. A bad
    field raises :class:`FieldError` (422)."""
    for name in ("code", "language"):
        if name not in body:
            raise FieldError(f"{name} is required")
    for name, kinds in _FUSION_TYPES.items():
        if name in body and not isinstance(body[name], kinds):
            raise FieldError(f"{name} must be {getattr(kinds, '__name__', 'str or null')}, "
                             f"got {type_name(body[name])}")
    default_compile = min(FUSION_COMPILE_TIMEOUT_S, caps.compile_time_s)
    compile_timeout = capped_compile_timeout(body.get("compile_timeout", default_compile), caps,
                                             "compile_timeout")
    language = _FUSION_LANGUAGES.get(body["language"])
    if language is None:
        if body["language"] in _FUSION_OTHERS:
            return None
        raise FieldError(f"language must be one of SandboxFusion's languages, got {body['language']!r:.40}")
    given: dict[str, Any] = {}
    if "run_timeout" in body:
        given["time_s"] = body["run_timeout"]
    memory = body.get("memory_limit_MB", -1)
    check_number(memory, "memory_limit_MB", minimum=-MAX_INT)
    if memory > 0:
        given["memory_mb"] = max(1, int(memory))
    limits = parse_limits(given, caps, labels=_FUSION_LABELS, defaults=_FUSION_DEFAULTS)
    limits = replace(limits, wall_time_s=limits.time_s)  # run_timeout is wall clock, as in SandboxFusion
    return RunRequest(source=body["code"], language=language, stdin=body.get("stdin") or "", limits=limits,
                      files=body.get("files", {}), fetch_files=body.get("fetch_files", []),
                      compile_timeout_s=compile_timeout)


def _judge_dict(result) -> dict[str, Any]:
    out = asdict(result)
    out["pass_rate"] = result.pass_rate
    return out


def fusion_error(message: str) -> dict[str, Any]:
    """SandboxFusion's answer when the sandbox itself failed (its client raises on it)."""
    return {"status": "SandboxError", "message": message, "compile_result": None, "run_result": None,
            "executor_pod_name": FUSION_POD, "files": {}}


def fusion_response(result: RunResult) -> dict[str, Any]:
    """SandboxFusion's /run_code response for a credo RunResult.

    SE is ``SandboxError``. Otherwise a compiled language has a ``compile_result`` (its step's result), and a
    ``run_result`` unless compilation failed; ``status`` is ``Failed`` when a step timed out or returned
    nonzero, else ``Success``; ``message`` carries credo's detail (which limit, which signal)."""
    if result.verdict == SE:
        return fusion_error(result.detail)
    compile_part = fusion_step(result.compile) if result.compile is not None else None
    run_part = None if result.verdict == CE and result.compile is not None else fusion_step(result)
    parts = [p for p in (compile_part, run_part) if p is not None]
    failed = any(p["status"] == "TimeLimitExceeded" or p["return_code"] != 0 for p in parts)
    return {"status": "Failed" if failed else "Success", "message": result.detail, "compile_result": compile_part,
            "run_result": run_part, "executor_pod_name": FUSION_POD, "files": dict(result.files)}


def fusion_step(result: RunResult) -> dict[str, Any]:
    """SandboxFusion's CommandRunResult of one step: ``TimeLimitExceeded`` (no return code) for TLE, else
    ``Finished`` with the return code (MLE, OLE, RE and an interpreter's syntax error included)."""
    timed_out = result.verdict == TLE
    return {"status": "TimeLimitExceeded" if timed_out else "Finished", "execution_time": result.wall_time_s,
            "cpu_time": result.cpu_time_s, "return_code": None if timed_out else fusion_return_code(result),
            "stdout": result.stdout, "stderr": result.stderr}


def fusion_return_code(result: RunResult) -> int:
    """The step's return code as SandboxFusion's subprocess reports it: ``-N`` for death by signal N, else the
    exit code; a step that failed with exit code 0 (stopped at a limit, or a compiler that made no program)
    gets -9 (killed at a limit) or 1."""
    if result.signal:
        return -result.signal
    if result.exit_code is not None and (result.exit_code != 0 or result.verdict == OK):
        return result.exit_code
    return -9 if result.verdict in (MLE, OLE, TLE) else 1


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def serve(host: str = "127.0.0.1", port: int = 8080, workers: int | None = None, max_queue: int = 256,
          unsafe: bool = False, *, token: str | None = None, caps: LimitCaps | None = None,
          server_limits: ServerLimits | None = None) -> None:
    """Serve a new :class:`Sandbox` on ``host:port`` until SIGINT / SIGTERM, then close it (workers stopped,
    temporary directory removed; SIGTERM exits with status 143). The token is ``token`` or
    ``$CREDO_SANDBOX_TOKEN`` (none: no authentication, and a warning on a non-loopback bind); connections, heads
    and bodies are bounded by ``server_limits`` (default :data:`SERVER_LIMITS`, :mod:`credo.http_server`)."""
    server_limits = server_limits or SERVER_LIMITS
    token = resolve_token("sandbox", token)
    warn_if_exposed(host, token, what="credo sandbox serve")
    # uvicorn restores this handler after its graceful shutdown and re-raises SIGTERM: the SystemExit then
    # unwinds through the `with`, so the sandbox is closed instead of the process dying with its workers.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with Sandbox(workers=workers, unsafe=unsafe) as sandbox:
            app = create_app(sandbox, max_queue=max_queue, caps=caps, token=token, server_limits=server_limits)
            serve_http(app, host=host, port=port, limits=server_limits, log_level="info",
                       timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
    finally:
        signal.signal(signal.SIGTERM, previous)
