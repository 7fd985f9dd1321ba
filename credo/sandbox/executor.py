"""Run one command under every isolation layer and measure it.

Layers, outermost first (each fails closed):

1. a fresh per-run cgroup (memory limit, pids limit, CPU accounting, kill-all);
2. rlimits (CPU, file size, open files, no core dumps) and an unprivileged uid/gid with no
   supplementary groups, set between fork and exec;
3. bubblewrap: new user, PID, network, IPC, UTS, mount and cgroup namespaces (no network; nested
   user namespaces disabled), a read-only root with read-only ``/usr`` and ``/etc``, a private ``/proc``
   and minimal ``/dev``, size-limited tmpfs ``/tmp`` and ``/work`` (a compile step's build directory is
   the only writable host path), a cleared environment, ``--die-with-parent``;
4. the seccomp deny-list of :mod:`credo.sandbox.seccomp`.

A watchdog outside the sandbox polls the cgroup's CPU time (TLE is judged on CPU time, summed over all
processes of the run) and the wall clock (a backstop for sleeping programs, or with ``Limits.wall_time_s`` the
limit itself, judged first), and kills the whole cgroup.
stdout and stderr are read concurrently with byte caps (exceeding one is OLE).

Rootless mode (``rootless=True``, no cgroup, no uid drop) replaces layer 1 with rlimits and the process
tree: RLIMIT_AS caps the address space (the memory limit plus the language's reservation allowance),
RLIMIT_NPROC caps the user's tasks (those running now plus the run's process limit), and the watchdog reads
CPU time and memory from ``/proc`` (:mod:`credo.sandbox.proctree`), killing the run past either limit.
Killing bwrap ends the PID namespace and every process in it.
"""
from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from credo.procs import set_parent_death_signal
from credo.sandbox import seccomp, workfiles
from credo.sandbox.cgroups import CgroupManager, RunCgroup
from credo.sandbox.isolation import find_bwrap
from credo.sandbox.limits import Limits
from credo.sandbox.proctree import ProcessTree, user_tasks

BWRAP = find_bwrap() or "/usr/bin/bwrap"  # see credo.sandbox.isolation for the search order
_POLL_S = 0.005
_SIGNAL_BASE = 128  # bwrap reports death by signal N as exit code 128 + N


@dataclass
class RawRun:
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    cpu_time_s: float = 0.0
    wall_time_s: float = 0.0
    memory_peak_bytes: int = 0
    cpu_exceeded: bool = False
    wall_exceeded: bool = False
    output_exceeded: bool = False
    oom_killed: bool = False
    setup_error: str = ""  # the sandbox could not start the program (infrastructure failure)
    notes: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # fetched files (``fetch`` of :func:`execute`)


class _CappedReader(threading.Thread):
    """Reads a pipe to EOF keeping at most ``cap`` bytes; sets ``exceeded`` when more arrive."""

    def __init__(self, pipe, cap: int, on_exceed):
        super().__init__(daemon=True)
        self.pipe, self.cap, self.on_exceed = pipe, cap, on_exceed
        self.chunks: list[bytes] = []
        self.size = 0
        self.exceeded = False

    def run(self) -> None:
        try:
            while True:
                chunk = self.pipe.read1(65536) if hasattr(self.pipe, "read1") else self.pipe.read(65536)
                if not chunk:
                    break
                if self.size < self.cap:
                    self.chunks.append(chunk[: self.cap - self.size])
                self.size += len(chunk)
                if self.size > self.cap and not self.exceeded:
                    self.exceeded = True
                    self.on_exceed()
        except (OSError, ValueError):
            pass

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


class _StdinWriter(threading.Thread):
    def __init__(self, pipe, data: bytes):
        super().__init__(daemon=True)
        self.pipe, self.data = pipe, data

    def run(self) -> None:
        try:
            self.pipe.write(self.data)
        except (BrokenPipeError, OSError, ValueError):
            pass
        finally:
            try:
                self.pipe.close()
            except OSError:
                pass


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int


