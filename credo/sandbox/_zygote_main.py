"""The warm Python interpreter of a sandbox worker (docs/sandbox.md#warm-python-runs): runs INSIDE the sandbox.

Started once per worker by :mod:`credo.sandbox.zygote` as ``/usr/bin/python3 -I -S -B /tmp/.credo-zygote.py FD``
under the same bubblewrap command line as a cold run, without the seccomp filter and with ``CAP_SYS_ADMIN`` and
``CAP_SETPCAP`` in the sandbox's user namespace, which every run gives up before its first instruction. This
file is standard library only (the system Python runs it, not credo's).

Per run the zygote receives five descriptors on the control socket FD (spec, status, stdin, stdout, stderr),
clones P1 into fresh mount, PID, IPC and network namespaces, reports its pid and waits for it; it never reads a
run's data. P1, pid 1 of the run, reads the spec (``marshal``: argv, files, rlimits, sizes) once the worker has
put it in the run's cgroup, unshares a cgroup namespace rooted there, mounts a private ``/proc``, size-limited
tmpfs ``/work`` and ``/tmp`` with the program's files bound read-only, drops every capability (bounding and
ambient sets included), installs the seccomp filter and forks U, pid 2, which takes the run's stdio, closes every
other descriptor, sets the rlimits, starts a new session, resets the interpreter to what ``python3 -I -S -B
main.py`` has at start (modules, ``__main__``, ``sys.argv``), runs the program and exits as CPython would for
what the program made (:func:`finish`). P1 exits with U's status (128 + N for a signal, as bubblewrap reports
it), which ends the run's PID namespace. (Where ``clone``'s system call number is not known, the zygote forks C,
which unshares the namespaces and forks P1.)
"""
import sys

BASELINE = frozenset(sys.modules)  # what `python3 -I -S -B main.py` has imported when the program starts
IMPORTER_CACHE = dict(sys.path_importer_cache)

import ctypes  # noqa: E402  (after the baseline is taken)
import gc  # noqa: E402
import marshal  # noqa: E402
import posix  # noqa: E402
import _socket  # noqa: E402
import _weakref  # noqa: E402
import resource  # noqa: E402

libc = ctypes.CDLL(None, use_errno=True)
syscall = ctypes.PyDLL(None, use_errno=True).syscall  # holds the interpreter lock across the call (clone)
pythonapi = ctypes.pythonapi
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(posix.uname().machine)  # clone(flags, stack, ...): the same
SIGCHLD = 17
NEWNS, NEWPID, NEWIPC, NEWNET, NEWCGROUP = 0x20000, 0x20000000, 0x08000000, 0x40000000, 0x02000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 32, 4096, 16384, 1 << 18
MS_RDONLY = 1
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 4, 24, 47, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG = 22, 2, 38, 1
SETUP_FAILED = 125  # P1's exit code when the run could not be set up (its reason is on the status pipe)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {posix.strerror(err)}")


def mount(src, target, fstype, flags, data=None):
    check(libc.mount(src.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                     data.encode() if data else None), f"mount {target}")


