"""The :class:`Sandbox`: a pool of long-lived worker processes that compile, run and judge programs.

Parent and worker exchange ``(job_id, kind, request)`` and ``(job_id, result)`` over a socket pair. A worker
whose exchange fails in any way (timeout, death, an error while sending or waiting, a reply with another job's
id or of the wrong type) is killed and replaced, and its caller gets an SE result: a desynchronised worker can
never answer the wrong caller.
"""
from __future__ import annotations

import itertools
import logging
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import asdict, is_dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from credo.procs import started_from_main_thread
# SandboxUnavailable is re-exported: credo.sandbox imports it from this module
from credo.sandbox.isolation import MODE_ENV, SandboxUnavailable, resolve_mode  # noqa: F401
from credo.sandbox.preflight import check_isolation
from credo.sandbox.zygote import WARM_ENV, warm_default
from credo.sandbox.languages import LANGUAGES
from credo.sandbox.limits import COMPILE_LIMITS, SE, Limits
from credo.sandbox.results import JudgeRequest, JudgeResult, RunRequest, RunResult, parse_judge

log = logging.getLogger(__name__)

POLL_CHUNK_S = 3600.0  # longest single wait on a worker's reply (longer job timeouts wait in chunks)
CLOSE_GRACE_S = 2.0  # close() lets running jobs finish this long, then kills their workers


def _worker_main(conn, index: int, root: str, uid_base: int, isolated: bool) -> None:
    """Worker process loop (started as ``python -m credo.sandbox._workerproc``: no main-module re-import)."""
    from credo.sandbox.worker import WorkerContext, become_subreaper

    become_subreaper()
    ctx = WorkerContext(index, root=Path(root), uid_base=uid_base, isolated=isolated)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            ctx.close()
            return
        job_id, kind, request = msg
        try:
            result = ctx.run(request) if kind == "run" else ctx.judge(request)
        except Exception:  # never let a bug in one job take the worker down silently
            detail = "sandbox worker error: " + traceback.format_exc(limit=3)[-800:]
            result = RunResult(verdict=SE, detail=detail) if kind == "run" else JudgeResult(verdict=SE, detail=detail)
        conn.send((job_id, result))


def wait_reply(conn: Connection, timeout: float) -> tuple[bool, Any]:
    """``(True, message)`` once ``conn`` has one, ``(False, None)`` after ``timeout`` seconds.

    Waits in chunks of at most :data:`POLL_CHUNK_S` seconds, so any timeout (even ``inf``) is accepted."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, None
        if conn.poll(min(remaining, POLL_CHUNK_S)):
            return True, conn.recv()


def check_reply(reply: Any, job_id: int, kind: str) -> str | None:
    """None if ``reply`` is ``(job_id, result)`` with a result of the job's kind, else what is wrong with it."""
    expected = RunResult if kind == "run" else JudgeResult
    if not (isinstance(reply, tuple) and len(reply) == 2):
        return f"sandbox worker sent a malformed reply to job {job_id}"
    if reply[0] != job_id:
        return f"sandbox worker answered job {reply[0]!r:.40} instead of job {job_id}"
    if not isinstance(reply[1], expected):
        return f"sandbox worker answered job {job_id} with a {type(reply[1]).__name__}"
    return None


