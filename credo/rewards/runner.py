"""Score batches of responses with a verifier, never letting the verifier stop the run.

:class:`RewardRunner` has two executors:

``"process"`` (default)
    A small pool of long-lived, daemonic worker processes (``spawn`` start method, one duplex pipe
    each). Items are dispatched one at a time per worker; an item that runs past ``timeout_s`` gets
    its worker killed and replaced, and a worker that dies (``os._exit``, segfault) is replaced
    too. The affected item gets a failed result; the rest of the batch is scored normally. Each worker
    leads its own process group and dies with the process that started it, even by ``kill -9`` and while a
    verifier hangs ignoring SIGTERM, taking what the verifier started with it (:mod:`credo.procs`).

``"inline"``
    The verifier runs in the calling process. Exceptions are caught the same way, but a hang
    **cannot be interrupted** in this mode: there is no timeout enforcement, only the elapsed time
    recorded in ``info["time_s"]``. Meant for tests, debugging and trivially cheap verifiers.

``"auto"``
    ``"inline"`` for a verifier registered ``inline_safe`` (credo's bounded string checks such as
    ``exact_match`` and ``number``), ``"process"`` for everything else. A round trip to a worker costs more
    than such a check, and on a small machine the workers' wake-ups take cores from generation.

A verifier exception yields ``RewardResult(score=failure_score, failed=True,
error="ExcType: message")``; a timeout yields ``error="timeout after Xs"``; a dead worker yields
``error="worker died"``. A score that is not a finite real number (NaN, +-inf, None, from any executor or a batch
verifier) yields ``error="non-finite score: nan"`` (:data:`NONFINITE`, counted as ``reward/nonfinite``), so no
such score reaches advantages or statistics. Every result's ``info`` gets ``"time_s"``.

Neither this module nor the worker processes import torch.
"""
from __future__ import annotations

import atexit
import dataclasses
import importlib
import math
import multiprocessing
import numbers
import os
import signal
import sys
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Literal, Optional, Sequence

from credo.procs import bind_to_parent, kill_group, started_from_main_thread
from credo.rewards.registry import VerifierFn, get_reward_fn, to_result
from credo.types import Example, RewardResult

Executor = Literal["process", "inline", "auto"]
_ERROR_MAX_CHARS = 300
NONFINITE = "non-finite score"  # error prefix of a result whose score was NaN, +-inf, None or not a number


# ------------------------------------------------------------------------- shared by both executors


def _format_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_ERROR_MAX_CHARS]


def _with_time(result: RewardResult, seconds: float) -> RewardResult:
    return dataclasses.replace(result, info={**result.info, "time_s": seconds})


def finite_result(result: RewardResult, failure_score: float) -> RewardResult:
    """``result`` with a float score, or, when its score is not a finite real number (NaN, +-inf, None, a string),
    a failed result with ``failure_score`` and ``error="non-finite score: <value>"`` (``info`` kept)."""
    score = result.score
    if isinstance(score, numbers.Real) and math.isfinite(score):
        return result if type(score) is float else dataclasses.replace(result, score=float(score))
    return RewardResult(score=failure_score, failed=True, error=f"{NONFINITE}: {score!r}"[:_ERROR_MAX_CHARS],
                        info=result.info)


def _to_checked(value: Any, failure_score: float) -> RewardResult:
    """:func:`to_result` of a verifier's return value, with None and non-finite scores as failures."""
    if value is None:
        return RewardResult(score=failure_score, failed=True, error=f"{NONFINITE}: None")
    return finite_result(to_result(value), failure_score)


def _call_verifier(
    fn: VerifierFn, response: str, example: Example, fn_kwargs: dict[str, Any], failure_score: float
) -> tuple[RewardResult, bool]:
    """Run one verifier call; returns ``(result with time_s, raised)``. Never raises (bar Ctrl-C)."""
    start = time.perf_counter()
    try:
        result, raised = _to_checked(fn(response, example, **fn_kwargs), failure_score), False
    except (Exception, SystemExit) as exc:  # SystemExit: a verifier calling sys.exit() is a failure
        result = RewardResult(score=failure_score, failed=True, error=_format_error(exc))
        raised = True
    return _with_time(result, time.perf_counter() - start), raised


# ------------------------------------------------------------------------------------ worker side


