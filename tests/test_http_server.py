"""Issue 33 item 6: slow or greedy clients cannot lock out `credo sandbox serve`, `credo env serve`, `credo rm serve`.

Each server runs as the real CLI in a subprocess on a free loopback port, its open-file limit set to 1024 (the
usual default: what ~1000 stalled connections exhaust, after which the old servers accepted nobody). Attackers
connect from 127.0.0.2-.10, so the per-peer cap tells them from the honest client on 127.0.0.1. "default" servers
run with their default limits; "tight" ones with short timeouts and small caps (TIGHT). The subprocess imports the
credo this file imports (PYTHONPATH may point at another tree: the old code fails these tests).
"""
from __future__ import annotations

import http.client
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import credo
from tests.env_util import free_port
from tests.sandbox_util import ONE_POOL_AT_A_TIME

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)

SRC = Path(credo.__file__).resolve().parents[1]  # the tree whose credo is under test
KINDS = ("sandbox", "env", "rm")
NOFILE = 1024
HEALTH = {"sandbox": "/health", "env": "/stats", "rm": "/health"}
BODY_PATH = {"sandbox": "/run_code", "env": "/step", "rm": "/score"}
TIGHT = ["--header-timeout-s", "1", "--body-timeout-s", "1", "--max-connections", "40",
         "--max-connections-per-peer", "10"]
TIGHT_BODY = {"sandbox": ["--max-request-mb", "1"], "env": ["--max-request-mb", "1"],
              "rm": ["--max-request-bytes", str(1 << 20)]}
PARTIAL_HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # no blank line: the head never ends


# ------------------------------------------------------------------------------------------------ servers

@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    """A tiny reward model saved as `credo rm train` saves one."""
    from credo.models import ValueModel, build_model
    from tests.conftest import TINY

    model, tok = build_model(TINY, seed=0)
    path = tmp_path_factory.mktemp("rm") / "reward_model"
    ValueModel.from_policy(model).save(path)
    tok.save_pretrained(path)
    return path