class _Slot:
    """One worker process and the parent-side thread that feeds it jobs."""

    def __init__(self, pool: "Sandbox", index: int):
        self.pool, self.index = pool, index
        self.proc = None
        self.conn = None

    def _start(self) -> None:
        parent, child = socket.socketpair()
        args = [sys.executable, "-m", "credo.sandbox._workerproc", str(child.fileno()), str(self.index), str(self.pool.root),
                str(self.pool.uid_base), "unsafe" if self.pool.unsafe else "isolated",
                str(os.getpid()), str(int(started_from_main_thread()))]  # credo.procs.bind_to_parent
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), MODE_ENV: self.pool.mode,
               WARM_ENV: "1" if self.pool.warm else "0"}
        self.proc = subprocess.Popen(args, pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL)
        child.close()
        self.conn = Connection(parent.detach())

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def interrupt(self) -> None:
        """Kill the worker (from another thread): a job it is running ends as SE and the feeder carries on."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def _kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None
        # a killed worker could not clean up after its job: remove its job directories
        shutil.rmtree(self.pool.root / f"w{self.index}", ignore_errors=True)

    def stop(self) -> None:
        if self._alive():
            try:
                self.conn.send(None)
                self.proc.wait(timeout=2)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def call(self, kind: str, request, timeout: float):
        """Run one job on this slot's worker; on any failed exchange the worker is discarded (SE result)."""
        job_id = next(self.pool._job_ids)
        try:
            if not self._alive():
                if self.proc is not None:
                    self.pool.stats["worker_restarts"] += 1
                    self._kill()
                self._start()
            self.conn.send((job_id, kind, request))
            got, reply = wait_reply(self.conn, timeout)
            detail = check_reply(reply, job_id, kind) if got else f"sandbox worker timed out after {timeout:.0f} s"
            if detail is None:
                return reply[1]
        except (EOFError, OSError) as exc:
            detail = f"sandbox worker died ({type(exc).__name__})"
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, this worker's stream is no longer trusted
            detail = f"sandbox worker exchange failed ({type(exc).__name__}: {exc})"[:500]
        log.warning("%s; worker %d discarded", detail, self.index)
        self._kill()
        self.pool.stats["worker_restarts"] += 1
        return RunResult(verdict=SE, detail=detail) if kind == "run" else JudgeResult(verdict=SE, detail=detail)

    def serve(self) -> None:
        while True:
            item = self.pool._queue.get()
            if item is None:
                break
            future, kind, request, timeout = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self.call(kind, request, timeout))
            except Exception as exc:  # pragma: no cover - defensive
                future.set_exception(exc)
        self.stop()