@dataclass(frozen=True)
class _WorkerSpec:
    """Everything a worker process needs to find and call the verifier."""

    name: str  # registered name or "package.module:function"
    module: str  # module defining the function, imported first so its registration runs
    fn_kwargs: dict[str, Any]
    failure_score: float
    sys_path: list[str] = field(default_factory=list)


def _resolve_in_worker(spec: _WorkerSpec) -> VerifierFn:
    """Recreate the parent's import context and look the verifier up by name."""
    sys.path[:0] = [p for p in spec.sys_path if p not in sys.path]
    if ":" not in spec.name and spec.module not in sys.modules and spec.module != "__main__":
        importlib.import_module(spec.module)
    fn = get_reward_fn(spec.name)
    warmup = getattr(fn, "warmup", None)
    if callable(warmup):
        warmup()
    return fn


def _send_result(conn: Connection, index: int, result: RewardResult, failure_score: float) -> None:
    """Send a result; one that cannot be pickled is replaced by a failed result.

    ``Connection.send`` pickles before writing, so a pickling error leaves the pipe intact.
    """
    try:
        conn.send(("result", index, result))
    except (OSError, EOFError):
        raise
    except Exception as exc:  # e.g. an unpicklable object in info
        failed = RewardResult(score=failure_score, failed=True, error=_format_error(exc))
        conn.send(("result", index, _with_time(failed, result.info.get("time_s", 0.0))))


def _worker_main(conn: Connection, spec: _WorkerSpec, parent_pid: int, pdeathsig: bool) -> None:
    """Worker loop: report ready, then receive ``(index, response, example)`` and send results.

    ``None`` (or a closed pipe) ends the loop. Ctrl-C is ignored: the parent cleans up. The worker and whatever
    the verifier starts die with ``parent_pid`` (:func:`credo.procs.bind_to_parent`).
    """
    bind_to_parent(parent_pid, pdeathsig=pdeathsig)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fn = _resolve_in_worker(spec)
    except BaseException as exc:  # report any startup problem to the parent
        conn.send(("ready", _format_error(exc)))
        return
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
            if msg is None:
                return
            index, response, example = msg
            result, _ = _call_verifier(fn, response, example, spec.fn_kwargs, spec.failure_score)
            _send_result(conn, index, result, spec.failure_score)
        except (EOFError, OSError):  # the parent went away
            return


# ------------------------------------------------------------------------------------ parent side


class _Worker:
    """Parent-side handle of one worker process."""

    def __init__(self, ctx: Any, spec: _WorkerSpec, startup_timeout_s: float) -> None:
        self.conn, child_conn = ctx.Pipe(duplex=True)
        # the kernel's parent-death signal follows the starting thread: only the main thread outlives the worker
        args = (child_conn, spec, os.getpid(), started_from_main_thread())
        self.proc = ctx.Process(target=_worker_main, args=args, daemon=True, name="credo-reward-worker")
        self.proc.start()
        child_conn.close()  # the child holds the only other end: its death means EOF here
        self.ready = False
        self.deadline = time.monotonic() + startup_timeout_s
        self.task: Optional[int] = None  # index of the item in flight
        self.started_at = 0.0

    @property
    def idle(self) -> bool:
        return self.ready and self.task is None

    def dispatch(self, index: int, response: str, example: Example, timeout_s: float) -> None:
        self.task, self.started_at = index, time.monotonic()
        self.deadline = self.started_at + timeout_s
        try:
            self.conn.send((index, response, example))
        except OSError:  # the process died while idle; its sentinel reports it as "worker died"
            pass

    def kill(self) -> None:
        """Stop the process: terminate, then SIGKILL its process group (what the verifier started goes with it,
        a verifier ignoring SIGTERM too); always joins and closes the pipe."""
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(1.0)
        if self.proc.is_alive() and self.proc.pid is not None:
            kill_group(self.proc.pid)
        self.proc.join(1.0)
        self.conn.close()

    def shutdown(self) -> None:
        """Ask an idle worker to exit, falling back to :meth:`kill`."""
        if self.idle:
            try:
                self.conn.send(None)
                self.proc.join(0.5)
            except (OSError, EOFError):
                pass
        self.kill()


_LIVE_RUNNERS: "weakref.WeakSet[RewardRunner]" = weakref.WeakSet()


@atexit.register
def _close_all_runners() -> None:
    for runner in list(_LIVE_RUNNERS):
        runner.close()


