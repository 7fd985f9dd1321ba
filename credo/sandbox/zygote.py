"""Warm Python runs: one started interpreter per worker, inside the sandbox, forked per run (docs/sandbox.md#warm-python-runs).

A cold run starts bubblewrap and then ``python3 -I -S -B main.py`` for every program. A warm run asks the worker's
zygote, an interpreter started once under the same bubblewrap command line (:mod:`credo.sandbox._zygote_main`),
to fork: the fork gets fresh mount, PID, IPC, network and cgroup namespaces, its own ``/proc``, tmpfs ``/work``
and ``/tmp``, the run's rlimits, no capabilities and the seccomp filter before the program's first instruction,
and the host side watches it exactly as :func:`credo.sandbox.executor.execute` watches a cold run (the same
per-run cgroup in root mode, the same process-tree watchdog in rootless mode, the same byte caps and kill-all).

:meth:`Zygote.accepts` says which runs go warm: Python programs run as ``python3 -I -S -B FILE`` with no input
or fetched files and no extra environment; every other run takes the cold path. A zygote that died is started
again before the next run; a run during which it died is an SE (never the program's verdict).
"""
from __future__ import annotations

import marshal
import os
import select
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from credo.sandbox import seccomp, workfiles
from credo.sandbox.cgroups import CgroupManager
from credo.sandbox.executor import (
    _POLL_S,
    _SIGNAL_BASE,
    BASE_ENV,
    Identity,
    Preexec,
    RawRun,
    _CappedReader,
    _StdinWriter,
    bwrap_command,
)
from credo.sandbox.limits import Limits
from credo.sandbox.proctree import ProcessTree, children, descendants

PYTHON = ("/usr/bin/python3", "-I", "-S", "-B")  # the cold command line a warm run stands in for
SCRIPT = "/tmp/.credo-zygote.py"  # inside the zygote's own /tmp, which every run's fresh /tmp hides
SOURCE = Path(__file__).with_name("_zygote_main.py")
CAPS = ("--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP")  # in the sandbox's user namespace only
SETUP_FAILED = 125
START_TIMEOUT_S = 20.0
WARM_ENV = "CREDO_SANDBOX_WARM"


