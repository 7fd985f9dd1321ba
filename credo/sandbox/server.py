"""HTTP service over a :class:`Sandbox` (``credo sandbox serve``; FastAPI + uvicorn, 127.0.0.1 by default).

    POST /run          {"source", "language"?, "stdin"?, "limits"?}           -> RunResult
    POST /judge        {"source", "tests", "language"?, "limits"?, "checker"?, "fn_name"?, ...} -> JudgeResult
    POST /judge_batch  {"requests": [judge request, ...]}                   -> {"results": [JudgeResult, ...]}
    POST /run_code     SandboxFusion's request and response shape, so verl configs can point at credo
    GET  /health       {"status": "ok", "workers", "pending", "stats"}

When more than ``max_queue`` jobs are waiting, requests are answered 429 (retry later) instead of
queueing without bound.
"""
from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from credo.sandbox.limits import CE, OK, TLE, Limits
from credo.sandbox.pool import Sandbox, judge_request
from credo.sandbox.results import RunRequest

# SandboxFusion language names that differ from credo's
_FUSION_LANGUAGES = {"python": "python", "cpp": "cpp", "c": "c", "nodejs": "javascript", "javascript": "javascript",
                     "bash": "bash", "java": "java", "go": "go", "rust": "rust"}


def create_app(sandbox: Sandbox, *, max_queue: int = 256):
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse

    app = FastAPI(title="credo sandbox", version="1")

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
        admit()
        try:
            req = RunRequest(source=body["source"], language=body.get("language"), stdin=body.get("stdin", ""),
                             limits=Limits(**body.get("limits", {})))
        except (KeyError, TypeError) as exc:
            raise HTTPException(status_code=422, detail=f"bad run request: {exc}") from None
        return asdict(await wait(sandbox.submit(req)))

    @app.post("/judge")
    async def judge(body: dict[str, Any]) -> dict[str, Any]:
        admit()
        return _judge_dict(await wait(sandbox.submit(_parse_judge(body))))

    @app.post("/judge_batch")
    async def judge_batch(body: dict[str, Any]) -> dict[str, Any]:
        requests = [_parse_judge(r) for r in body.get("requests", [])]
        admit(len(requests))
        results = await asyncio.gather(*(wait(sandbox.submit(r)) for r in requests))
        return {"results": [_judge_dict(r) for r in results]}

    @app.post("/run_code")
    async def run_code(body: dict[str, Any]):
        admit()
        language = _FUSION_LANGUAGES.get(str(body.get("language", "python")).lower())
        if language is None:
            return JSONResponse({"status": "SandboxError", "message": f"unsupported language {body.get('language')}",
                                 "compile_result": None, "run_result": None, "executor_pod_name": "credo",
                                 "files": {}})
        memory = body.get("memory_limit_MB", -1)
        limits = Limits(time_s=float(body.get("run_timeout", 10)), memory_mb=int(memory) if memory and memory > 0 else 1024)
        result = await wait(sandbox.submit(RunRequest(source=body.get("code", ""), language=language,
                                                      stdin=body.get("stdin", "") or "", limits=limits)))
        return fusion_response(result)

    return app


def _parse_judge(body: dict[str, Any]):
    from fastapi import HTTPException

    try:
        return judge_request(body)
    except (KeyError, TypeError) as exc:
        raise HTTPException(status_code=422, detail=f"bad judge request: {exc}") from None


def _judge_dict(result) -> dict[str, Any]:
    out = asdict(result)
    out["pass_rate"] = result.pass_rate
    return out


def fusion_response(result) -> dict[str, Any]:
    """SandboxFusion's /run_code response for a credo RunResult."""
    status_map = {OK: "Finished", TLE: "TimeLimitExceeded"}
    run_part = {"status": status_map.get(result.verdict, "Error"), "execution_time": result.wall_time_s,
                "return_code": result.exit_code if result.exit_code is not None else -1,
                "stdout": result.stdout, "stderr": result.stderr}
    if result.verdict == "SE":
        return {"status": "SandboxError", "message": result.detail, "compile_result": None, "run_result": None,
                "executor_pod_name": "credo", "files": {}}
    if result.verdict == CE:
        compile_part = {**run_part, "status": "Error"}
        return {"status": "Failed", "message": result.detail, "compile_result": compile_part, "run_result": None,
                "executor_pod_name": "credo", "files": {}}
    return {"status": "Success" if result.verdict == OK else "Failed", "message": result.detail,
            "compile_result": None, "run_result": run_part, "executor_pod_name": "credo", "files": {}}


def serve(host: str = "127.0.0.1", port: int = 8080, workers: int | None = None, max_queue: int = 256,
          unsafe: bool = False) -> None:
    import uvicorn

    with Sandbox(workers=workers, unsafe=unsafe) as sandbox:
        uvicorn.run(create_app(sandbox, max_queue=max_queue), host=host, port=port, log_level="info")