class RewardRunner:
    """Scores batches with one verifier; verifier errors, hangs and crashes become failed results.

    Args:
        name_or_path: a registered verifier name or ``"package.module:function"``. Resolved at
            construction, so an unknown name raises ``KeyError`` immediately.
        fn_kwargs: extra keyword arguments for every call (must be picklable for ``"process"``).
        timeout_s: per-item limit (``"process"`` only; ``"inline"`` cannot interrupt a call).
        failure_score: score given to failed items.
        workers: number of worker processes (``"process"``); started lazily by the first
            :meth:`score`.
        executor: ``"process"``, ``"inline"`` or ``"auto"`` (see the module docstring).
        startup_timeout_s: how long a worker may take to import and resolve the verifier.

    Not thread-safe: call :meth:`score` from one thread at a time.
    """

    def __init__(
        self,
        name_or_path: str,
        *,
        fn_kwargs: Optional[dict[str, Any]] = None,
        timeout_s: float = 5.0,
        failure_score: float = 0.0,
        workers: int = 2,
        executor: Executor = "process",
        startup_timeout_s: float = 60.0,
    ) -> None:
        if executor not in ("process", "inline", "auto"):
            raise ValueError(f"executor must be 'process', 'inline' or 'auto', got {executor!r}")
        if workers < 1 or timeout_s <= 0:
            raise ValueError("workers must be >= 1 and timeout_s > 0")
        if not math.isfinite(failure_score):
            raise ValueError(f"failure_score must be a finite number, got {failure_score!r}")
        self._workers: list[_Worker] = []
        self._closed = False
        self._owner_pid = os.getpid()
        self.fn = get_reward_fn(name_or_path)
        self.name = name_or_path
        self.fn_kwargs = dict(fn_kwargs or {})
        self.timeout_s = float(timeout_s)
        self.failure_score = float(failure_score)
        self.num_workers = workers
        if executor == "auto":
            executor = "inline" if getattr(self.fn, "credo_inline_safe", False) else "process"
        self.executor = executor
        self.startup_timeout_s = startup_timeout_s
        self.stats = {"calls": 0, "failures": 0, "timeouts": 0, "exceptions": 0, "worker_restarts": 0}
        _LIVE_RUNNERS.add(self)

    # ------------------------------------------------------------------------------- public API

    def score(self, responses: Sequence[str], examples: Sequence[Example]) -> list[RewardResult]:
        """Score ``responses[i]`` against ``examples[i]``; returns results in the same order."""
        if len(responses) != len(examples):
            raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
        if self._closed:
            raise RuntimeError("RewardRunner is closed")
        if getattr(self.fn, "credo_batch", False):
            return self._score_batch(list(responses), list(examples))
        if self.executor == "inline":
            return [self._score_inline(r, e) for r, e in zip(responses, examples)]
        return self._score_processes(list(responses), list(examples))

    def close(self) -> None:
        """Stop all worker processes. Idempotent; a forked copy of the runner leaves them alone."""
        self._closed = True
        self._stop_workers()

    def _stop_workers(self) -> None:
        workers, self._workers = getattr(self, "_workers", []), []
        if getattr(self, "_owner_pid", None) != os.getpid():
            return  # a forked copy: the workers belong to the parent
        for worker in workers:
            worker.shutdown()

    def __enter__(self) -> "RewardRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ---------------------------------------------------------------------------- bookkeeping

    def _record(self, result: RewardResult, *, raised: bool = False, timed_out: bool = False) -> RewardResult:
        """Count a result on its way back; a non-finite score becomes a failure here, whatever the executor."""
        result = finite_result(result, self.failure_score)
        self.stats["calls"] += 1
        self.stats["failures"] += int(result.failed)
        self.stats["exceptions"] += int(raised)
        self.stats["timeouts"] += int(timed_out)
        return result

    def _failure(self, error: str, seconds: float) -> RewardResult:
        return RewardResult(score=self.failure_score, failed=True, error=error, info={"time_s": seconds})

    # --------------------------------------------------------------------------------- inline

    def _score_inline(self, response: str, example: Example) -> RewardResult:
        result, raised = _call_verifier(self.fn, response, example, self.fn_kwargs, self.failure_score)
        return self._record(result, raised=raised)

    # ---------------------------------------------------------------------------------- batch

    def _score_batch(self, responses: list[str], examples: list[Example]) -> list[RewardResult]:
        """A batch verifier (it isolates and times its own work); an exception fails the whole batch."""
        start = time.perf_counter()
        try:
            results = [_to_checked(r, self.failure_score) for r in self.fn(responses, examples, **self.fn_kwargs)]
            results = [dataclasses.replace(r, score=self.failure_score) if r.failed else r for r in results]
            if len(results) != len(responses):
                raise ValueError(f"batch verifier returned {len(results)} results for {len(responses)} responses")
        except Exception as exc:  # the run goes on; every item is a recorded failure
            results = [self._failure(_format_error(exc), time.perf_counter() - start) for _ in responses]
            self.stats["exceptions"] += len(responses)
        return [self._record(r) for r in results]

    # -------------------------------------------------------------------------------- process

    def _spec(self) -> _WorkerSpec:
        module = "" if ":" in self.name else getattr(self.fn, "__module__", None) or ""
        return _WorkerSpec(self.name, module, self.fn_kwargs, self.failure_score, list(sys.path))

    def _start_worker(self) -> _Worker:
        ctx = multiprocessing.get_context("spawn")
        return _Worker(ctx, self._spec(), self.startup_timeout_s)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = self._start_worker()
        self.stats["worker_restarts"] += 1

    def _score_processes(self, responses: list[str], examples: list[Example]) -> list[RewardResult]:
        while len(self._workers) < self.num_workers:
            self._workers.append(self._start_worker())
        results: list[Optional[RewardResult]] = [None] * len(responses)
        pending = list(range(len(responses)))[::-1]  # a stack: pop() yields items in order
        try:
            while pending or any(w.task is not None for w in self._workers):
                for worker in self._workers:
                    if worker.idle and pending:
                        i = pending.pop()
                        worker.dispatch(i, responses[i], examples[i], self.timeout_s)
                self._wait_and_collect(results)
        except BaseException:  # e.g. Ctrl-C: drop workers with items in flight; the next call restarts
            self._stop_workers()
            raise
        return results  # type: ignore[return-value]

    def _wait_and_collect(self, results: list[Optional[RewardResult]]) -> None:
        """Wait for the next message or deadline; store results, replace dead or late workers."""
        active = [w for w in self._workers if not w.ready or w.task is not None]
        timeout = max(0.0, min(w.deadline for w in active) - time.monotonic())
        handles = {w.conn: w for w in active} | {w.proc.sentinel: w for w in active}
        ready = {id(handles[h]) for h in wait(list(handles), timeout)}
        for worker in active:
            if id(worker) in ready:
                self._receive(worker, results)
            elif time.monotonic() >= worker.deadline:
                self._expire(worker, results)

    def _receive(self, worker: _Worker, results: list[Optional[RewardResult]]) -> None:
        """Read one message from a worker whose pipe or process sentinel became ready."""
        try:
            if not worker.conn.poll():  # only the sentinel fired: the process exited
                raise EOFError
            message = worker.conn.recv()
        except (EOFError, OSError):
            if not worker.ready:
                self._startup_failed(worker, "worker exited during startup (see its stderr; a "
                                     "script starting workers needs an `if __name__ == '__main__':` guard)")
            self._finish_failed(worker, results, "worker died")
            return
        if message[0] == "ready":
            if message[1] is not None:
                self._startup_failed(worker, message[1])
            worker.ready = True
            return
        _, index, result = message
        results[index] = self._record(result, raised=result.failed)
        worker.task = None

    def _expire(self, worker: _Worker, results: list[Optional[RewardResult]]) -> None:
        """A worker passed its deadline: fail its item (or the startup) and replace it."""
        if not worker.ready:
            self._startup_failed(worker, f"worker not ready after {self.startup_timeout_s}s")
        self._finish_failed(worker, results, f"timeout after {self.timeout_s}s", timed_out=True)

    def _finish_failed(
        self, worker: _Worker, results: list[Optional[RewardResult]], error: str, timed_out: bool = False
    ) -> None:
        index = worker.task
        elapsed = time.monotonic() - worker.started_at
        self._replace(worker)
        if index is not None:
            results[index] = self._record(self._failure(error, elapsed), timed_out=timed_out)

    def _startup_failed(self, worker: _Worker, reason: str) -> None:
        """A worker could not load the verifier: a configuration error, so stop with a clear message.

        All workers are stopped; a later :meth:`score` starts fresh ones.
        """
        self._stop_workers()
        raise RuntimeError(f"reward worker for {self.name!r} failed to start: {reason}")