class Sandbox:
    """Run untrusted programs: ``run`` one program, ``judge`` one against tests, ``judge_batch`` many in parallel.

    ``Sandbox()`` raises :class:`SandboxUnavailable` if isolation cannot be set up; ``unsafe=True`` skips
    bubblewrap, seccomp and the uid drop (rlimits and, where possible, cgroups remain) and logs a warning.
    ``mode`` is ``root`` or ``rootless`` (default: ``$CREDO_SANDBOX_MODE``, else ``root`` when run as root and
    ``rootless`` otherwise; :mod:`credo.sandbox.isolation`). ``warm=True`` runs Python programs by forking a
    started interpreter inside the isolation (:mod:`credo.sandbox.zygote`; default ``$CREDO_SANDBOX_WARM``, else
    off; ignored with ``unsafe``).
    Thread-safe: many threads may submit at once (the HTTP service does).
    """

    def __init__(self, workers: int | None = None, *, unsafe: bool = False, root: str | Path | None = None,
                 uid_base: int = 61000, mode: str | None = None, warm: bool | None = None):
        self.unsafe = unsafe
        self.warm = (warm_default() if warm is None else bool(warm)) and not unsafe
        self.mode = "unsafe" if unsafe else resolve_mode(mode)
        self.uid_base = uid_base
        self.workers = workers or max(1, os.cpu_count() or 1)
        if unsafe:
            log.warning("credo sandbox running UNSAFE: programs run without namespaces, seccomp or a separate uid")
        else:
            check_isolation(uid_base, self.mode)
        self.root = Path(root or tempfile.mkdtemp(prefix="credo-sandbox-"))
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self._own_root = root is None
        self.stats = {"jobs": 0, "worker_restarts": 0, "se": 0}
        self._queue: queue.Queue = queue.Queue()
        self._job_ids = itertools.count(1)  # every job's id; a worker's reply must carry it back
        self._lock = threading.Lock()  # orders submit() against close()
        self._slots = [_Slot(self, i) for i in range(self.workers)]
        self._threads = [threading.Thread(target=s.serve, daemon=True, name=f"credo-sandbox-feeder-{i}")
                         for i, s in enumerate(self._slots)]
        for t in self._threads:
            t.start()
        self._closed = False

    # ------------------------------------------------------------------------------ API
    def run(self, source: str, language: str | None = None, stdin: str = "", limits: Limits | None = None) -> RunResult:
        return self.submit(RunRequest(source=source, language=language, stdin=stdin, limits=limits or Limits())).result()

    def judge(self, source: str, language: str | None = None, tests: list[dict] | None = None, *,
              limits: Limits | None = None, checker: str = "tokens", stop_on_first_failure: bool = False,
              fn_name: str | None = None, checker_source: str | None = None, checker_language: str = "python",
              float_tol: float = 1e-6) -> JudgeResult:
        req = JudgeRequest(source=source, tests=list(tests or []), language=language, limits=limits or Limits(),
                           checker=checker, checker_source=checker_source, checker_language=checker_language,
                           float_tol=float_tol, fn_name=fn_name, stop_on_first_failure=stop_on_first_failure)
        return self.submit(req).result()

    def judge_batch(self, requests: list[JudgeRequest | dict[str, Any]]) -> list[JudgeResult]:
        """Judge many submissions in parallel over the pool; results in request order."""
        futures = [self.submit(r if isinstance(r, JudgeRequest) else judge_request(r)) for r in requests]
        return [f.result() for f in futures]

    def submit(self, request: RunRequest | JudgeRequest) -> Future:
        if not isinstance(request, (RunRequest, JudgeRequest)):
            raise TypeError(f"submit() takes a RunRequest or a JudgeRequest, not {type(request).__name__}")
        future: Future = Future()
        kind = "run" if isinstance(request, RunRequest) else "judge"
        future.add_done_callback(self._count)
        with self._lock:
            if self._closed:
                raise RuntimeError("sandbox is closed")
            self.stats["jobs"] += 1
            self._queue.put((future, kind, request, job_timeout(request)))
        return future

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def languages(self) -> dict[str, bool]:
        """Which languages have a working toolchain inside the sandbox."""
        futures = {name: self.submit(RunRequest(_HELLO[name], name, limits=Limits(time_s=10.0, memory_mb=512)))
                   for name in LANGUAGES}
        return {name: f.result().verdict == "OK" and "hi" in f.result().stdout for name, f in futures.items()}

    def close(self) -> None:
        """Stop the pool: queued jobs get an SE result, jobs still running after :data:`CLOSE_GRACE_S` are
        killed with their workers, every worker stops and the pool's own temporary directory is removed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._drain("the sandbox was closed before this job ran")
            for _ in self._threads:
                self._queue.put(None)
        deadline = time.monotonic() + CLOSE_GRACE_S
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        for slot in self._slots:
            slot.interrupt()
        for t in self._threads:
            t.join(timeout=10)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _drain(self, detail: str) -> None:
        """Answer every queued job with an SE result carrying ``detail``."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            future, kind = item[0], item[1]
            if future.set_running_or_notify_cancel():
                future.set_result(RunResult(verdict=SE, detail=detail) if kind == "run"
                                  else JudgeResult(verdict=SE, detail=detail))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _count(self, future: Future) -> None:
        if not future.cancelled() and future.exception() is None and future.result().verdict == SE:
            self.stats["se"] += 1


def job_timeout(request: RunRequest | JudgeRequest) -> float:
    """Parent-side hard limit for one job: compile + every test's wall backstop + margin."""
    compile_s = max(COMPILE_LIMITS.wall_s, getattr(request, "compile_timeout_s", None) or 0.0)
    per_run = request.limits.wall_s + 2.0
    runs = 1 if isinstance(request, RunRequest) else max(1, len(request.tests)) * (
        2 if getattr(request, "checker", "") == "program" else 1)
    return compile_s * 2 + per_run * runs + 30.0


def judge_request(data: dict[str, Any]) -> JudgeRequest:
    """A JudgeRequest from a plain dict (judge_batch accepts dicts); bad fields raise ``FieldError``."""
    return parse_judge(data)


def to_dict(result: Any) -> dict[str, Any]:
    return asdict(result) if is_dataclass(result) else dict(result)


_HELLO = {
    "python": "print('hi')",
    "c": '#include <stdio.h>\nint main(){puts("hi");return 0;}',
    "cpp": '#include <iostream>\nint main(){std::cout<<"hi"<<std::endl;}',
    "javascript": "console.log('hi')",
    "bash": "echo hi",
    "java": 'public class Main{public static void main(String[] a){System.out.println("hi");}}',
    "go": 'package main\nimport "fmt"\nfunc main(){fmt.Println("hi")}',
    "rust": 'fn main(){println!("hi");}',
}

