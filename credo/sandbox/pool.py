"""The :class:`Sandbox`: a pool of long-lived worker processes that compile, run and judge programs."""
from __future__ import annotations

import logging
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from concurrent.futures import Future
from dataclasses import asdict, is_dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from credo.sandbox import seccomp
from credo.sandbox.cgroups import CgroupError, CgroupManager
from credo.sandbox.executor import BWRAP, Identity, execute
from credo.sandbox.languages import LANGUAGES
from credo.sandbox.limits import COMPILE_LIMITS, SE, Limits
from credo.sandbox.results import JudgeRequest, JudgeResult, RunRequest, RunResult

log = logging.getLogger(__name__)


class SandboxUnavailable(RuntimeError):
    """Isolation cannot be set up on this machine (the message says which layer and how to fix it)."""


def check_isolation(uid: int) -> None:
    """Raise :class:`SandboxUnavailable` unless every isolation layer works here."""
    if not shutil.which("bwrap"):
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    if os.geteuid() != 0:
        raise SandboxUnavailable("the sandbox must run as root to drop each run to its own uid and to create "
                                 "per-run cgroups (start `credo sandbox serve` as root), or pass unsafe=True")
    if not seccomp.supported():
        raise SandboxUnavailable(f"no seccomp syscall table for this architecture ({os.uname().machine})")
    try:
        cgroups = CgroupManager()
    except (CgroupError, OSError) as exc:
        raise SandboxUnavailable(f"cannot create per-run cgroups: {exc}") from None
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        raw = execute(["/usr/bin/true"], limits=Limits(time_s=5.0), stdin=b"", identity=Identity(uid, uid),
                      cgroups=cgroups, workdir=None, files={})
    if raw.setup_error or raw.exit_code != 0:
        raise SandboxUnavailable(f"bubblewrap smoke test failed ({BWRAP}): {raw.setup_error or raw.stderr!r}")


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
            return
        kind, request = msg
        try:
            result = ctx.run(request) if kind == "run" else ctx.judge(request)
        except Exception:  # never let a bug in one job take the worker down silently
            detail = "sandbox worker error: " + traceback.format_exc(limit=3)[-800:]
            result = RunResult(verdict=SE, detail=detail) if kind == "run" else JudgeResult(verdict=SE, detail=detail)
        conn.send(result)


class _Slot:
    """One worker process and the parent-side thread that feeds it jobs."""

    def __init__(self, pool: "Sandbox", index: int):
        self.pool, self.index = pool, index
        self.proc = None
        self.conn = None

    def _start(self) -> None:
        parent, child = socket.socketpair()
        args = [sys.executable, "-m", "credo.sandbox._workerproc", str(child.fileno()), str(self.index), str(self.pool.root),
                str(self.pool.uid_base), "unsafe" if self.pool.unsafe else "isolated"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(args, pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL)
        child.close()
        self.conn = Connection(parent.detach())

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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
        if not self._alive():
            if self.proc is not None:
                self.pool.stats["worker_restarts"] += 1
                self._kill()
            self._start()
        try:
            self.conn.send((kind, request))
            if self.conn.poll(timeout):
                return self.conn.recv()
            detail = f"sandbox worker timed out after {timeout:.0f} s"
        except (EOFError, OSError) as exc:
            detail = f"sandbox worker died ({type(exc).__name__})"
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
    Thread-safe: many threads may submit at once (the HTTP service does).
    """

    def __init__(self, workers: int | None = None, *, unsafe: bool = False, root: str | Path | None = None,
                 uid_base: int = 61000):
        self.unsafe = unsafe
        self.uid_base = uid_base
        self.workers = workers or max(1, os.cpu_count() or 1)
        if unsafe:
            log.warning("credo sandbox running UNSAFE: programs run without namespaces, seccomp or a separate uid")
        else:
            check_isolation(uid_base)
        self.root = Path(root or tempfile.mkdtemp(prefix="credo-sandbox-"))
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self._own_root = root is None
        self.stats = {"jobs": 0, "worker_restarts": 0, "se": 0}
        self._queue: queue.Queue = queue.Queue()
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
        if self._closed:
            raise RuntimeError("sandbox is closed")
        future: Future = Future()
        kind = "run" if isinstance(request, RunRequest) else "judge"
        self.stats["jobs"] += 1
        future.add_done_callback(self._count)
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
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=10)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _count(self, future: Future) -> None:
        if not future.cancelled() and future.exception() is None and future.result().verdict == SE:
            self.stats["se"] += 1


def job_timeout(request: RunRequest | JudgeRequest) -> float:
    """Parent-side hard limit for one job: compile + every test's wall backstop + margin."""
    per_run = request.limits.wall_s + 2.0
    runs = 1 if isinstance(request, RunRequest) else max(1, len(request.tests)) * (
        2 if getattr(request, "checker", "") == "program" else 1)
    return COMPILE_LIMITS.wall_s * 2 + per_run * runs + 30.0


def judge_request(data: dict[str, Any]) -> JudgeRequest:
    """A JudgeRequest from a plain dict (the HTTP API and judge_batch accept dicts)."""
    data = dict(data)
    limits = data.pop("limits", None)
    if isinstance(limits, dict):
        limits = Limits(**limits)
    return JudgeRequest(limits=limits or Limits(), **data)


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