class Served:
    """One `credo KIND serve` process: its port, pid and a log file for its standard error."""

    def __init__(self, kind: str, extra: list[str], rm_dir: Path | None, log: Path):
        self.kind, self.port, self.log = kind, free_port(), log
        target = {"sandbox": ["sandbox", "serve", "--workers", "1"], "env": ["env", "serve", "calc"],
                  "rm": ["rm", "serve", str(rm_dir)]}[kind]
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "credo.cli.main", *target, "--port", str(self.port), *extra], cwd=SRC,
                env={**os.environ, "PYTHONPATH": str(SRC)}, stdout=subprocess.DEVNULL, stderr=err,
                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE)))
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_up(self) -> "Served":
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.kind} server exited: {self.log.read_text()[-1500:]}")
            try:
                with urllib.request.urlopen(self.url + HEALTH[self.kind], timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        pytest.fail(f"{self.kind} server did not start: {self.log.read_text()[-1500:]}")

    def peak_rss_kb(self) -> int:
        """VmHWM: the most resident memory the server process has had."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def servers(request, tmp_path_factory):
    """``get(kind, tight)``: the module's server of that kind and flags; the first call of a kind starts both of
    its servers (default and tight) side by side."""
    started: dict[tuple[str, bool], Served] = {}
    logs = tmp_path_factory.mktemp("logs")

    def get(kind: str, tight: bool) -> Served:
        if (kind, tight) not in started:
            if kind == "sandbox":
                from tests.sandbox_util import make_sandbox

                make_sandbox(1).close()  # skips where isolation cannot exist here
            rm = request.getfixturevalue("rm_dir") if kind == "rm" else None
            for flavour in (False, True):
                extra = TIGHT + TIGHT_BODY[kind] if flavour else []
                started[kind, flavour] = Served(kind, extra, rm, logs / f"{kind}-{flavour}.log")
        return started[kind, tight].wait_up()

    yield get
    for served in started.values():
        served.stop()


# ------------------------------------------------------------------------------------------------ clients

def _connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def _replies(socks: list[socket.socket], timeout: float) -> list[bytes | None]:
    """What the server sent on each of ``socks`` within ``timeout`` s: the bytes (b"": closed without a word), or
    None when it sent nothing and kept the connection open."""
    got = {s.fileno(): b"" for s in socks}
    closed: set[int] = set()
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    by_fd, deadline = {s.fileno(): s for s in socks}, time.monotonic() + timeout
    while len(closed) < len(socks):
        events = poller.poll(max(0.0, deadline - time.monotonic()) * 1000)
        if not events:
            break
        for fd, _ in events:
            try:
                chunk = by_fd[fd].recv(65536)
            except ConnectionError:
                chunk = b""
            got[fd] += chunk
            if not chunk:
                closed.add(fd)
                poller.unregister(fd)
    return [got[s.fileno()] if s.fileno() in closed or got[s.fileno()] else None for s in socks]


def _wait_reply(sock: socket.socket, timeout: float) -> bytes | None:
    return _replies([sock], timeout)[0]


def _status(reply: bytes | None) -> int | None:
    return int(reply.split(b" ", 2)[1]) if reply and reply.startswith(b"HTTP/1.1 ") else None


def _honest_get(served: Served, timeout: float = 5) -> tuple[int, float]:
    start = time.monotonic()
    with urllib.request.urlopen(served.url + HEALTH[served.kind], timeout=timeout) as resp:
        resp.read()
        return resp.status, time.monotonic() - start


def _regular_request(served: Served) -> None:
    """A request of the server's own kind, answered as it should be."""
    body = {"sandbox": {"source": "print(1 + 1)", "language": "python"}, "env": {},
            "rm": {"prompts": ["ab="], "responses": ["ba"]}}[served.kind]
    path = {"sandbox": "/run", "env": "/create", "rm": "/score"}[served.kind]
    req = urllib.request.Request(served.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        reply = json.loads(resp.read())
    assert {"sandbox": lambda r: r["stdout"] == "2\n", "env": lambda r: isinstance(r["id"], int),
            "rm": lambda r: len(r["scores"]) == 1}[served.kind](reply), reply


def _keep_alive_pair(served: Served) -> None:
    """Two requests on one connection: both answered, the connection kept between them."""
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    try:
        statuses, socks = [], []
        for _ in range(2):
            conn.request("GET", HEALTH[served.kind])
            resp = conn.getresponse()
            resp.read()
            statuses.append(resp.status)
            socks.append(conn.sock)
        assert statuses == [200, 200] and socks[0] is socks[1] and socks[0] is not None
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------------ tests

@pytest.mark.parametrize("kind", KINDS)
def test_stalled_heads_do_not_lock_out_honest_clients(servers, kind):
    """1100 connections from one address that never finish their request head (default limits, 1024 open files):
    an honest client is still answered at once, regular and keep-alive requests work, and the stalled peer holds at
    most its 64 connections (the old servers kept all of them, ran out of descriptors and reset everyone)."""
    served = servers(kind, tight=False)
    stalled = []
    try:
        for _ in range(1100):
            sock = _connect(served.port, "127.0.0.2")
            stalled.append(sock)
            try:
                sock.sendall(PARTIAL_HEAD)
            except OSError:
                pass  # refused already
        time.sleep(0.5)
        status, took = _honest_get(served)
        assert status == 200 and took < 3
        _regular_request(served)
        _keep_alive_pair(served)
        still_open = _replies(stalled, 0.2).count(None)
        assert still_open <= 64
    finally:
        for sock in stalled:
            sock.close()


def _oversized_post(served: Served, length: int, body: bytes | None) -> int | None:
    """POST a head announcing ``length`` bytes; send ``body`` only if no answer came within 2 s (the old servers
    read it). Returns the answer's status (None: none)."""
    sock = _connect(served.port, "127.0.0.1")
    try:
        sock.sendall(f"POST {BODY_PATH[served.kind]} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {length}\r\n\r\n".encode())
        reply = _wait_reply(sock, 2)
        if reply is None and body is not None:
            sock.settimeout(120)
            sock.sendall(body)
            reply = _wait_reply(sock, 120)
        return _status(reply)
    finally:
        sock.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_100_mb_body_is_refused_before_it_is_read(servers, kind):
    """A 100 MB JSON body (a base64 input file) over the default cap: 413 right after the head, and the server's
    peak memory does not grow by anything like the body (the old sandbox and env servers read and parsed it)."""
    served = servers(kind, tight=False)
    size = 100_000_000
    prefix, suffix = b'{"code": "print(1)", "language": "python", "files": {"a.bin": "', b'"}}'
    body = prefix + b"A" * (size - len(prefix) - len(suffix)) + suffix
    before = served.peak_rss_kb()
    status = _oversized_post(served, len(body), body)
    grown_mb = (served.peak_rss_kb() - before) / 1024
    assert status == 413 and grown_mb < 40, (status, grown_mb)
    _regular_request(served)


@pytest.mark.parametrize("kind", KINDS)
def test_a_chunked_body_is_counted_as_it_arrives(servers, kind):
    """No Content-Length (chunked), cap 1 MiB: the server answers 413 / closes after about 1 MiB of the 32 MiB
    sent, without buffering the rest."""
    served = servers(kind, tight=True)
    before = served.peak_rss_kb()
    sock = _connect(served.port, "127.0.0.1")
    sent, reply, chunk = 0, None, b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
    try:
        sock.sendall(f"POST {BODY_PATH[kind]} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        while sent < 32 << 20 and reply is None:
            try:
                sock.sendall(chunk)
            except OSError:
                break
            sent += 65536
            reply = _wait_reply(sock, 0)
        reply = reply if reply is not None else _wait_reply(sock, 5)
    finally:
        sock.close()
    assert sent < 16 << 20 and _status(reply) in (413, None), (sent, reply)
    assert (served.peak_rss_kb() - before) / 1024 < 16


def _trickle_until_reply(sock, piece: bytes, start: float, *, limit_s: float) -> bytes | None:
    """Send ``piece`` every 0.2 s until the server answers (its reply, b"" when it hung up) or ``limit_s`` since
    ``start`` passed (None)."""
    reply = None
    while reply is None and time.monotonic() - start < limit_s:
        try:
            sock.sendall(piece)
        except OSError:
            pass
        reply = _wait_reply(sock, 0.2)
    return reply


@pytest.mark.parametrize("kind", KINDS)
def test_slow_and_oversized_heads_are_closed(servers, kind):
    """--header-timeout-s 1: a head trickled a byte every 0.2 s (which does not reset the clock) gets 408 and is
    closed after about 1 s; so is a connection that sends nothing (silently); a 100 KiB head gets 431 at once."""
    served = servers(kind, tight=True)
    trickled, idle = _connect(served.port, "127.0.0.3"), _connect(served.port, "127.0.0.3")
    start = time.monotonic()
    trickled.sendall(PARTIAL_HEAD)
    reply = _trickle_until_reply(trickled, b"X", start, limit_s=5)
    took = time.monotonic() - start
    assert _status(reply) == 408 and 0.8 < took < 3, (reply, took)
    assert _wait_reply(idle, 3) == b""
    assert time.monotonic() - start < 4
    big = _connect(served.port, "127.0.0.3")
    try:
        big.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 << 10))
    except OSError:
        pass
    reply = _wait_reply(big, 0.5)  # within the head timeout: refused for its size
    assert reply == b"" or _status(reply) == 431, reply
    for sock in (trickled, idle, big):
        sock.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_trickled_body_gets_408_at_the_body_deadline(servers, kind):
    """--body-timeout-s 1: a 1000-byte body sent 10 bytes every 0.2 s is answered 408 (and closed) after ~1 s."""
    served = servers(kind, tight=True)
    sock = _connect(served.port, "127.0.0.4")
    start = time.monotonic()
    try:
        sock.sendall(f"POST {BODY_PATH[kind]} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".encode())
        reply = _trickle_until_reply(sock, b"0123456789", start, limit_s=8)
    finally:
        sock.close()
    took = time.monotonic() - start
    assert _status(reply) == 408 and 0.8 < took < 3, (reply, took)


def _refused(socks: list[socket.socket], wait: float = 0.5) -> int:
    """How many of ``socks`` were answered 503 (refused over a connection cap) within ``wait`` s."""
    return sum(_status(reply) == 503 for reply in _replies(socks, wait))


@pytest.mark.parametrize("kind", KINDS)
def test_connection_caps_hold(servers, kind):
    """--max-connections-per-peer 10: of 15 connections from one address, 5 are answered 503; --max-connections 40:
    with 40 open from four addresses, all 10 of a fifth are refused. Once they close, clients are served again."""
    served = servers(kind, tight=True)
    first = [_connect(served.port, "127.0.0.5") for _ in range(15)]
    assert _refused(first) == 5
    for sock in first:
        sock.close()
    time.sleep(0.2)
    socks = [_connect(served.port, f"127.0.0.{6 + i // 10}") for i in range(40)]
    time.sleep(0.2)
    extra = [_connect(served.port, "127.0.0.10") for _ in range(10)]
    try:
        assert _refused(extra) == 10 and _refused(socks) == 0
    finally:
        for sock in socks + extra:
            sock.close()
    deadline = time.monotonic() + 3
    while True:
        try:
            assert _honest_get(served)[0] == 200
            break
        except (OSError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# ------------------------------------------------------------------------------------------------ in process

class _InProcess:
    """``app`` under uvicorn with ``credo.http_server``'s options, in a thread of this process."""

    def __init__(self, app, limits, base=None):
        import uvicorn

        from credo.http_server import guarded_protocol, uvicorn_options

        options = {**uvicorn_options(limits), "http": guarded_protocol(limits, base)}
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    **options))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "_InProcess":
        self.thread.start()
        for _ in range(400):
            if self.server.started:
                return self
            time.sleep(0.025)
        raise AssertionError("server did not start")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_h11_protocol_is_guarded_too():
    """The same limits on uvicorn's h11 protocol: head timeout, per-peer cap, keep-alive, body limit."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from credo.envs.server import create_app
    from credo.http_server import ServerLimits

    limits = ServerLimits(header_timeout_s=0.5, max_connections_per_peer=3, max_body_bytes=1000)
    with _InProcess(create_app("calc", server_limits=limits), limits, H11Protocol) as srv:
        stalled = [_connect(srv.port, "127.0.0.2") for _ in range(4)]
        stalled[0].sendall(PARTIAL_HEAD)
        assert _status(_wait_reply(stalled[3], 0.3)) == 503
        assert _status(_wait_reply(stalled[0], 2)) == 408
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        for body, status in ((b"{}", 200), (b"{}", 200)):
            conn.request("POST", "/create", body=body)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == status
        conn.request("POST", "/create", body=b"x" * 2000)
        assert conn.getresponse().status == 413
        conn.close()
        for sock in stalled:
            sock.close()


def test_a_request_without_the_token_is_refused_before_its_body_is_read():
    """With a token, a 50 MB body without it is answered 401 at once (the bearer check runs before the body limit);
    with it, the same head is answered 413 before the body is read."""
    from credo.envs.server import create_app
    from credo.http_server import ServerLimits

    limits = ServerLimits()
    with _InProcess(create_app("calc", token="s3cret", server_limits=limits), limits) as srv:
        for auth, status in ((b"", 401), (b"Authorization: Bearer s3cret\r\n", 413)):
            sock = _connect(srv.port, "127.0.0.1")
            sock.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 50000000\r\n\r\n")
            sock.settimeout(2)
            assert _status(sock.recv(65536)) == status  # before any of the body was sent
            sock.close()


def test_the_flags_reach_each_server_and_bad_values_are_one_line(monkeypatch, capsys, rm_dir):
    import uvicorn

    from credo.cli.main import main
    from credo.http_server import MiB, ServerLimits
    from credo.sandbox import server as sandbox_server

    seen: list = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.append((app, kw)))
    flags = ["--max-connections", "7", "--max-connections-per-peer", "3", "--header-timeout-s", "2.5",
             "--body-timeout-s", "4", "--max-header-kb", "16"]
    expected = dict(max_connections=7, max_connections_per_peer=3, header_timeout_s=2.5, body_timeout_s=4.0,
                    max_header_bytes=16 << 10)
    assert main(["env", "serve", "calc", *flags, "--max-request-mb", "2"]) == 0
    assert seen[-1][1]["http"].limits == ServerLimits(**expected, max_body_bytes=2 * MiB)
    assert main(["env", "serve", "calc"]) == 0
    assert seen[-1][1]["http"].limits == ServerLimits()  # defaults: 512, 64, 10 s, 30 s, 64 KiB, 8 MiB
    assert main(["rm", "serve", str(rm_dir), *flags, "--max-request-bytes", "5000"]) == 0
    assert seen[-1][1]["http"].limits == ServerLimits(**expected, max_body_bytes=5000)
    got: dict = {}
    monkeypatch.setattr(sandbox_server, "serve", lambda **kw: got.update(kw))
    assert main(["sandbox", "serve", *flags]) == 0
    assert got["server_limits"] == ServerLimits(**expected, max_body_bytes=64 * MiB)
    capsys.readouterr()
    for argv, line in ((["env", "serve", "calc", "--max-connections", "0"], "env serve: --max-connections must be "
                        ">= 1, got 0"), (["sandbox", "serve", "--header-timeout-s", "-1"], "sandbox serve: "
                        "--header-timeout-s must be > 0 (seconds), got -1"),
                       (["rm", "serve", str(rm_dir), "--body-timeout-s", "nan"], "rm serve: --body-timeout-s must "
                        "be > 0 (seconds), got nan"), (["env", "serve", "calc", "--max-request-mb", "0"],
                                                       "env serve: --max-request-mb must be >= 1, got 0")):
        assert main(argv) == 2
        assert capsys.readouterr().err.strip() == f"credo: config error: {line}"


def test_the_open_file_limit_is_raised_or_the_caps_lowered(monkeypatch, capsys):
    from credo import http_server
    from credo.http_server import FD_RESERVE, ServerLimits, fit_fd_limit

    calls: list = []
    monkeypatch.setattr(resource, "getrlimit", lambda what: (300, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda what, value: calls.append(value))
    limits = ServerLimits(max_connections=500)
    assert fit_fd_limit(limits) == limits and calls == [(500 + FD_RESERVE, 4096)]

    def refuse(what, value):
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "getrlimit", lambda what: (400, 400))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    lowered = fit_fd_limit(limits)
    assert lowered.max_connections == 400 - 200 and lowered.max_connections_per_peer == 64
    assert "open-file limit (400) is too low" in capsys.readouterr().err
    # the module stays at the bottom layer: nothing of credo's but credo.http_auth
    assert all(name == "credo.http_auth" for name in _credo_imports(Path(http_server.__file__)))


def _credo_imports(path: Path) -> list[str]:
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [n for n in names if n == "credo" or n.startswith("credo.")]