def setup_fs(spec):
    """P1: private mounts, a fresh /proc of the run's PID namespace, tmpfs /work and /tmp, the files read-only."""
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['tmp_bytes']},mode=1777")
    mount("tmpfs", "/work", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['work_bytes']},mode=0777")
    for name, data in spec["files"].items():
        path = "/work/" + name
        fd = posix.open(path, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[posix.write(fd, view):]
        finally:
            posix.close(fd)
        mount(path, path, None, MS_BIND)
        mount("none", path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    posix.chdir("/work")


def confine(seccomp_program):
    """P1: give up every capability (bounding and ambient sets too), then the seccomp filter (no_new_privs is set
    by bubblewrap and again here)."""
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two CapData
    data = (CapData * 2)()
    check(libc.capget(ctypes.byref(header), data), "capget")
    data = (CapData * 2)()
    check(libc.capset(ctypes.byref(header), data), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    prog = SockFprog(len(seccomp_program) // 8, seccomp_program)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def read_all(fd):
    chunks = []
    while True:
        chunk = posix.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def status_code(status):
    """bubblewrap's convention: the exit code, or 128 + N for death by signal N."""
    return posix.WEXITSTATUS(status) if posix.WIFEXITED(status) else 128 + posix.WTERMSIG(status)


def clone_run():
    """Fork straight into the run's new mount, PID, IPC and network namespaces (``clone``, as ``os.fork`` does it
    for the interpreter: PyOS_BeforeFork / AfterFork around the system call): the child is pid 1 of the run, no
    intermediate process. None where the system call's number is not known here (then :func:`child` unshares)."""
    if SYS_CLONE is None:
        return None
    pythonapi.PyOS_BeforeFork()
    pid = syscall(SYS_CLONE, ctypes.c_ulong(NEWNS | NEWPID | NEWIPC | NEWNET | SIGCHLD), None, None, None, None)
    err = ctypes.get_errno()
    if pid == 0:
        pythonapi.PyOS_AfterFork_Child()
    else:
        pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone: {posix.strerror(err)}")
    return pid


def read_spec(spec_fd, status_fd):
    """The run's spec, once the worker has put the run in its cgroup (it writes the spec after); the run's
    cgroup namespace, rooted there."""
    try:
        spec = marshal.loads(read_all(spec_fd))
        posix.close(spec_fd)
        check(libc.unshare(NEWCGROUP), "unshare")
        return spec
    except BaseException as exc:  # noqa: BLE001 - the sandbox's failure, reported on the status pipe
        posix.write(status_fd, f"setup failed: {exc}".encode()[:1000])
        posix._exit(SETUP_FAILED)


def child(fds, cloned):
    """The run's first process; returns the spec in the program's process only. Cloned: it is pid 1 already
    (:func:`init`). Otherwise C: new namespaces (``unshare``), then P1 forked."""
    spec_fd, status_fd, stdio = fds[0], fds[1], fds[2:5]
    spec = read_spec(spec_fd, status_fd)
    if cloned:
        return init(spec, status_fd, stdio)
    try:
        check(libc.unshare(NEWNS | NEWPID | NEWIPC | NEWNET), "unshare")
        pid = posix.fork()
    except BaseException as exc:  # noqa: BLE001 - the sandbox's failure, reported on the status pipe
        posix.write(status_fd, f"setup failed: {exc}".encode()[:1000])
        posix._exit(SETUP_FAILED)
    if pid == 0:
        return init(spec, status_fd, stdio)
    for fd in (status_fd, *stdio):
        posix.close(fd)
    while True:
        try:
            _, status = posix.waitpid(pid, 0)
            posix._exit(status_code(status))
        except InterruptedError:
            continue


def init(spec, status_fd, stdio):
    """P1: pid 1 of the run. Sets up the run's view and confinement, forks the program and reaps until it exits."""
    try:
        libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
        setup_fs(spec)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program cannot open /proc/1/mem of its init
        confine(spec["seccomp"])
        posix.write(status_fd, b"ok")
        pid = posix.fork()
    except BaseException as exc:  # noqa: BLE001
        posix.write(status_fd, f"setup failed: {exc}".encode()[:1000])
        posix._exit(SETUP_FAILED)
    if pid == 0:
        program(spec, stdio)
        return spec
    for fd in (status_fd, *stdio):
        posix.close(fd)
    while True:
        try:
            reaped, status = posix.waitpid(-1, 0)
        except InterruptedError:
            continue
        if reaped == pid:
            posix._exit(status_code(status))


def program(spec, stdio):
    """U: the run's stdio and rlimits, a new session."""
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    for target, fd in enumerate(stdio):
        posix.dup2(fd, target)
    posix.closerange(3, 1 << 20)
    for which, soft, hard in spec["rlimits"]:
        resource.setrlimit(which, (soft, hard))
    posix.setsid()


def reset(argv):
    """Forget the zygote: only the modules of a fresh start, a fresh ``__main__``, the program's argv."""
    for name in [n for n in sys.modules if n not in BASELINE]:
        del sys.modules[name]
    sys.path_importer_cache.clear()
    sys.path_importer_cache.update(IMPORTER_CACHE)
    sys.argv = list(argv[4:])
    sys.orig_argv = list(argv)
    path = "/work/" + argv[4]
    main = type(sys)("__main__")
    main.__dict__.update(__package__=None, __spec__=None, __annotations__={}, __file__=path, __cached__=None,
                         __builtins__=sys.modules["builtins"],
                         __loader__=sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        source = f.read()
    return main, source, path


def exit_code_of(exc):
    """What CPython's handle_system_exit makes of a SystemExit (it prints a non-integer code)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFFFFFFFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def unraisable_args_type():
    """``sys.UnraisableHookArgs``, which Python 3.11 does not name: the type of what the hook receives."""
    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = seen.append

    class Raises:
        def __del__(self):
            raise RuntimeError

    Raises()  # freed at once: its __del__'s exception goes to the hook
    sys.unraisablehook = hook
    return type(seen[0])


UNRAISABLE_ARGS = unraisable_args_type()


def flush_std_files(report=True):
    """CPython's flush_std_files: False when a flush failed, reported as CPython reports it. ``report=False``: the
    last flush, which CPython leaves to the streams' deallocation (errors unseen, the status unchanged)."""
    ok = True
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None or getattr(stream, "closed", True):
            continue
        try:
            stream.flush()
        except BaseException as exc:  # noqa: BLE001 - CPython: PyErr_WriteUnraisable(stream), status -1
            if report:
                sys.unraisablehook(UNRAISABLE_ARGS((type(exc), exc, None, None, stream)))
                ok = False
    return ok


def clear_module(module):
    """CPython's _PyModule_ClearDict: names starting with one underscore set to None first, then the rest (not
    ``__builtins__``)."""
    d = getattr(module, "__dict__", None)
    if not isinstance(d, dict):
        return
    for first in (True, False):
        for key in list(d):
            if isinstance(key, str) and key != "__builtins__" and (
                    key.startswith("_") and not key.startswith("__")) == first:
                d[key] = None


def finish(code):
    """The program's exit, as CPython's Py_FinalizeEx runs it for what the program made: wait for its threads,
    atexit callbacks, flush; then, as finalize_modules does, the standard streams restored, ``__main__`` and the
    modules the program imported dropped from ``sys.modules`` in import order, a collection (``__del__`` of what
    they held, unclosed files flushed), what is still alive cleared newest first; a last flush and the exit, 120
    when the first flush failed. The zygote's own heap (frozen: :func:`gc.freeze`) is left alone: tearing it down
    would copy each of its pages into this process for nothing (docs/sandbox.md#warm-python-runs)."""
    if "threading" in sys.modules:
        try:
            sys.modules["threading"]._shutdown()
        except BaseException:  # noqa: BLE001
            sys.excepthook(*sys.exc_info())
    import atexit
    atexit._run_exitfuncs()
    ok = flush_std_files()
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, name, getattr(sys, f"__{name}__"))
    alive = []
    for name in [n for n in sys.modules if n == "__main__" or n not in BASELINE]:
        module = sys.modules[name]
        sys.modules[name] = None
        try:
            alive.append(_weakref.ref(module))
        except TypeError:
            pass
        del module
    gc.collect()
    for ref in reversed(alive):
        clear_module(ref())
    gc.collect()
    flush_std_files(report=False)
    posix._exit(code if ok else 120)


def serve(control_fd):
    """The zygote's loop: one fork per request; returns (in the program's process) the run's spec."""
    sock = _socket.socket(fileno=control_fd)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no process of the sandbox's uid may read this one's memory
    ready = f"Z{posix.getpid()}\n".encode()
    sock.sendall(ready)
    while True:
        msg, anc, _, _ = sock.recvmsg(16, 4 * 16)
        if not msg or msg[:1] != b"F":
            posix._exit(0)
        fds = []
        for level, kind, data in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [int.from_bytes(data[i:i + 4], sys.byteorder) for i in range(0, len(data) - 3, 4)]
        if len(fds) != 5:
            for fd in fds:
                posix.close(fd)
            sock.sendall(b"E\n")
            continue
        pid = clone_run()
        cloned = pid is not None
        if not cloned:
            pid = posix.fork()
        if pid == 0:
            sock.close()
            return fds, cloned
        for fd in fds:
            posix.close(fd)
        sock.sendall(f"P{pid}\n".encode())
        while True:
            try:
                _, status, usage = posix.wait4(pid, 0)
                break
            except InterruptedError:
                continue
        code = posix.waitstatus_to_exitcode(status)
        sock.sendall(f"X{code} {usage.ru_utime + usage.ru_stime!r} {usage.ru_maxrss}\n".encode())


if __name__ == "__main__":
    # module level on purpose: the program's <module> frame has this frame alone beneath it
    gc.freeze()  # the zygote's objects out of every collection: a run's collections do not touch their pages
    _spec = child(*serve(int(sys.argv[1])))  # returns in the program's process only
    _main, _source, _path = reset(_spec["argv"])
    del _spec
    try:
        exec(compile(_source, _path, "exec", dont_inherit=True), _main.__dict__)
        _code = 0
    except SystemExit as _exc:
        _code = exit_code_of(_exc)
    except BaseException as _exc:  # noqa: BLE001 - printed as CPython prints an uncaught exception
        _tb = _exc.__traceback__.tb_next if _exc.__traceback__ is not None else None
        sys.last_type, sys.last_value, sys.last_traceback = type(_exc), _exc, _tb
        sys.excepthook(type(_exc), _exc.with_traceback(_tb), _tb)
        del _exc, _tb
        _code = 1
    del _main, _source, _path
    finish(_code)
