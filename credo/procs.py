"""Child processes that die with credo: a worker calls :func:`bind_to_parent` first thing.

A worker (a verifier worker of :class:`~credo.rewards.RewardRunner`, a sandbox worker of
:class:`~credo.sandbox.Sandbox`) may be busy in a call that never returns (a hung verifier that also ignores
SIGTERM) when its parent dies by ``kill -9`` or an unhandled SIGTERM, which run no cleanup. Three layers make
sure nothing outlives the parent:

- **Own process group.** The worker leads a new process group, so everything it starts (a verifier's
  subprocesses, the sandbox's bubblewrap) is killed with it (``killpg``), never the parent's group.
- **Guardian.** A small process forked from the worker at startup (it holds none of the worker's descriptors)
  checks every ``poll_s`` seconds that the worker is alive and still the parent's child; when either is false it
  SIGKILLs the worker's whole process group (itself included). It is a separate process, so a worker stuck in C
  code that holds the GIL (a catastrophic regular expression) cannot stop it.
- **Parent-death signal.** ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill the worker the moment its
  parent dies. The kernel ties it to the parent *thread* that started the worker, so callers ask for it only
  where that thread outlives the worker. The race (the parent dying before the prctl) is closed by comparing
  ``os.getppid()`` with the expected parent pid afterwards.

Processes credo does not start itself (a private Ray instance's raylet, GCS and agents) are found by a path
instead: :func:`reap_when_gone` starts a watcher process that SIGKILLs, once the caller is gone, every process
naming that path or holding a file under it open (Ray's agents otherwise sometimes outlive a killed driver).
Processes a library starts (vLLM's in-process engine core and workers) are marked instead: before they start,
:func:`reap_descendants_when_gone` puts a token in this process's environment, which they inherit, and starts a
watcher that SIGKILLs every process carrying the token once this one is gone.

Linux only (``prctl`` and ``/proc``); elsewhere the layers that cannot be set up are skipped. A descendant that
leaves the process group on its own (``setsid``) is not covered here: the sandbox runs programs that way and
relies on bubblewrap's ``--die-with-parent`` and its per-run cgroups.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
GUARD_POLL_S = 0.5
_WATCHERS: list[subprocess.Popen] = []  # kept referenced: a watcher outlives the block that started it


def _load_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _load_prctl()  # resolved at import: a preexec_fn (between fork and exec) must not dlopen


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` for the calling process; False where it is unavailable. Safe in a
    ``preexec_fn``."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def started_from_main_thread() -> bool:
    """True in the main thread: a parent-death signal asked for from here fires only when the process dies."""
    return threading.current_thread() is threading.main_thread()


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` from ``/proc`` (None if it is gone or ``/proc`` is unavailable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[1])  # after "pid (comm) ": state, ppid, ...


def kill_group(pid: int) -> None:
    """SIGKILL ``pid`` and, if it leads a process group, the whole group; a process already gone is ignored."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def bind_to_parent(parent_pid: int, *, pdeathsig: bool = True, poll_s: float = GUARD_POLL_S) -> None:
    """Make the calling worker process (and its process group) die with ``parent_pid`` (see the module docstring).

    Call it first thing in the worker, while it has no threads (it forks the guardian). ``pdeathsig``: also
    ask the kernel for SIGKILL when the parent dies (only if the parent thread that started this worker
    outlives it).
    """
    try:
        os.setpgid(0, 0)
    except OSError:  # already a group (or session) leader
        pass
    if pdeathsig:
        set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        _kill_own_group()
    _start_guardian(parent_pid, poll_s)


