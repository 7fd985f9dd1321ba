"""Issue 17 items 1, 2, 16a: sandbox replies never cross callers, limits are validated and capped, bearer token,
and SIGTERM of `credo sandbox serve` stops the workers and removes the sandbox's temporary directory.

New names (LimitCaps, FieldError, wait_reply, ...) are imported inside the tests, so each test fails on the old
code for its own reason.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from credo.http_auth import auth_headers
from credo.sandbox import Limits, RunRequest, Sandbox
from tests.env_util import free_port, post_json
from tests.sandbox_util import ONE_POOL_AT_A_TIME

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)

REPO = Path(__file__).resolve().parents[2]
SECRET = "print('secret-of-client-1')"


@pytest.fixture
def sandbox():
    """One worker, no isolation (these tests are about the pool and the HTTP layer, not the jail); a fresh
    pool per test, so that a desynchronised worker on the old code cannot fail the next test."""
    sb = Sandbox(workers=1, unsafe=True)
    yield sb
    sb.close()


def _client(sandbox, **kwargs):
    from fastapi.testclient import TestClient

    from credo.sandbox.server import create_app

    return TestClient(create_app(sandbox, **kwargs), raise_server_exceptions=False)


# ------------------------------------------------------------------ item 1: replies never cross callers
def test_huge_timeout_never_hands_its_result_to_the_next_caller(sandbox):
    # time_s=1e6 -> job timeout ~3e6 s -> conn.poll(3e6) overflowed (OverflowError) after the job was sent,
    # and the worker kept the pending reply: the next caller got client 1's output.
    first = sandbox.submit(RunRequest(source=SECRET, language="python", limits=Limits(time_s=1e6)))
    second = sandbox.submit(RunRequest(source="print('mine')", language="python"))
    assert second.result(timeout=120).stdout == "mine\n"
    assert first.result(timeout=120).stdout == "secret-of-client-1\n"
    third = sandbox.run("print('third')", "python")
    assert third.verdict == "OK" and third.stdout == "third\n"


def test_reply_with_a_stale_job_id_discards_the_worker(sandbox):
    assert sandbox.run("print(1)", "python").stdout == "1\n"  # worker started
    slot = sandbox._slots[0]
    restarts = sandbox.stats["worker_restarts"]
    # desynchronise the worker: it now owes a reply (job id 0) that nobody is waiting for
    slot.conn.send((0, "run", RunRequest(source="print('stale')", language="python")))
    result = sandbox.run("print('mine')", "python")
    assert result.verdict == "SE" and "answered job 0 instead of job" in result.detail
    assert "stale" not in result.stdout
    assert sandbox.stats["worker_restarts"] == restarts + 1
    fresh = sandbox.run("print('mine again')", "python")  # a new worker, in step
    assert fresh.verdict == "OK" and fresh.stdout == "mine again\n"


def test_any_failed_exchange_discards_the_worker(sandbox, monkeypatch):
    from credo.sandbox import pool

    assert sandbox.run("print(1)", "python").stdout == "1\n"
    old_proc = sandbox._slots[0].proc
    real = pool.wait_reply
    calls = []

    def broken(conn, timeout):  # fails once, after the job was sent (like the OverflowError did)
        calls.append(timeout)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(conn, timeout)

    monkeypatch.setattr(pool, "wait_reply", broken)
    result = sandbox.run(SECRET, "python")
    assert result.verdict == "SE" and "RuntimeError: boom" in result.detail
    assert old_proc.poll() is not None  # killed, not reused
    after = sandbox.run("print('own')", "python")
    assert after.stdout == "own\n"


def test_check_reply_and_unbounded_wait():
    from credo.sandbox.pool import check_reply, wait_reply
    from credo.sandbox.results import JudgeResult, RunResult

    ok = RunResult(verdict="OK", stdout="x")
    assert check_reply((7, ok), 7, "run") is None
    assert "answered job 6 instead of job 7" in check_reply((6, ok), 7, "run")
    assert "with a RunResult" in check_reply((7, ok), 7, "judge")
    assert "malformed" in check_reply(ok, 7, "run")
    assert check_reply((3, JudgeResult(verdict="AC")), 3, "judge") is None
    a, b = socket.socketpair()
    left, right = Connection(a.detach()), Connection(b.detach())
    right.send((1, ok))
    assert wait_reply(left, float("inf")) == (True, (1, ok))  # no OverflowError for any timeout
    assert wait_reply(left, 0.05) == (False, None)
    left.close()
    right.close()


# ------------------------------------------------------------------ item 2: every field validated, 422 names it
BAD_FIELDS = [
    ("/run", {"source": "print(1)", "limits": {"time_s": "abc"}}, "limits.time_s"),
    ("/run", {"source": "print(1)", "limits": {"memory_mb": "abc"}}, "limits.memory_mb"),
    ("/run", {"source": "print(1)", "limits": {"output_bytes": 1.5}}, "limits.output_bytes"),
    ("/run", {"source": "print(1)", "limits": {"wall_factor": 0.5}}, "limits.wall_factor"),
    ("/run", b'{"source": "print(1)", "limits": {"time_s": NaN}}', "limits.time_s"),  # Python's json reads NaN
    ("/run", {"source": "print(1)", "limits": {"time_s": -1}}, "limits.time_s"),
    ("/run", {"source": "print(1)", "limits": {"processes": True}}, "limits.processes"),
    ("/run", {"source": "print(1)", "limits": {"extra_env": {"A": 1}}}, "limits.extra_env.A"),
    ("/run", {"source": "print(1)", "limits": "abc"}, "limits"),
    ("/run", {"source": "print(1)", "limits": {"nope": 1}}, "limits.nope"),
    ("/run", {"source": 5}, "source"),
    ("/run", {"source": "print(1)", "stdin": 5}, "stdin"),
    ("/run", {"source": "print(1)", "language": ["python"]}, "language"),
    ("/run", {"stdin": ""}, "source"),
    ("/judge", {"source": "print(1)", "tests": 5}, "tests"),
    ("/judge", {"source": "print(1)", "tests": [5]}, "tests[0]"),
    ("/judge", {"source": "print(1)", "tests": [{"stdin": [1]}]}, "tests[0].stdin"),
    ("/judge", {"source": "print(1)", "tests": [], "limits": {"time_s": "abc"}}, "limits.time_s"),
    ("/judge", {"source": "print(1)", "tests": [], "checker": "nope"}, "checker"),
    ("/judge", {"source": "print(1)", "tests": [], "float_tol": "x"}, "float_tol"),
    ("/judge", {"source": "print(1)", "tests": [], "stop_on_first_failure": "yes"}, "stop_on_first_failure"),
    ("/judge", {"source": "print(1)", "tests": [], "fn_name": 3}, "fn_name"),
    ("/judge_batch", {"requests": 5}, "requests"),
    ("/judge_batch", {"requests": [{"source": "print(1)", "tests": []}, {"source": "x", "tests": 5}]},
     "requests[1].tests"),
    ("/judge_batch", {"requests": [{"source": "x", "tests": [], "limits": {"memory_mb": "abc"}}]},
     "requests[0].limits.memory_mb"),
    ("/run_code", {"code": "print(1)", "language": "python", "run_timeout": "abc"}, "run_timeout"),
    ("/run_code", {"code": "print(1)", "language": "python", "memory_limit_MB": "abc"}, "memory_limit_MB"),
    ("/run_code", {"code": "print(1)", "language": "python", "run_timeout": 0}, "run_timeout"),
    ("/run_code", {"code": 5, "language": "python"}, "code"),
    ("/run_code", {"code": "print(1)", "language": "python", "stdin": 5}, "stdin"),
    ("/run_code", {"code": "print(1)", "language": 5}, "language"),
]


@pytest.mark.parametrize("path,body,field", BAD_FIELDS, ids=[f"{p}:{f}" for p, _, f in BAD_FIELDS])
def test_bad_field_is_422_naming_it(sandbox, path, body, field):
    client = _client(sandbox)
    if isinstance(body, bytes):
        resp = client.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        resp = client.post(path, json=body)
    assert resp.status_code == 422, resp.text
    detail = resp.json()["detail"]
    assert isinstance(detail, str) and detail.split(" ")[0].split("=")[0] == field, detail


def test_python_api_validates_limits_and_requests():
    from credo.sandbox.limits import FieldError
    from credo.sandbox.results import JudgeRequest

    with pytest.raises(FieldError, match=r"^time_s must be a number > 0"):
        Limits(time_s="abc")
    with pytest.raises(FieldError, match=r"^memory_mb must be an integer"):
        Limits(memory_mb=256.0)
    with pytest.raises(FieldError, match=r"^tests must be list"):
        JudgeRequest(source="x", tests=5)


# ------------------------------------------------------------------ item 2: server maxima a request cannot raise
def test_server_maxima_can_be_lowered_never_raised(sandbox):
    from credo.sandbox.limits import LimitCaps

    caps = LimitCaps(time_s=0.5, memory_mb=512, output_bytes=1000, file_size_mb=8, tests=2)
    client = _client(sandbox, caps=caps)
    over = [("/run", {"source": "x", "limits": {"time_s": 0.6}}, "limits.time_s=0.6 exceeds the server maximum 0.5"),
            ("/run", {"source": "x", "limits": {"memory_mb": 513}}, "limits.memory_mb=513 exceeds"),
            ("/run", {"source": "x", "limits": {"output_bytes": 1001}}, "limits.output_bytes=1001 exceeds"),
            ("/run", {"source": "x", "limits": {"file_size_mb": 9}}, "limits.file_size_mb=9 exceeds"),
            ("/judge", {"source": "x", "tests": [{}, {}, {}]}, "tests has 3 tests, more than the server maximum 2"),
            ("/judge_batch", {"requests": [{"source": "x", "tests": [], "limits": {"time_s": 5}}]},
             "requests[0].limits.time_s=5 exceeds"),
            ("/run_code", {"code": SECRET, "language": "python", "run_timeout": 1e6},
             "run_timeout=1000000.0 exceeds the server maximum"),
            ("/run_code", {"code": SECRET, "language": "python", "memory_limit_MB": 4096}, "memory_limit_MB=4096 exceeds")]
    for path, body, message in over:
        resp = client.post(path, json=body)
        assert resp.status_code == 422 and message in resp.json()["detail"], (path, resp.text)
    # lowering is fine: 0.2 s of CPU < 0.5 s maximum
    spin = "while True: pass"
    body = client.post("/run", json={"source": spin, "language": "python", "limits": {"time_s": 0.2}}).json()
    assert body["verdict"] == "TLE" and body["detail"] == "CPU time limit 0.2 s"
    # a limit left out takes its default lowered to the maximum: 2 s -> 0.5 s, 1 MiB of output -> 1000 bytes
    body = client.post("/run", json={"source": spin, "language": "python"}).json()
    assert body["verdict"] == "TLE" and body["detail"] == "CPU time limit 0.5 s"
    body = client.post("/run", json={"source": "print('x' * 5000)", "language": "python"}).json()
    assert body["verdict"] == "OLE" and body["detail"] == "output limit 1000 bytes"
    # SandboxFusion's default run_timeout (10 s) is lowered too (a wall-clock limit there)
    body = client.post("/run_code", json={"code": spin, "language": "python"}).json()
    assert body["run_result"]["status"] == "TimeLimitExceeded" and body["message"] == "wall-clock limit 0.5 s"


def test_limit_caps_reject_bad_maxima():
    from credo.sandbox.limits import FieldError, LimitCaps

    with pytest.raises(FieldError, match="maximum time_s"):
        LimitCaps(time_s=0)
    with pytest.raises(FieldError, match="maximum tests"):
        LimitCaps(tests=0)


# ------------------------------------------------------------------ bearer token
def test_token_401_without_and_200_with(sandbox):
    client = _client(sandbox, token="s3cret")
    assert client.get("/health").status_code == 401
    assert client.post("/run", json={"source": SECRET}).status_code == 401
    assert client.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    good = {"Authorization": "Bearer s3cret"}
    assert client.get("/health", headers=good).status_code == 200
    resp = client.post("/run", json={"source": "print(2)", "language": "python"}, headers=good)
    assert resp.status_code == 200 and resp.json()["stdout"] == "2\n"


def test_serve_reads_token_env_and_warns_when_exposed(monkeypatch, capsys):
    import uvicorn

    from credo.sandbox import server

    seen = {}

    class FakeSandbox:
        def __init__(self, **kwargs):
            seen["sandbox"] = kwargs

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            seen["closed"] = True

    def fake_create_app(sandbox, **kwargs):
        seen["app"] = kwargs
        return object()

    monkeypatch.setattr(server, "Sandbox", FakeSandbox)
    monkeypatch.setattr(server, "create_app", fake_create_app)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.setdefault("uvicorn", kwargs))
    monkeypatch.delenv("CREDO_SANDBOX_TOKEN", raising=False)
    server.serve(host="10.1.2.3", port=9)  # never binds: uvicorn.run is replaced
    assert "credo sandbox serve binds 10.1.2.3 without a token" in capsys.readouterr().err
    assert seen["app"]["token"] is None and seen["closed"]
    monkeypatch.setenv("CREDO_SANDBOX_TOKEN", "from-env")
    server.serve(host="10.1.2.3", port=9)
    assert capsys.readouterr().err == "" and seen["app"]["token"] == "from-env"


def test_cli_passes_token_and_maxima(monkeypatch):
    from credo.cli import main as cli
    from credo.sandbox import server
    from credo.sandbox.limits import LimitCaps

    seen = {}
    monkeypatch.setattr(server, "serve", lambda **kwargs: seen.update(kwargs))
    args = cli.build_parser().parse_args(["sandbox", "serve", "--token", "t0k", "--max-time-s", "5",
                                          "--max-memory-mb", "512", "--max-output-mb", "2", "--max-file-size-mb", "8"])
    assert args.func(args) == 0
    assert seen["token"] == "t0k" and seen["host"] == "127.0.0.1"
    assert seen["caps"] == LimitCaps(time_s=5.0, memory_mb=512, output_bytes=2 << 20, file_size_mb=8)


# ------------------------------------------------------------------ item 16a: SIGTERM shuts down cleanly
def _request(port: int, path: str, body: dict | None = None, token: str | None = None, timeout: float = 60):
    return post_json(f"http://127.0.0.1:{port}{path}", body, auth_headers(token), timeout)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # fields after the command: state, ppid, ...
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def tmpdir_755():
    """A fresh TMPDIR that the sandbox's run uid can traverse (pytest's tmp_path sits under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="credo-test-16a-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_sigterm_stops_workers_and_removes_temp_dirs(tmpdir_755):
    tmp = tmpdir_755
    port, token = free_port(), "tok-16a"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp), "CREDO_SANDBOX_TOKEN": token}
    proc = subprocess.Popen([sys.executable, "-m", "credo.cli.main", "sandbox", "serve", "--port", str(port),
                             "--workers", "2", "--unsafe"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(300):  # up to ~60 s to start
            try:
                if _request(port, "/health", token=token, timeout=1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("sandbox server did not start")
        unauthenticated = _request(port, "/health")[0]  # asserted last: the cleanup is this test's subject
        code, body = _request(port, "/run", {"source": "print('work')", "language": "python"}, token=token)
        assert code == 200 and body["stdout"] == "work\n"
        roots = list(tmp.glob("credo-sandbox-*"))
        assert len(roots) == 1  # the sandbox's temporary directory, under this TMPDIR
        # one job still running when SIGTERM arrives (it would sleep 30 s)
        slow = {"source": "import time; time.sleep(30)", "language": "python", "limits": {"time_s": 10.0}}
        waiter = threading.Thread(target=lambda: _safe_request(port, slow, token), daemon=True)
        waiter.start()
        for _ in range(100):
            if _request(port, "/health", token=token, timeout=5)[1]["stats"]["jobs"] >= 2 and \
                    any((roots[0] / f"w{i}").exists() and any((roots[0] / f"w{i}").iterdir()) for i in range(2)):
                break
            time.sleep(0.1)
        workers = _children(proc.pid)
        assert len(workers) == 2
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 128 + signal.SIGTERM, proc.stderr.read().decode()[-2000:]
    assert list(tmp.iterdir()) == []  # no credo-sandbox-* directory left
    assert not any(_alive(pid) for pid in workers)
    assert unauthenticated == 401  # the token came from CREDO_SANDBOX_TOKEN


def _safe_request(port: int, body: dict, token: str) -> None:
    try:
        _request(port, "/run", body, token=token, timeout=60)
    except (OSError, ValueError):
        pass  # the server shut down under it (connection closed, or a plain-text 500 for the cancelled request)


# ------------------------------------------------------------------ issue 20 item 3: unsafe mode's files, compile caps
def test_cli_passes_the_compile_time_maximum(monkeypatch):
    from credo.cli import main as cli
    from credo.sandbox import server
    from credo.sandbox.limits import LimitCaps

    seen = {}
    monkeypatch.setattr(server, "serve", lambda **kwargs: seen.update(kwargs))
    args = cli.build_parser().parse_args(["sandbox", "serve", "--max-compile-time-s", "7.5"])
    assert args.func(args) == 0
    assert seen["caps"] == LimitCaps(compile_time_s=7.5)


def _run_identity():
    """The uid-dropped identity unsafe mode uses as root (None when not root: the run keeps our uid)."""
    from credo.sandbox.executor import Identity

    return Identity(64999, 64999) if os.geteuid() == 0 else None


def test_unsafe_scratch_is_private_while_written_then_the_runs(tmpdir_755):
    from credo.sandbox.executor import _unsafe_dir

    src = tmpdir_755 / "main.py"
    src.write_text("print(1)")
    identity = _run_identity()
    scratch = _unsafe_dir(tmpdir_755 / "scratch", {"main.py": src}, {"d/in.txt": b"hi"}, identity)
    uid = identity.uid if identity else os.geteuid()
    mode = scratch.stat().st_mode & 0o7777
    assert mode == 0o700 and scratch.stat().st_uid == uid  # never 0777: no other user can plant a symlink
    for path in (scratch / "main.py", scratch / "d", scratch / "d" / "in.txt"):
        assert path.lstat().st_uid == uid and not path.lstat().st_mode & 0o022, path  # nobody else may write
    assert (scratch / "d" / "in.txt").read_bytes() == b"hi"


def test_write_host_never_writes_through_a_symlink_nor_outside(tmpdir_755):
    from credo.sandbox import workfiles

    outside = tmpdir_755 / "outside"
    outside.mkdir()
    work = tmpdir_755 / "work"
    work.mkdir()
    (work / "sub").symlink_to(outside)
    (work / "f").symlink_to(outside / "planted")
    for name in ("sub/x", "f", "../escape.txt", "a/../../escape2.txt"):
        with pytest.raises(ValueError):
            workfiles.write_host(work, {name: b"1"})
    assert list(outside.iterdir()) == [] and not (tmpdir_755 / "escape.txt").exists()
    assert not (tmpdir_755 / "escape2.txt").exists()
    workfiles.write_host(work, {"a/b/c.txt": b"ok"})
    assert (work / "a" / "b" / "c.txt").stat().st_mode & 0o777 == 0o644  # not 0666
    assert (work / "a").stat().st_mode & 0o777 in (0o755, 0o700)  # not 0777 (umask may lower it)


def test_read_host_never_follows_a_symlink_nor_reads_anothers_hard_link(tmpdir_755):
    from credo.sandbox import workfiles

    secret = tmpdir_755 / "secret"
    secret.mkdir()
    (secret / "key").write_text("s3cret")
    work = tmpdir_755 / "work"
    (work / "real").mkdir(parents=True)
    (work / "real" / "f").write_text("mine")
    (work / "alias").symlink_to(secret)  # a symlinked parent directory, pointing out of the work dir
    (work / "link").symlink_to(secret / "key")
    os.mkfifo(work / "fifo")
    got = workfiles.read_host(work, ("real/f", "alias/key", "link", "fifo", "real", "missing"))
    assert got == {"real/f": b"mine"}
    assert workfiles.read_host(work, ("real/f",), cap=3) == {}  # over the cap: nothing
    if os.geteuid() == 0:  # as root: a hard link to a file the run does not own is left out
        os.link(secret / "key", work / "hard")
        os.chown(work / "real" / "f", 64999, 64999)
        got = workfiles.read_host(work, ("hard", "real/f"), owner=64999)
        assert got == {"real/f": b"mine"}


def test_unsafe_run_with_input_and_fetched_files(tmpdir_755):
    from credo.sandbox.executor import execute
    from credo.sandbox.limits import Limits

    os.mkfifo(tmpdir_755 / "unused")
    code = ("import os\nopen('d/in.txt', 'a').write('+run')\nopen('out.txt', 'w').write('made')\n"
            f"os.symlink({str(tmpdir_755)!r}, 'up')\nos.symlink('/etc/hostname', 'host')\n")
    raw = execute(["/usr/bin/python3", "-c", code], limits=Limits(), stdin=b"", identity=_run_identity(),
                  cgroups=None, scratch=tmpdir_755 / "s", isolated=False, inputs={"d/in.txt": b"in"},
                  fetch=("d/in.txt", "out.txt", "up/unused", "host"))
    assert raw.exit_code == 0, raw.stderr
    assert raw.files == {"d/in.txt": b"in+run", "out.txt": b"made"}


# ------------------------------------------------------------------ issue 33 item 12: no '.' or empty component

DOT_PATHS = ["./x", "././x", "a/./b", "a/.", ".", "a//b", "a/", "./", "../x", "a/../b"]


@pytest.mark.parametrize("path", DOT_PATHS)
def test_files_and_fetch_files_refuse_dot_and_empty_components(path):
    """docs/sandbox.md: paths are relative with no empty, `.` or `..` component (a leading `./` was dropped)."""
    from credo.sandbox.limits import FieldError

    shown = repr(path)
    with pytest.raises(FieldError) as exc:
        RunRequest(source="print(1)", files={path: "eA=="})  # "eA==": base64 of b"x"
    assert str(exc.value) == f"files path {shown} has an empty, '.' or '..' component"
    with pytest.raises(FieldError) as exc:
        RunRequest(source="print(1)", fetch_files=["ok.txt", path])
    assert str(exc.value) == f"fetch_files[1] {shown} has an empty, '.' or '..' component"


def test_plain_relative_paths_stay_accepted():
    req = RunRequest(source="print(1)", files={"a.txt": "eA==", "d/e/f.bin": "eA==", ".hidden": "eA==",
                                               "a..b": "eA=="}, fetch_files=["out.txt", "d/.x", "..."])
    assert req.inputs == {"a.txt": b"x", "d/e/f.bin": b"x", ".hidden": b"x", "a..b": b"x"}


@pytest.mark.parametrize("route,body", [
    ("/run", {"source": "print(1)", "files": {"./x": "eA=="}}),
    ("/run", {"source": "print(1)", "fetch_files": ["./x"]}),
    ("/run_code", {"code": "print(1)", "language": "python", "files": {"./x": "eA=="}}),
    ("/run_code", {"code": "print(1)", "language": "python", "fetch_files": ["./x"]}),
])
def test_dot_component_is_422_naming_the_field(sandbox, route, body):
    resp = _client(sandbox).post(route, json=body)
    assert resp.status_code == 422, resp.text
    field = "files path" if "files" in body else "fetch_files[0]"
    assert resp.json()["detail"] == f"{field} './x' has an empty, '.' or '..' component"
