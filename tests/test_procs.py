"""Issue 17 items 8 and 13: no credo child process outlives its parent (verifier workers, what a verifier starts,
sandbox workers, Ray actors), and Ray connections are bounded and stay on 127.0.0.1.

Processes are killed by ``kill -9`` / SIGTERM of a real parent process (a small driver script or ``credo train``)
while a verifier hangs ignoring SIGTERM; every check waits a bounded time. Traffic goes only to 127.0.0.1.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.sandbox_util import ONE_POOL_AT_A_TIME

REPO = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 20.0  # the guardian polls every 0.5 s; the margin is for a loaded machine


# ----------------------------------------------------------------------------------- the hanging verifier


def hang_forever(response: str, example, pid_dir: str = "", **_) -> float:
    """A verifier that ignores SIGTERM, starts a child process, writes ``"WORKER_PID CHILD_PID PARENT_PID"`` to
    PID_DIR/<pid>.pids and sleeps (600 s, far past every test's wait)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    tmp = Path(pid_dir) / f"{os.getpid()}.tmp"
    tmp.write_text(f"{os.getpid()} {child.pid} {os.getppid()}")
    tmp.rename(tmp.with_suffix(".pids"))
    time.sleep(600)
    return 1.0


# --------------------------------------------------------------------------------------------- helpers


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan's zombie may wait for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def _group(pgid: int) -> list[int]:
    """Live pids of process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != b"Z":
                out.append(int(entry.name))
    return out


def _with_marker(marker: str, where: str = "cmdline") -> list[int]:
    """Live pids whose command line (or ``where="environ"``: initial environment) contains ``marker``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / where).read_bytes():
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def _using(path: str) -> list[int]:
    """Live pids whose command line names ``path`` or that hold a file under it open (Ray's agents rename
    themselves and overwrite their environment, but keep their logs open)."""
    out = set(_with_marker(path))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if any(os.readlink(fd).startswith(path) for fd in (entry / "fd").iterdir()):
                    out.add(int(entry.name))
            except OSError:
                pass
    return sorted(p for p in out if _alive(p))


def _in_dir(root: str) -> list[int]:
    """Live pids whose working directory is under ``root``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd").startswith(root + "/") and _alive(int(entry.name)):
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def _wait_for(predicate, timeout: float, what: str, driver: subprocess.Popen | None = None):
    """Poll ``predicate`` (bounded) until it returns something truthy; that value. A ``driver`` that exits first
    fails the wait at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver is not None and driver.poll() is not None:
            raise AssertionError(f"the driver exited ({driver.returncode}) before {what}")
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _assert_all_gone(pids: list[int], timeout: float = GONE_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.2)
    left = [p for p in pids if _alive(p)]
    names = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:80].replace(b"\0", b" ").decode(errors="replace")
             for p in left if Path(f"/proc/{p}").exists()}
    for pid in left:  # clean up before failing, so a failure leaves nothing behind either
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"still running {timeout:.0f} s after their parent died: {names}"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _read_pids(pid_dir: Path, driver: subprocess.Popen | None = None) -> list[int]:
    files = _wait_for(lambda: sorted(pid_dir.glob("*.pids")), 120, "the verifier to start", driver)
    return [int(x) for x in files[0].read_text().split()]


def _kill(proc: subprocess.Popen, sig: int) -> None:
    proc.send_signal(sig)
    proc.wait(timeout=30)


# ------------------------------------------------------------------------- item 8: verifier workers


RUNNER_DRIVER = """
import sys, threading
from credo.rewards import RewardRunner
from credo.types import Example
runner = RewardRunner("tests.test_procs:hang_forever", fn_kwargs={{"pid_dir": {pid_dir!r}}},
                      timeout_s=600, workers=1, executor="process")
score = lambda: runner.score(["x"], [Example("p", "a")])
if {in_thread}:  # started from a thread: no parent-death signal, the guardian alone must do it
    t = threading.Thread(target=score, daemon=True); t.start(); t.join(600)
else:
    score()
"""


@pytest.mark.parametrize("sig,in_thread", [(signal.SIGKILL, False), (signal.SIGTERM, False),
                                           (signal.SIGKILL, True)], ids=["kill9", "sigterm", "kill9-thread"])