def warm_default() -> bool:
    """``$CREDO_SANDBOX_WARM`` (1/true/yes/on turn warm runs on); off by default (docs/sandbox.md#warm-python-runs
    says why)."""
    return os.environ.get(WARM_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


class ZygoteError(RuntimeError):
    """The zygote could not be started or stopped answering (an infrastructure failure: SE)."""


class Zygote:
    """The warm interpreter of one worker: started on first use, restarted when it died."""

    def __init__(self, *, identity: Identity | None, cgroups: CgroupManager | None, rootless: bool, bwrap: str = ""):
        self.identity, self.cgroups, self.rootless, self.bwrap = identity, cgroups, rootless, bwrap
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.host_pid = self.depth = 0
        self._buffer = b""
        self.starts = 0
        self.runs = 0

    # ------------------------------------------------------------------------------ which runs
    @staticmethod
    def accepts(argv, files: dict[str, Path], *, inputs, fetch, limits: Limits, env: dict[str, str]) -> bool:
        """Whether a run is the same warm as cold: ``python3 -I -S -B FILE`` with FILE among ``files``, no input or
        fetched files, no environment beyond the language's (the zygote's own)."""
        argv = tuple(argv)
        return (argv[:4] == PYTHON and len(argv) >= 5 and argv[4] in files and not inputs and not fetch
                and not limits.extra_env and not env and all("/" not in name for name in files))

    # ------------------------------------------------------------------------------ lifetime
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.close()
        parent, child = socket.socketpair()
        script = workfiles._memfd("credo-zygote", SOURCE.read_bytes())
        try:
            argv = [*PYTHON, SCRIPT, str(child.fileno())]
            cmd = bwrap_command(argv, workdir=None, files={}, work_mb=1, env=dict(BASE_ENV), seccomp_fd=None,
                                status_fd=None, bwrap=self.bwrap, extra=(*CAPS, "--file", str(script), SCRIPT))
            pre = Preexec(((__import__("resource").RLIMIT_CORE, 0, 0),), None, self.identity)
            # stdio are pipes, as a run's are: the interpreter's sys.stdin/stdout/stderr are made once, here
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env={"PATH": BASE_ENV["PATH"]}, pass_fds=(child.fileno(), script),
                                         preexec_fn=pre, close_fds=True, cwd="/")
        finally:
            child.close()
            os.close(script)
        self.sock = parent
        self.starts += 1
        line = self._line(START_TIMEOUT_S)
        if not line.startswith(b"Z"):
            err = self._stderr()
            self.close()
            raise ZygoteError(f"the warm interpreter did not start: {err or line!r}")
        self.host_pid = _host_pid(descendants(self.proc.pid), int(line[1:]))
        self.depth = len(_nspids(self.host_pid))  # a run's pid as the zygote sees it: that field of its NSpid

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                pipe.close()
        if self.sock is not None:
            self.sock.close()
        self.proc = self.sock = None
        self._buffer = b""

    def _stderr(self) -> str:
        try:
            os.set_blocking(self.proc.stderr.fileno(), False)
            return (self.proc.stderr.read() or b"").decode("utf-8", "replace").strip()[-500:]
        except (OSError, ValueError, TypeError):
            return ""

    def _line(self, timeout: float) -> bytes:
        """The next line from the zygote (without the newline); b"" on EOF or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return b""
            chunk = self.sock.recv(4096)
            if not chunk:
                return b""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    # ------------------------------------------------------------------------------ one run
    def run(self, argv, files: dict[str, Path], *, stdin: bytes, limits: Limits, work_mb: int, memory: int,
            processes: int, address_space: int | None) -> RawRun:
        """Run ``argv`` warm (:meth:`accepts` said yes); the same RawRun a cold run would give."""
        if not self.alive():
            try:
                self.start()
            except (OSError, ZygoteError, subprocess.SubprocessError) as exc:
                return RawRun(setup_error=f"could not start the warm interpreter: {exc}")
        cg = self.cgroups.create(memory_bytes=memory, pids=processes) if self.cgroups else None
        try:
            pre = Preexec.of(limits, self.identity, cg, address_space=address_space,
                             processes=processes if self.rootless else None)
            spec = {"argv": list(argv), "files": {name: Path(p).read_bytes() for name, p in files.items()},
                    "rlimits": [list(r) for r in pre.rlimits], "work_bytes": work_mb << 20,
                    "tmp_bytes": work_mb << 20, "seccomp": seccomp.build_filter()}
            self.runs += 1
            return self._supervise(marshal.dumps(spec), stdin, limits, memory, cg)
        finally:
            if cg is not None:
                cg.remove()

    def _supervise(self, spec: bytes, stdin: bytes, limits: Limits, memory: int, cg) -> RawRun:
        raw = RawRun()
        pipes = [os.pipe() for _ in range(5)]  # spec, status, stdin, stdout, stderr
        theirs = [pipes[0][0], pipes[1][1], pipes[2][0], pipes[3][1], pipes[4][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][1], pipes[3][0], pipes[4][0]]
        start = time.monotonic()
        try:
            socket.send_fds(self.sock, [b"F"], theirs)
        except OSError as exc:
            for fd in theirs + ours:
                os.close(fd)
            self.close()
            raw.setup_error = f"the warm interpreter is gone: {exc}"
            return raw
        for fd in theirs:
            os.close(fd)
        spec_w, status_r = ours[0], ours[1]
        kill_event = threading.Event()
        out = _CappedReader(os.fdopen(ours[3], "rb", buffering=0), limits.output_bytes, kill_event.set)
        err = _CappedReader(os.fdopen(ours[4], "rb", buffering=0), limits.output_bytes, kill_event.set)
        writer = _StdinWriter(os.fdopen(ours[2], "wb", buffering=0), stdin)
        try:
            acct, exit_line = self._begin(spec_w, spec, cg, memory)
        except (OSError, ZygoteError, ValueError) as exc:
            self.close()
            for fd in (spec_w, status_r):
                _close(fd)
            for f in (out.pipe, err.pipe, writer.pipe):
                f.close()
            raw.setup_error = f"warm run could not start: {exc}"
            return raw
        for t in (out, err, writer):
            t.start()
        if exit_line is None:
            exit_line = self._watch(raw, acct, limits, start, kill_event)
        raw.wall_time_s = time.monotonic() - start
        acct.kill_all()  # whatever the run left behind
        for t in (out, err):
            t.join(timeout=5)
        raw.stdout, raw.stderr = out.data, err.data
        for f in (out.pipe, err.pipe):
            f.close()
        raw.output_exceeded = out.exceeded or err.exceeded
        if isinstance(acct, ProcessTree) and exit_line:
            parts = exit_line[1:].split()
            acct.finish(SimpleNamespace(ru_utime=float(parts[1]), ru_stime=0.0, ru_maxrss=int(parts[2])))
        raw.cpu_time_s = acct.cpu_seconds()
        raw.memory_peak_bytes = acct.memory_peak()
        raw.oom_killed = acct.oom_killed()
        raw.cpu_exceeded = raw.cpu_exceeded or raw.cpu_time_s > limits.time_s
        status = _drain(status_r)
        _close(status_r)
        _exit_status(raw, exit_line, status)
        if not exit_line:
            self.close()  # it stopped answering: start afresh next time
        return raw

    def _begin(self, spec_w: int, spec: bytes, cg, memory: int):
        """Learn the run's first process, put it in the run's cgroup, hand it the spec (its signal to go on)."""
        line = self._line(START_TIMEOUT_S)
        if not line.startswith(b"P"):
            raise ZygoteError(f"unexpected answer {line[:80]!r}")
        pid = _host_pid(children(self.host_pid) or descendants(self.host_pid)[1:], int(line[1:]), self.depth)
        if cg is not None:
            cg.add(pid)
        acct = cg if cg is not None else ProcessTree(pid, memory)
        try:
            view = memoryview(spec)
            while view:
                view = view[os.write(spec_w, view):]
        except BrokenPipeError:
            pass  # the run's first process died already: its exit status says why
        finally:
            os.close(spec_w)
        return acct, None

    def _watch(self, raw: RawRun, acct, limits: Limits, start: float, kill_event: threading.Event) -> bytes:
        """Poll the limits until the zygote reports the run's end (b"" if it never does)."""
        killed_at = None
        while True:
            ready = b"\n" in self._buffer or select.select([self.sock], [], [], _POLL_S)[0]
            if ready:
                line = self._line(5.0)
                return line if line.startswith(b"X") else b""
            if killed_at is not None:
                if time.monotonic() - killed_at > 10.0:
                    return b""
                acct.kill_all(timeout=0.1)
                continue
            if isinstance(acct, ProcessTree):
                acct.sample()
            now = time.monotonic() - start
            if limits.wall_time_s > 0 and now > limits.wall_s:
                raw.wall_exceeded = True
            elif acct.cpu_seconds() > limits.time_s:
                raw.cpu_exceeded = True
            elif now > limits.wall_s:
                raw.wall_exceeded = True
            if raw.cpu_exceeded or raw.wall_exceeded or acct.oom_killed() or kill_event.is_set():
                acct.kill_all()
                killed_at = time.monotonic()