def _kill_own_group() -> None:
    me = os.getpid()
    if os.getpgid(0) == me:
        os.killpg(me, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


def _start_guardian(parent_pid: int, poll_s: float) -> None:
    worker = os.getpid()
    if os.getpgid(0) != worker or parent_of(worker) != os.getppid():
        return  # not a group leader (killpg would reach the parent's group), or no /proc of this pid namespace
    if os.fork() != 0:
        return
    try:  # the guardian: never returns into the worker's code
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.closerange(3, 1 << 16)  # hold none of the worker's pipes open (the parent sees its EOF)
        _guard(worker, parent_pid, poll_s)
    finally:
        os._exit(0)


def _guard(worker: int, parent_pid: int, poll_s: float) -> None:
    """Poll until the worker exits or loses its parent, then kill the worker's process group."""
    while os.getppid() == worker and parent_of(worker) == parent_pid:
        time.sleep(poll_s)
    try:
        os.killpg(worker, signal.SIGKILL)  # the group outlives the worker while this guardian is in it
    except ProcessLookupError:
        pass


def reap_when_gone(marker: str) -> None:
    """Start a watcher (``python -m credo.procs PID MARKER``, in its own session) that SIGKILLs, once this process
    is gone, every process whose command line or open files name ``marker`` (a path, e.g. a Ray session
    directory: Ray's agents rename themselves and overwrite their environment, but keep their logs there open)."""
    _WATCHERS.append(subprocess.Popen([sys.executable, "-m", "credo.procs", str(os.getpid()), marker],
                                      stdin=subprocess.DEVNULL, start_new_session=True))


REAP_ENV = "CREDO_REAP_TOKEN"  # reap_descendants_when_gone: the variable every descendant inherits


def reap_descendants_when_gone() -> None:
    """Once per process: start a watcher that SIGKILLs, once this process is gone, every process whose environment
    carries this process's :data:`REAP_ENV` token, set here before the descendants start: processes a library
    starts for credo that outlive a ``kill -9`` of it (vLLM's in-process engine's ``EngineCore`` and ``Worker``
    processes, which would keep a GPU's memory), whatever session or group they put themselves in."""
    if os.environ.get(REAP_ENV, "").startswith(f"{os.getpid()}-"):
        return  # this process's watcher runs already
    token = f"{os.getpid()}-{os.urandom(8).hex()}"
    os.environ[REAP_ENV] = token
    _WATCHERS.append(subprocess.Popen([sys.executable, "-m", "credo.procs", str(os.getpid()),
                                       f"{REAP_ENV}={token}", "--environ"],
                                      stdin=subprocess.DEVNULL, start_new_session=True))


def holding(marker: str, *, environ: bool = False) -> list[int]:
    """Pids (other than this one) whose command line contains ``marker`` or that have a file under it open; with
    ``environ``, those whose environment holds ``marker`` (``NAME=VALUE``) instead."""
    needle, pids = marker.encode(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if environ:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    named = needle in f.read().split(b"\0")
            else:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    named = needle in f.read()
                if not named:
                    fds = f"/proc/{entry.name}/fd"
                    named = any(os.readlink(f"{fds}/{fd}").startswith(marker) for fd in os.listdir(fds))
        except OSError:  # gone, not ours to read, or a descriptor closed meanwhile
            continue
        if named:
            pids.append(int(entry.name))
    return pids


def _reap_when_gone(parent: int, marker: str, poll_s: float, environ: bool = False) -> None:
    """The watcher: wait for ``parent`` to go, then SIGKILL what :func:`holding` finds (a few rounds, for
    stragglers started meanwhile)."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    for _ in range(3):
        for pid in holding(marker, environ=environ):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(poll_s)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _reap_when_gone(int(sys.argv[1]), sys.argv[2], GUARD_POLL_S, environ="--environ" in sys.argv[3:])


_STUCK_THREADS: list[str] = []


def mark_stuck_thread(what: str) -> None:
    """A thread is blocked in native code that cannot be stopped (``ray.init`` retrying a port that is no Ray
    cluster): the process must leave through :func:`exit_now_if_stuck`, because finalizing the interpreter under
    such a thread can abort it (Ray 2.60: ``std::bad_alloc``, exit -6 instead of the error's exit code)."""
    _STUCK_THREADS.append(what)


def exit_now_if_stuck(code: int) -> None:
    """``os._exit(code)`` after flushing stdout and stderr when a thread was marked stuck; else return."""
    if not _STUCK_THREADS:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