def test_hung_verifier_worker_and_its_child_die_with_the_parent(tmp_path, sig, in_thread):
    """A verifier that ignores SIGTERM and started a child hangs in a worker; the runner's process is killed:
    the worker, the verifier's child and the worker's guardian are all gone within a bounded time."""
    code = RUNNER_DRIVER.format(pid_dir=str(tmp_path), in_thread=in_thread)
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=_env())
    try:
        worker, child, parent = _read_pids(tmp_path, driver)
        members = _group(worker)  # the worker leads its own group: worker, guardian, the verifier's child
    finally:
        _kill(driver, sig)
    _assert_all_gone([worker, child, *members])
    assert parent == driver.pid and {worker, child} <= set(members) and len(members) >= 3, members


def test_timed_out_worker_is_killed_with_what_the_verifier_started(tmp_path):
    """The runner's own timeout kills a worker that ignores SIGTERM, and the verifier's child goes with it."""
    from credo.rewards import RewardRunner
    from credo.types import Example

    with RewardRunner("tests.test_procs:hang_forever", fn_kwargs={"pid_dir": str(tmp_path)},
                      timeout_s=5.0, workers=1, executor="process") as runner:
        result = runner.score(["x"], [Example("p", "a")])[0]
        assert result.failed and result.error.startswith("timeout")
        worker, child, parent = _read_pids(tmp_path)
        assert parent == os.getpid()
        _assert_all_gone([worker, child])


def test_worker_whose_parent_died_before_binding_kills_itself():
    """The race: a parent already gone when the worker binds (here: pid 1 is not its parent) means exit at once."""
    code = "from credo.procs import bind_to_parent; bind_to_parent(1); print('still alive')"
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "still alive" not in proc.stdout


def test_parent_of_reads_proc():
    from credo.procs import parent_of

    assert parent_of(os.getpid()) == os.getppid()
    assert parent_of(2**22 + 12345) is None  # above pid_max's 4194304 default: no such process


REAP_DRIVER = """
import os, subprocess, sys, time
from credo.procs import reap_when_gone
reap_when_gone({marker!r})
code = "import os, time; f = open(os.environ['LOG'], 'w'); time.sleep(600)"  # its own session, as Ray's agents
held = subprocess.Popen([sys.executable, "-c", code], env={{**os.environ, "LOG": {log!r}}}, start_new_session=True)
named = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {log!r}], start_new_session=True)
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
time.sleep(1.0)
open({out!r}, "w").write(f"{{held.pid}} {{named.pid}} {{other.pid}}")
time.sleep(600)
"""


def test_processes_holding_a_marked_path_die_when_their_starter_is_killed(tmp_path):
    """After kill -9 of a process that called ``reap_when_gone(DIR/)``, its watcher kills the processes (in their
    own sessions, out of reach of any process group) that hold a file under DIR open or name it on their command
    line; an unrelated process lives on."""
    marker = str(tmp_path / "session") + os.sep
    os.makedirs(marker)
    out = tmp_path / "pids"
    code = REAP_DRIVER.format(marker=marker, log=marker + "agent.log", out=str(out))
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=_env())
    try:
        held, named, other = map(int, _wait_for(lambda: out.exists() and out.read_text(), 60, "the processes",
                                                driver).split())
    finally:
        _kill(driver, signal.SIGKILL)
    try:
        _assert_all_gone([held, named])
        assert _alive(other)
    finally:
        if _alive(other):
            os.kill(other, signal.SIGKILL)


REAP_DESCENDANTS_DRIVER = """
import os, subprocess, sys, time
from credo.procs import reap_descendants_when_gone
reap_descendants_when_gone()
reap_descendants_when_gone()  # once per process: a second call starts no second watcher
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
# as vLLM's engine core: its own session (no process group reaches it), the environment inherited
core = subprocess.Popen(sleep, start_new_session=True)
# a grandchild through it, and a process that does not carry the token
worker = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen("
                           "[sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
                           "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(600)", {gpid!r}],
                          start_new_session=True)
other = subprocess.Popen(sleep, start_new_session=True, env={{"PATH": os.environ.get("PATH", "")}})
while not os.path.exists({gpid!r}) or not open({gpid!r}).read():
    time.sleep(0.1)
open({out!r}, "w").write(f"{{core.pid}} {{worker.pid}} {{open({gpid!r}).read()}} {{other.pid}}")
time.sleep(600)
"""