def _exit_status(raw: RawRun, exit_line: bytes, status: bytes) -> None:
    """The exit code or signal, as bubblewrap reports them for a cold run; SE when setup failed."""
    exceeded = raw.cpu_exceeded or raw.wall_exceeded or raw.output_exceeded or raw.oom_killed
    if not exit_line:
        raw.setup_error = "the warm interpreter stopped answering during the run"
        return
    code = int(exit_line[1:].split()[0])
    if b"ok" not in status[:2] and not exceeded:
        raw.setup_error = "warm run setup failed: " + status.decode("utf-8", "replace")[-300:]
        return
    if code < 0:  # the run's first process was killed (by the watchdog)
        raw.signal = -code
    elif _SIGNAL_BASE < code <= _SIGNAL_BASE + 64:
        raw.signal = code - _SIGNAL_BASE
    else:
        raw.exit_code = code


def _nspids(pid: int) -> list[int]:
    """The NSpid field of ``pid``: its pid in each PID namespace, from the host's down to its own."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(f) for f in line.split()[1:]]
    return []


def _host_pid(candidates, ns_pid: int, depth: int = 0) -> int:
    """The host pid of the process whose pid is ``ns_pid`` in the ``depth``-th PID namespace of its NSpid (0: the
    last, its own)."""
    for pid in candidates:
        try:
            pids = _nspids(pid)
            if len(pids) >= max(depth, 1) and pids[depth - 1 if depth else -1] == ns_pid:
                return pid
        except (OSError, ValueError):
            continue
    raise ZygoteError(f"no process of the warm interpreter has pid {ns_pid} in its namespace")


def _drain(fd: int) -> bytes:
    data = b""
    try:
        os.set_blocking(fd, False)
        while chunk := os.read(fd, 65536):
            data += chunk
    except (BlockingIOError, OSError):
        pass
    return data


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