def bwrap_command(argv: list[str], *, workdir: Path | None, files: dict[str, Path], work_mb: int,
                  env: dict[str, str], seccomp_fd: int | None, status_fd: int | None, bwrap: str = "",
                  extra: tuple[str, ...] = ()) -> list[str]:
    """bubblewrap argv (``bwrap`` defaults to :data:`BWRAP`). ``/work`` is the host ``workdir`` bound read-write
    (compile steps), or a size-limited tmpfs holding read-only binds of ``files`` (test runs: nothing the
    program writes reaches the host disk). The same in both modes: user, PID, network, IPC, UTS, mount and
    cgroup namespaces are what an unprivileged bwrap can create. ``extra`` options go last (the warm
    interpreter's capabilities and script, :mod:`credo.sandbox.zygote`)."""
    cmd = [bwrap or BWRAP, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
           "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        target = Path("/") / name
        if target.is_symlink():
            cmd += ["--symlink", os.readlink(target), f"/{name}"]
        elif target.is_dir():
            cmd += ["--ro-bind", str(target), f"/{name}"]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(work_mb << 20), "--tmpfs", "/tmp"]
    if workdir is not None:
        cmd += ["--bind", str(workdir), "/work"]
    else:
        cmd += ["--size", str(work_mb << 20), "--perms", "0777", "--tmpfs", "/work"]
    for name, src in files.items():
        cmd += ["--ro-bind", str(src), f"/work/{name}"]
    cmd += ["--remount-ro", "/", "--chdir", "/work", "--hostname", "sandbox", "--clearenv"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd += list(extra)
    if status_fd is not None:
        cmd += ["--json-status-fd", str(status_fd)]
    cmd += ["--", *argv]
    return cmd


BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}


def execute(argv: list[str], *, limits: Limits, stdin: bytes, identity: Identity | None,
            cgroups: CgroupManager | None, workdir: Path | None = None, files: dict[str, Path] | None = None,
            scratch: Path | None = None, work_mb: int = 64, env: dict[str, str] | None = None, isolated: bool = True,
            extra_memory_mb: int = 0, min_processes: int = 0, rootless: bool = False,
            address_space_mb: int = 1024, bwrap: str = "", inputs: dict[str, bytes] | None = None,
            fetch: tuple[str, ...] = ()) -> RawRun:
    """Run ``argv`` in ``/work`` under ``limits``.

    ``workdir`` (host directory, bound read-write) or ``files`` (name -> host path, bound read-only into a
    tmpfs ``/work``). ``isolated=False`` (unsafe mode) runs the command directly in ``workdir`` or in
    ``scratch`` with ``files`` copied in, with rlimits and the cgroup only. ``rootless=True`` (no
    ``cgroups``, no ``identity``) adds RLIMIT_AS (memory + ``address_space_mb``) and RLIMIT_NPROC.
    ``inputs`` (path -> bytes, validated paths) are written into ``/work`` before the program starts and the
    regular files named in ``fetch`` are read back after it exits (``RawRun.files``; :mod:`workfiles`);
    neither goes with ``workdir``.
    """
    files = files or {}
    if workdir is not None and (inputs or fetch):
        raise ValueError("input and fetched files need a tmpfs /work, not a host workdir")
    env = {**BASE_ENV, **(env or {}), **limits.extra_env}
    memory = (limits.memory_mb + extra_memory_mb) << 20
    processes = max(limits.processes, min_processes)
    cg = cgroups.create(memory_bytes=memory, pids=processes) if cgroups else None
    sc_r = sc_w = None
    status = list(os.pipe())  # [read end, write end]; _supervise closes and clears the write end
    pipe = list(os.pipe()) if fetch and isolated else None  # tar stream of the fetched files, same protocol
    input_fds: list[int] = []  # memfds: the input files' tar stream, the paths to fetch
    try:
        pre = Preexec.of(limits, identity, cg, address_space=memory + (address_space_mb << 20) if rootless else None,
                         processes=processes if rootless else None)
        if isolated:
            sc_r, sc_w = os.pipe()
            os.write(sc_w, seccomp.build_filter())
            os.close(sc_w)
            sc_w = None
            tar_fd = workfiles.input_fd(inputs) if inputs else None
            input_fds += [tar_fd] if tar_fd is not None else []
            names_fd = workfiles.list_fd(fetch) if pipe else None
            input_fds += [names_fd] if names_fd is not None else []
            run_argv = list(argv)
            if inputs or pipe:
                run_argv = workfiles.wrap_argv(run_argv, inputs_fd=tar_fd, fetch_fd=pipe[1] if pipe else None,
                                               list_fd=names_fd)
            cmd = bwrap_command(run_argv, workdir=workdir, files=files, work_mb=work_mb, env=env, seccomp_fd=sc_r,
                                status_fd=status[1], bwrap=bwrap)
            cwd = workdir or Path("/")
        else:
            cwd = workdir or _unsafe_dir(scratch, files, inputs or {}, identity)
            cmd, env = list(argv), {**env, "HOME": str(cwd)}
        fds = tuple(fd for fd in (sc_r, status[1], *(pipe or ())[1:], *input_fds) if fd is not None)
        raw = _supervise(cmd, workdir=cwd, limits=limits, stdin=stdin, preexec=pre, memory=memory,
                         env=env, isolated=isolated, pass_fds=fds, status=status, fetch=pipe, paths=fetch)
        if fetch and not isolated:
            raw.files = workfiles.read_host(cwd, fetch, owner=identity.uid if identity is not None else None)
        return raw
    finally:
        for fd in (sc_r, sc_w, *status, *(pipe or ()), *input_fds):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if cg is not None:
            cg.remove()