def test_descendants_carrying_the_reap_token_die_when_their_starter_is_killed(tmp_path):
    """After kill -9 of a process that called ``reap_descendants_when_gone()``, its watcher kills every process
    that inherited its token (in their own sessions, a grandchild included: vLLM's engine core and workers); a
    process started without the token lives on."""
    from credo.procs import REAP_ENV, holding, parent_of

    out, gpid = tmp_path / "pids", tmp_path / "grandchild"
    driver = subprocess.Popen([sys.executable, "-c", REAP_DESCENDANTS_DRIVER.format(out=str(out), gpid=str(gpid))],
                              cwd=REPO, env=_env())
    try:
        core, worker, grandchild, other = map(int, _wait_for(lambda: out.exists() and out.read_text(), 60,
                                                             "the processes", driver).split())
        watchers = [p for p in holding(f"{REAP_ENV}={driver.pid}-") if parent_of(p) == driver.pid]  # argv
    finally:
        _kill(driver, signal.SIGKILL)
    try:
        assert len(watchers) == 1
        _assert_all_gone([core, worker, grandchild])
        assert _alive(other)
    finally:
        if _alive(other):
            os.kill(other, signal.SIGKILL)


# ----------------------------------------------------------------------------- item 8: sandbox workers


SANDBOX_DRIVER = """
from credo.sandbox import Limits, Sandbox
sb = Sandbox(workers=1, root={root!r}, unsafe={unsafe})
print(sb.run("import time\\ntime.sleep(300)", "python", limits=Limits(time_s=100.0)))
"""


@ONE_POOL_AT_A_TIME
@pytest.mark.parametrize("unsafe", [True, False], ids=["unsafe", "isolated"])
def test_busy_sandbox_worker_dies_with_the_parent(tmp_path, unsafe):
    """A sandbox worker running a long job does not outlive a kill -9 of the process that owns the Sandbox, nor
    does the job: its bubblewrap (isolated mode, --die-with-parent) or the program itself (unsafe mode: it runs
    in its own session, so its parent-death signal, not the worker's process group, takes it)."""
    if not unsafe:
        from credo.sandbox import Sandbox, SandboxUnavailable

        try:
            Sandbox(workers=1).close()
        except SandboxUnavailable as exc:
            pytest.skip(f"sandbox isolation unavailable here: {exc}")
    root = tempfile.mkdtemp(prefix="credo-procs-test-", dir="/tmp")  # the jobs' uid must reach it (not tmp_path)
    os.chmod(root, 0o755)
    driver = subprocess.Popen([sys.executable, "-c", SANDBOX_DRIVER.format(root=root, unsafe=unsafe)], cwd=REPO,
                              env=_env())
    try:
        from credo.procs import parent_of

        worker = _wait_for(lambda: [p for p in _with_marker(root) if parent_of(p) == driver.pid], 120,
                           "the sandbox worker", driver)[0]
        # the job runs: in isolated mode bubblewrap (its command line names the job directory under root)
        if not unsafe:
            _wait_for(lambda: set(_with_marker(root)) & set(_with_marker("bwrap")), 120,
                      "the job's bubblewrap process", driver)
        else:  # the program itself runs in the job's directory
            _wait_for(lambda: _in_dir(root), 120, "the job's program", driver)
        time.sleep(1.0)
        started = _with_marker(root) + _in_dir(root)
        members = _group(worker)
    finally:
        _kill(driver, signal.SIGKILL)
    try:
        _assert_all_gone([worker, *members, *started])
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill9", "sigterm"])
def test_credo_train_leaves_no_verifier_worker_behind(tmp_path, sig):
    """`credo train` with a verifier that hangs ignoring SIGTERM: kill -9 / SIGTERM of the trainer while the
    verifier runs leaves no worker, no guardian and no child of the verifier behind."""
    from tests.conftest import TINY_COLD

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    args = [*TINY_COLD, "train.steps=2", "warm_start.enabled=false", "eval.every=0", "log.report=false",
            "log.tensorboard=false", "reward.name=tests.test_procs:hang_forever",
            f"reward.kwargs={{pid_dir: {pid_dir}}}", "reward.timeout_s=600", "reward.executor=process"]
    trainer = subprocess.Popen([sys.executable, "-m", "credo.cli.main", "train", "--run-dir", str(tmp_path / "run"),
                                *args], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        worker, child, parent = _read_pids(pid_dir, trainer)
        members = _group(worker)
    finally:
        _kill(trainer, sig)
    _assert_all_gone([worker, child, *members])
    assert parent == trainer.pid and {worker, child} <= set(members) and len(members) >= 3, members


# ------------------------------------------------------------------------------- item 13: Ray connections

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}  # old code too: loopback


def _ray_cfg(*overrides: str):
    from credo.config import load_config

    return load_config(None, ["distributed.backend=ray", *overrides])


class _FakeRay:
    """Records ``ray.init`` calls (no Ray is started)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs) -> None:
        self.calls.append(kwargs)


@pytest.fixture
def fake_ray(monkeypatch):
    """A recording ``ray`` for credo.distributed.ray_launch.connect; Ray's loopback switches restored after."""
    pytest.importorskip("ray")
    from ray._private import ray_constants

    import credo.distributed.ray_pools as pools

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1")  # restored (unset) after the test
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    fake = _FakeRay()
    monkeypatch.setattr(pools, "_ray", lambda: fake)
    return fake


def test_private_ray_instance_binds_to_loopback(fake_ray):
    """A private instance is started with _node_ip_address=127.0.0.1, and Ray no longer rewrites 127.0.0.1 to the
    machine's external address (its resolve_ip_for_localhost, which ray.init applies to every address)."""
    from ray._private import services

    from credo.distributed.ray_launch import connect

    assert connect(_ray_cfg()) is True
    (call,) = fake_ray.calls
    assert call["_node_ip_address"] == "127.0.0.1" and "address" not in call
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # inherited by the Ray processes it starts
    assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    assert services.canonicalize_bootstrap_address("127.0.0.1:6379") == "127.0.0.1:6379"


def test_loopback_ray_address_is_joined_on_loopback(fake_ray):
    import socket

    from credo.distributed.ray_launch import connect

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert connect(_ray_cfg(f"distributed.ray_address=127.0.0.1:{port}")) is True
    (call,) = fake_ray.calls
    assert call["address"] == f"127.0.0.1:{port}" and call["_node_ip_address"] == "127.0.0.1"