def _unsafe_dir(scratch: Path | None, files: dict[str, Path], inputs: dict[str, bytes],
                identity: Identity | None) -> Path:
    """Unsafe mode's fresh work dir: made 0700 (no other user can plant a symlink while the worker writes
    into it), filled with ``files`` and ``inputs``, then handed, with all it holds, to ``identity`` (a
    uid-dropped run writes its own files next to the program)."""
    if scratch is None:
        raise ValueError("unsafe execution of bound files needs a scratch directory")
    scratch.mkdir(mode=0o700)
    os.chmod(scratch, 0o700)
    owner = (identity.uid, identity.gid) if identity is not None else None
    for name, src in files.items():
        shutil.copy2(src, scratch / name)
        if owner is not None:
            os.chown(scratch / name, *owner, follow_symlinks=False)
    workfiles.write_host(scratch, inputs, owner)
    if owner is not None:
        os.chown(scratch, *owner)
    return scratch


@dataclass(frozen=True)
class Preexec:
    """What runs in the child between fork and exec (as the worker's user): enter the cgroup, set the rlimits,
    start a new session, drop to ``identity``. Each piece is a field, so a mode's plan can be inspected."""

    rlimits: tuple[tuple[int, int, int], ...]  # (resource, soft, hard)
    cgroup: RunCgroup | None = None
    identity: Identity | None = None

    @classmethod
    def of(cls, limits: Limits, identity: Identity | None, cg: RunCgroup | None, *, address_space: int | None = None,
           processes: int | None = None) -> "Preexec":
        """The plan for one run; ``address_space`` / ``processes`` add RLIMIT_AS / RLIMIT_NPROC (rootless mode:
        the process limit counts the user's tasks running now, which RLIMIT_NPROC includes)."""
        cpu = int(math.ceil(limits.time_s)) + 1
        fsize = limits.file_size_mb << 20
        rl = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_FSIZE, fsize, fsize),
              (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files), (resource.RLIMIT_CORE, 0, 0)]
        if address_space is not None:
            rl.append((resource.RLIMIT_AS, address_space, address_space))
        if processes is not None:
            tasks = user_tasks(os.getuid()) + processes
            rl.append((resource.RLIMIT_NPROC, tasks, tasks))
        return cls(tuple((which, *_within_hard(which, soft, hard)) for which, soft, hard in rl), cg, identity)

    def __call__(self) -> None:
        if self.cgroup is not None:
            self.cgroup.enter()
        for which, soft, hard in self.rlimits:
            resource.setrlimit(which, (soft, hard))
        os.setsid()
        if self.identity is not None:
            os.setgroups([])
            os.setgid(self.identity.gid)
            os.setuid(self.identity.uid)
        set_parent_death_signal()  # the run dies with its worker (set after the uid change, which clears it)


def _within_hard(which: int, soft: int, hard: int) -> tuple[int, int]:
    """(soft, hard) lowered to the current hard limit (an unprivileged process cannot raise it)."""
    ceiling = resource.getrlimit(which)[1]
    if ceiling == resource.RLIM_INFINITY:
        return soft, hard
    return min(soft, ceiling), min(hard, ceiling)


def _reap(proc: subprocess.Popen, block: bool):
    """``wait4`` the child: sets ``proc.returncode`` and returns the rusage of its whole (reaped) tree, or None
    while it runs."""
    if proc.returncode is not None:
        return None
    pid, status, usage = os.wait4(proc.pid, 0 if block else os.WNOHANG)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage


def _supervise(cmd, *, workdir, limits, stdin, preexec: Preexec, memory: int, env, isolated, pass_fds,
               status, fetch: list | None = None, paths: tuple[str, ...] = ()) -> RawRun:
    """Start ``cmd``, watch it to the end (limits, kill-all) and measure it; with ``fetch`` (a pipe), the
    files named in ``paths`` are read from the tar stream it carries."""
    raw = RawRun()
    kill_event = threading.Event()
    start = time.monotonic()
    cg = preexec.cgroup
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=str(workdir), env=env if not isolated else {"PATH": BASE_ENV["PATH"]},
                                pass_fds=pass_fds, preexec_fn=preexec, close_fds=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raw.setup_error = f"could not start the sandbox: {exc}"
        return raw
    acct = cg if cg is not None else ProcessTree(proc.pid, memory)  # without a cgroup: the process tree
    readers = []
    for pipe in (status, fetch):  # our copies of the write ends; bwrap holds its own
        if pipe is not None:
            os.close(pipe[1])
            pipe[1] = None
    out = _CappedReader(proc.stdout, limits.output_bytes, kill_event.set)
    err = _CappedReader(proc.stderr, limits.output_bytes, kill_event.set)
    writer = _StdinWriter(proc.stdin, stdin)
    if fetch is not None:  # a big fetched file is left out, never a reason to stop the run
        readers.append(_CappedReader(os.fdopen(fetch[0], "rb", buffering=0), workfiles.MAX_FETCH_BYTES, lambda: None))
        fetch[0] = None  # the reader's file object owns it now
    for t in (out, err, writer, *readers):
        t.start()
    usage = None
    while (usage := _reap(proc, block=False)) is None and proc.returncode is None:
        if isinstance(acct, ProcessTree):
            acct.sample()
        if limits.wall_time_s > 0 and time.monotonic() - start > limits.wall_s:
            raw.wall_exceeded = True  # a wall-clock limit (SandboxFusion's run_timeout) is judged first
        elif acct.cpu_seconds() > limits.time_s:
            raw.cpu_exceeded = True
        elif time.monotonic() - start > limits.wall_s:
            raw.wall_exceeded = True
        if raw.cpu_exceeded or raw.wall_exceeded or acct.oom_killed() or kill_event.is_set():
            _kill(proc, acct)
            break
        time.sleep(_POLL_S)
    usage = usage or _reap(proc, block=True)
    raw.wall_time_s = time.monotonic() - start
    acct.kill_all()  # anything the program left behind (daemons, setsid escapes, a PID namespace still dying)
    if cg is None:
        acct.finish(usage)
        _kill_group(proc.pid)
    for t in (out, err, *readers):
        t.join(timeout=5)
    raw.stdout, raw.stderr = out.data, err.data
    for reader in readers:
        raw.files = workfiles.read_tar(reader.data, paths, reader.exceeded)
        reader.pipe.close()
    raw.output_exceeded = out.exceeded or err.exceeded
    raw.cpu_time_s = acct.cpu_seconds()
    raw.memory_peak_bytes = acct.memory_peak()
    raw.oom_killed = acct.oom_killed()
    raw.cpu_exceeded = raw.cpu_exceeded or raw.cpu_time_s > limits.time_s
    _exit_status(raw, proc.returncode, status[0], isolated)
    return raw


def _kill(proc: subprocess.Popen, acct: RunCgroup | ProcessTree) -> None:
    acct.kill_all()
    _kill_group(proc.pid)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_status(raw: RawRun, returncode: int, status_fd: int, isolated: bool) -> None:
    if not isolated:
        if returncode < 0:
            raw.signal = -returncode
        else:
            raw.exit_code = returncode
        return
    status = _read_status(status_fd)
    if "child-pid" not in status and not (raw.cpu_exceeded or raw.wall_exceeded or raw.output_exceeded):
        raw.setup_error = "bubblewrap failed: " + raw.stderr.decode("utf-8", "replace").strip()[-300:]
        return
    code = status.get("exit-code", returncode if returncode >= 0 else _SIGNAL_BASE - returncode)
    if code > _SIGNAL_BASE and code <= _SIGNAL_BASE + 64:
        raw.signal = code - _SIGNAL_BASE
    else:
        raw.exit_code = code


def _read_status(fd: int) -> dict:
    data = b""
    try:
        os.set_blocking(fd, False)
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    except (BlockingIOError, OSError):
        pass
    out: dict = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            out.update(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