def test_auto_without_a_cluster_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    """``distributed.ray_address=auto`` with no cluster (none recorded, none running): one line, exit code 2."""
    pytest.importorskip("ray")
    from ray._private import services

    from credo.cli.main import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [])
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)
    code = main(["-q", "train", "--run-dir", str(tmp_path / "run"), "distributed.backend=ray",
                 "distributed.ray_address=auto"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "distributed.ray_address=auto" in err and "no running Ray cluster" in err


def _credo_train(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "credo.cli.main", "-q", "train", "--run-dir", str(tmp_path / "run"),
                           "distributed.backend=ray", *overrides], cwd=REPO, env={**_env(), **LOOPBACK_ENV},
                          capture_output=True, text=True, timeout=120)


def test_unreachable_ray_address_fails_fast_with_one_line(tmp_path):
    """Nothing listens on 127.0.0.1:1: exit code 2 after the (1 s) connect timeout, one line naming the address."""
    proc = _credo_train(tmp_path, "distributed.ray_address=127.0.0.1:1", "distributed.ray_connect_timeout_s=1")
    err = proc.stderr.strip()
    assert proc.returncode == 2, err[-2000:]
    assert len(err.splitlines()) == 1 and "distributed.ray_address=127.0.0.1:1" in err and "nothing answered" in err


def test_ray_address_that_is_no_ray_cluster_times_out(tmp_path):
    """A port that accepts TCP but never speaks Ray's protocol (Ray itself would retry for many minutes): exit
    code 2 after the connect timeout, one line naming the address."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)  # connections complete in the backlog; nothing ever answers
        address = f"127.0.0.1:{server.getsockname()[1]}"
        proc = _credo_train(tmp_path, f"distributed.ray_address={address}", "distributed.ray_connect_timeout_s=3")
    err = proc.stderr.strip()
    assert proc.returncode == 2, err[-2000:]
    # Ray's own log lines ("2026-.. WARNING worker.py ..", "[timestamp W ..] Failed to connect to GCS ..") may come
    # before or, on a loaded machine, after credo's line: exactly one line is credo's, and no traceback
    lines = err.splitlines()
    ours = [line for line in lines if line.startswith("credo:")]
    assert len(ours) == 1 and ours[0].startswith("credo: config error:"), err[-2000:]
    assert address in ours[0] and "no Ray cluster answered" in ours[0]
    assert "Traceback" not in err, err[-2000:]


def test_tests_and_documented_single_node_recipes_start_ray_on_loopback():
    """Every `ray.init` in the tests goes through credo's loopback start (or names _node_ip_address), every
    `ray start` in the tests and single-node docs passes --node-ip-address 127.0.0.1 (else Ray advertises the
    machine's external address, and `auto` resolves to it)."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        for m in re.finditer(r"ray\.init\(", text):
            call = text[m.start() : text.find(")", m.start()) + 1]
            if "_node_ip_address" not in call:
                offenders.append(f"{path.relative_to(REPO)}: {call}")
        for m in re.finditer(r'"start", "--head"[^\]]*\]', text):
            if "--node-ip-address=127.0.0.1" not in m.group(0):
                offenders.append(f"{path.relative_to(REPO)}: {m.group(0)[:80]}")
    docs = (REPO / "docs" / "distributed.md").read_text().split("### Several nodes")[0]
    for line in docs.splitlines():
        if line.lstrip().startswith("ray start") and not re.search(r"--node-ip-address[ =]127\.0\.0\.1\b", line):
            offenders.append(f"distributed.md: {line.strip()}")
    assert not offenders, offenders


RAY_DRIVER = """
from credo.config import load_config
from credo.distributed.ray_launch import connect
from credo.distributed.ray_pools import RewardPool
from credo.types import Example
connect(load_config(None, ["distributed.backend=ray"]))
pool = RewardPool(dict(name_or_path="tests.test_procs:hang_forever", fn_kwargs={{"pid_dir": {pid_dir!r}}},
                       timeout_s=600, workers=1, executor="process"), workers=1)
pool.score(["x"], [Example("p", "a")])
"""


@pytest.mark.ray
def test_ray_actors_and_their_verifier_workers_end_with_the_driver(tmp_path):
    """A private Ray instance (credo's connect) with a reward actor whose verifier hangs ignoring SIGTERM: after
    kill -9 of the driver, the actor, its verifier worker, the verifier's child and every process of the Ray
    instance (found by its temp dir in their command lines or open files) are gone."""
    pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**_env(), **LOOPBACK_ENV, "RAY_TMPDIR": temp}
    ours = lambda: _using(temp)
    driver = subprocess.Popen([sys.executable, "-c", RAY_DRIVER.format(pid_dir=str(tmp_path))], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        try:
            worker, child, actor = _read_pids(tmp_path, driver)
            members, instance = _group(worker), ours()
        finally:
            _kill(driver, signal.SIGKILL)
        _assert_all_gone([worker, child, actor, *members, *instance], timeout=60)
        assert actor != driver.pid and len(instance) >= 2 and {worker, child} <= set(members)
    finally:
        time.sleep(2.0)  # processes Ray was still starting
        left = ours()
        for pid in left:  # whatever a failure left
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
    assert not left, left


def test_a_marked_stuck_thread_makes_the_cli_leave_with_os_exit_and_its_code():
    """Regression (issue 35's full run): a credo process whose ray.init thread was still stuck in Ray's native code
    printed its one-line error and then aborted while finalizing (std::bad_alloc, exit -6 instead of 2). A marked
    stuck thread makes the exit skip finalization: the code stays, buffered output is flushed, and a thread that
    would never end does not hold the exit."""
    code = ("import sys, threading, time\n"
            "from credo.procs import exit_now_if_stuck, mark_stuck_thread\n"
            "exit_now_if_stuck(5)\n"  # nothing marked: returns
            "threading.Thread(target=lambda: time.sleep(3600)).start()\n"  # non-daemon: a normal exit would wait
            "sys.stdout.write('buffered')\n"
            "mark_stuck_thread('test')\n"
            "exit_now_if_stuck(2)\n"
            "print('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "buffered"
