"""Issue 33, items 2 and 3: every HTTP client credo has caps the size of a reply and gives each call a whole-call
deadline (connect + headers + body), through :mod:`credo.http_client`: the reward-model client, the environment
client, vLLM weight sync, the vLLM scorer (the distillation teacher's) and the vLLM server transport.

The servers are small hostile raw-socket servers on 127.0.0.1: an endless chunked stream, a huge Content-Length,
a body or headers trickled a byte every 0.2 s. The client tests import nothing from ``credo.http_client`` so they
also run against code without it (the trickles and streams end on their own, so such code fails, not hangs)."""
from __future__ import annotations

import importlib
import socket
import threading
import time
import tracemalloc
from contextlib import contextmanager
from typing import Callable

import pytest

from credo.config import ConfigError
from credo.envs import EnvError, HTTPEnvClient
from credo.methods.distill.teacher import ServerTeacher
from credo.rewards import reward_model as reward_model_module
from credo.rewards.reward_model import reward_model, score_http
from credo.rollout import vllm_transport
from credo.rollout.vllm_sync import HTTPWeightSync
from credo.rollout.vllm_transport import ServerVLLM, VLLMOptions, VLLMScorer
from credo.types import Example
from tests.env_util import read_request

DEADLINE = 0.5  # seconds: every client under test gets this whole-call deadline
SLACK = 3.0  # a call must end within DEADLINE + SLACK (the machine is shared and loaded)
TRICKLE_S = 0.2  # a trickle sends a byte this often: inside a per-read timeout of DEADLINE
TRICKLE_BYTES = 50  # 50 x 0.2 s = 10 s of trickle, ~3 times DEADLINE + SLACK = 3.5 s
STREAM_LIMIT = 64 << 20  # an endless stream gives up after 64 MiB, so a client without a cap ends (and fails)
BLOCK = b"x" * (64 << 10)
CAP = 1 << 20  # the small reply cap of the tests that choose one
MIB = 1 << 20


# ============================================================================ hostile servers

def _head(*lines: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nConnection: close\r\n" + \
        b"".join(line + b"\r\n" for line in lines) + b"\r\n"


def _json(body: bytes, status: bytes = b"200 OK") -> bytes:
    return _head(b"Content-Length: %d" % len(body), status=status) + body


class Hostile:
    """A one-thread raw-socket server on 127.0.0.1: reads each request whole, records its request line, and answers
    ``routes[path]`` (raw bytes, or a behaviour ``fn(conn, server)``), anything else with ``default``. ``sent``
    counts the bytes of streamed bodies that the client accepted."""

    def __init__(self, default, routes: dict | None = None):
        self.default, self.routes = default, routes or {}
        self.requests: list[bytes] = []  # request lines
        self.heads: list[bytes] = []  # whole request heads
        self.sent = 0
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    self._handle(conn)
                except OSError:  # the client hung up: what a capped or deadlined client does
                    pass

    def _handle(self, conn: socket.socket) -> None:
        got = read_request(conn)
        if got is None:
            return
        head, body = got
        self.requests.append(head.split(b"\r\n")[0])
        self.heads.append(head)
        path = head.split(b" ")[1].split(b"?")[0].decode()
        answer = self.routes.get(path, self.default)
        if callable(answer):
            answer(conn, self)
        else:
            conn.sendall(answer)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.sock.close()


def endless(conn: socket.socket, server: Hostile) -> None:
    """A chunked reply that streams 64 KiB chunks until the client hangs up (or STREAM_LIMIT)."""
    conn.sendall(_head(b"Transfer-Encoding: chunked"))
    frame = b"%x\r\n" % len(BLOCK) + BLOCK + b"\r\n"
    while server.sent < STREAM_LIMIT and not server.stop.is_set():
        conn.sendall(frame)
        server.sent += len(BLOCK)
    conn.sendall(b"0\r\n\r\n")


def huge_length(conn: socket.socket, server: Hostile) -> None:
    """Announces a 10**12-byte body and streams it until the client hangs up (or STREAM_LIMIT)."""
    conn.sendall(_head(b"Content-Length: %d" % 10 ** 12))
    while server.sent < STREAM_LIMIT and not server.stop.is_set():
        conn.sendall(BLOCK)
        server.sent += len(BLOCK)


def _trickle(conn: socket.socket, server: Hostile, data: bytes) -> None:
    for i in range(len(data)):
        if server.stop.wait(TRICKLE_S):
            return
        conn.sendall(data[i : i + 1])


def trickle_body(conn: socket.socket, server: Hostile) -> None:
    """Headers at once, then a 50-byte JSON string body a byte every 0.2 s (10 s)."""
    body = b'"' + b"x" * (TRICKLE_BYTES - 2) + b'"'
    conn.sendall(_head(b"Content-Length: %d" % len(body)))
    _trickle(conn, server, body)


def trickle_headers(conn: socket.socket, server: Hostile) -> None:
    """The status line at once, then a header trickled a byte every 0.2 s (10 s), then an empty object."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    _trickle(conn, server, b"y" * TRICKLE_BYTES)
    conn.sendall(b"\r\nContent-Length: 2\r\n\r\n{}")


def silent(conn: socket.socket, server: Hostile) -> None:
    """Never answers (until the server stops)."""
    server.stop.wait(TRICKLE_S * TRICKLE_BYTES)


TRICKLES = {"trickle_body": trickle_body, "trickle_headers": trickle_headers}
HOSTILE = {"endless": endless, "huge_length": huge_length, **TRICKLES}


@pytest.fixture
def hostile():
    servers: list[Hostile] = []

    def start(default, routes: dict | None = None) -> Hostile:
        servers.append(Hostile(default, routes))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def hc():
    """credo.http_client, imported by the tests of the helper only (the client tests run without it too)."""
    return importlib.import_module("credo.http_client")


@contextmanager
def traced():
    """Yields a dict whose ``peak`` is, after the block, the most bytes Python had allocated at once inside it."""
    box: dict[str, int] = {}
    tracemalloc.start()
    try:
        yield box
    finally:
        box["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def _fails_in_time(call: Callable[[], object], expected=OSError) -> BaseException:
    """The error ``call()`` raises (of type ``expected``), asserting it came within DEADLINE + SLACK."""
    start = time.monotonic()
    with pytest.raises(expected) as info:
        call()
    elapsed = time.monotonic() - start
    assert elapsed < DEADLINE + SLACK, f"{type(info.value).__name__} after {elapsed:.1f} s: {info.value}"
    return info.value


def _bounded(call: Callable[[], object], expected=OSError) -> str:
    """The one-line message of the error ``call()`` raises (of type ``expected``), asserting it came within
    DEADLINE + SLACK and that Python held less than 4 x CAP meanwhile (code without a cap holds 64 MiB)."""
    with traced() as mem:
        err = _fails_in_time(call, expected)
    assert mem["peak"] < 4 * CAP, f"{mem['peak']} bytes held: {err}"
    return _one_line(err)


def _why(behaviour: str) -> str:
    """What the message of a call that met ``behaviour`` must say (with a cap of CAP and a deadline of DEADLINE)."""
    return "cap of 1048576 bytes" if behaviour in ("endless", "huge_length") else f"within {DEADLINE:g} s"


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and len(text) < 600, text
    return text


# ============================================================================ the helper


def test_a_reply_is_read_whole_and_an_error_status_keeps_its_status_and_body(hostile, hc):
    srv = hostile(_json(b'{"a": [1, 2]}'), {"/missing": _json(b'{"detail": "no"}', status=b"404 Not Found")})
    reply = hc.request(srv.url + "/x?q=1", deadline_s=DEADLINE, max_reply_bytes=100)
    assert (reply.status, reply.body, reply.headers["content-type"]) == (200, b'{"a": [1, 2]}', "application/json")
    assert hc.request_json(srv.url + "/x", {"k": 1}, deadline_s=DEADLINE, max_reply_bytes=100) == {"a": [1, 2]}
    assert srv.requests == [b"GET /x?q=1 HTTP/1.1", b"POST /x HTTP/1.1"]
    with pytest.raises(hc.HTTPStatusError) as info:
        hc.request_json(srv.url + "/missing", {}, deadline_s=DEADLINE, max_reply_bytes=100)
    assert (info.value.status, info.value.body) == (404, b'{"detail": "no"}')
    assert _one_line(info.value).startswith(f"POST {srv.url}/missing: HTTP 404")


def test_the_cap_holds_to_the_byte_with_and_without_content_length(hostile, hc):
    body = b'{"a": 1}'  # 8 bytes
    chunked = _head(b"Transfer-Encoding: chunked") + b"3\r\n" + body[:3] + b"\r\n5\r\n" + body[3:] + b"\r\n0\r\n\r\n"
    for reply in (_json(body), chunked):
        srv = hostile(reply)
        assert hc.request(srv.url, deadline_s=DEADLINE, max_reply_bytes=8).body == body
        with pytest.raises(hc.ReplyTooLarge, match="cap of 7 bytes"):
            hc.request(srv.url, deadline_s=DEADLINE, max_reply_bytes=7)


def test_an_endless_chunked_stream_ends_at_the_cap_in_bounded_memory(hostile, hc):
    srv = hostile(endless)
    with traced() as mem:
        err = _fails_in_time(lambda: hc.request(srv.url, deadline_s=30, max_reply_bytes=CAP), hc.ReplyTooLarge)
    assert "cap of 1048576 bytes" in _one_line(err) and srv.url in str(err)
    assert mem["peak"] < 4 * CAP  # at most the cap + one 256 KiB read is held
    assert srv.sent < STREAM_LIMIT // 2  # the client hung up: the stream did not run to its end


def test_a_huge_content_length_fails_before_the_body_is_read(hostile, hc):
    srv = hostile(huge_length)
    with traced() as mem:
        err = _fails_in_time(lambda: hc.request(srv.url, deadline_s=30, max_reply_bytes=CAP), hc.ReplyTooLarge)
    assert "announces 1000000000000 bytes, over the cap of 1048576 bytes" in _one_line(err)
    assert mem["peak"] < CAP


@pytest.mark.parametrize("behaviour", ["trickle_body", "trickle_headers", "silent"])
def test_a_trickle_is_cut_at_the_whole_call_deadline(hostile, hc, behaviour):
    srv = hostile({**TRICKLES, "silent": silent}[behaviour])
    start = time.monotonic()
    err = _fails_in_time(lambda: hc.request(srv.url + "/t", deadline_s=DEADLINE, max_reply_bytes=CAP),
                         hc.DeadlineExceeded)
    assert time.monotonic() - start >= DEADLINE - 0.05  # not before its time either
    assert isinstance(err, TimeoutError) and isinstance(err, OSError)  # what callers already catch
    assert _one_line(err) == f"GET {srv.url}/t: no complete reply within {DEADLINE:g} s (whole-call deadline)"


def test_sending_to_a_server_that_stops_reading_ends_at_the_deadline(hc):
    with socket.create_server(("127.0.0.1", 0)) as sock:  # accepts (the kernel does), never reads
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/update_weights"
        body = b"x" * (32 << 20)  # a weight chunk: far more than the loopback socket buffers take
        err = _fails_in_time(lambda: hc.request(url, method="POST", body=body, deadline_s=DEADLINE,
                                                max_reply_bytes=CAP), hc.DeadlineExceeded)
    assert f"POST {url}: no complete reply within {DEADLINE:g} s" in _one_line(err)


def test_a_body_cut_short_or_a_garbage_status_line_is_a_bad_reply(hostile, hc):
    short = hostile(_head(b"Content-Length: 100") + b'{"a": 1}')  # 8 of 100 bytes, then the connection closes
    with pytest.raises(hc.BadReply, match="ended after 8 of its 100 bytes"):
        hc.request(short.url, deadline_s=DEADLINE, max_reply_bytes=CAP)
    garbage = hostile(b"SPAM/9 200 whatever\r\n\r\n")
    with pytest.raises(hc.BadReply, match="BadStatusLine") as info:
        hc.request(garbage.url, deadline_s=DEADLINE, max_reply_bytes=CAP)
    assert isinstance(info.value, OSError)


def test_bad_arguments_and_credentials_in_the_url(hostile, hc):
    for kwargs in ({"deadline_s": 0, "max_reply_bytes": 1}, {"deadline_s": 1, "max_reply_bytes": -1}):
        with pytest.raises(ValueError):
            hc.request("http://127.0.0.1:1/", **kwargs)
    with pytest.raises(ValueError, match="not an http"):
        hc.request("ftp://127.0.0.1/x", deadline_s=1, max_reply_bytes=1)
    srv = hostile(silent)
    url = srv.url.replace("http://", "http://user:s3cret@")
    err = _fails_in_time(lambda: hc.request(url, deadline_s=0.3, max_reply_bytes=1), hc.DeadlineExceeded)
    assert "s3cret" not in str(err) and srv.url in str(err)


def test_proxies_from_the_environment_are_used_as_urllib_uses_them(hostile, hc, monkeypatch):
    proxy = hostile(_json(b"{}"), {"example.invalid:443": _head(status=b"407 Proxy Authentication Required")})
    direct = hostile(_json(b'"direct"'))
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("https_proxy", proxy.url.replace("http://", "http://me:pw@"))
    assert hc.request("http://example.invalid/p?q=1", deadline_s=DEADLINE, max_reply_bytes=CAP).body == b"{}"
    with pytest.raises(OSError, match="Tunnel connection failed: 407"):  # https goes through a CONNECT tunnel
        hc.request("https://example.invalid/p", deadline_s=DEADLINE, max_reply_bytes=CAP)
    assert proxy.requests == [b"GET http://example.invalid/p?q=1 HTTP/1.1", b"CONNECT example.invalid:443 HTTP/1.0"]
    assert b"Proxy-Authorization: Basic bWU6cHc=" in proxy.heads[1]  # base64 of "me:pw"
    # a loopback host is never proxied (traffic for this machine stays on it), no_proxy or not
    assert hc.request(direct.url + "/d", deadline_s=DEADLINE, max_reply_bytes=CAP).body == b'"direct"'
    local = direct.url.replace("127.0.0.1", "localhost")
    assert hc.request(local + "/l", deadline_s=DEADLINE, max_reply_bytes=CAP).body == b'"direct"'
    assert direct.requests == [b"GET /d HTTP/1.1", b"GET /l HTTP/1.1"] and len(proxy.requests) == 2
    assert hc._loopback("127.0.0.2") and hc._loopback("::1") and hc._loopback("[::1]") and not hc._loopback("10.0.0.1")


# ============================================================================ the clients, each against every
# hostile server: an endless stream or a huge Content-Length fails at the cap (CAP = 1 MiB), a trickle at the deadline


@pytest.fixture
def small_caps(monkeypatch):
    """The reward-model and vLLM completion caps (read at each call / when a client is built) lowered to CAP, so
    the tests pass no new arguments (and also run against code without caps)."""
    monkeypatch.setattr(reward_model_module, "MAX_REPLY_BYTES", CAP, raising=False)
    monkeypatch.setattr(vllm_transport, "COMPLETION_REPLY_BYTES", CAP, raising=False)


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
def test_reward_model_client(hostile, small_caps, behaviour):
    srv = hostile(HOSTILE[behaviour])
    msg = _bounded(lambda: score_http(srv.url, ["p"], ["r"], timeout_s=DEADLINE, retries=0))
    assert f"POST {srv.url}/score" in msg and _why(behaviour) in msg


def test_reward_model_client_stops_an_endless_reply_at_its_default_cap(hostile):
    srv = hostile(endless)  # 64 MiB before it gives up; the default cap is 16 MiB
    with traced() as mem:
        err = _fails_in_time(lambda: score_http(srv.url, ["p"], ["r"], timeout_s=30, retries=0))
    assert "cap of 16777216 bytes" in _one_line(err)
    assert mem["peak"] < 3 * 16 * MIB  # code without a cap holds the whole 64 MiB (twice, joined)


def test_reward_model_client_gives_each_attempt_the_deadline(hostile):
    srv = hostile(trickle_body)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        score_http(srv.url, ["p"], ["r"], timeout_s=DEADLINE, retries=1)
    assert time.monotonic() - start < 2 * DEADLINE + 0.2 + SLACK  # two attempts and one 0.2 s back-off
    assert srv.requests == [b"POST /score HTTP/1.1"] * 2


EXAMPLES = [Example(prompt="p0", answer=""), Example(prompt="p1", answer="")]


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
def test_reward_model_verifier_fails_the_batch(hostile, small_caps, behaviour):
    srv = hostile(HOSTILE[behaviour])
    start = time.monotonic()
    out = reward_model(["a", "b"], EXAMPLES, url=srv.url, retries=0, timeout_s=DEADLINE)
    assert time.monotonic() - start < DEADLINE + SLACK
    assert all(r.failed and r.score == 0.0 and _why(behaviour) in r.error for r in out), out[0].error


@pytest.mark.parametrize("body", [b"[0.5, -0.5]", b'"scores"', b"null", b'{"scores": {"a": 1}}', b"{}"])
def test_reward_model_reply_of_another_shape_fails_the_batch(hostile, body):
    """JSON that is not {"scores": [...]} (a bare list crashed the run with a TypeError before): failed results."""
    srv = hostile(_json(body))
    out = reward_model(["a", "b"], EXAMPLES, url=srv.url, retries=0, timeout_s=DEADLINE)
    assert all(r.failed and "where 2 scores were expected" in r.error for r in out), out[0].error


@pytest.mark.parametrize("body", [b"[]", b"", b'{"data": []}', b'{"object": "list"}'])
def test_a_model_list_of_another_shape_is_a_one_line_error(hostile, body):
    srv = hostile(_json(body))
    with pytest.raises(OSError, match=r"v1/models: not an OpenAI-compatible model list"):
        VLLMScorer(srv.url, timeout_s=DEADLINE)
    with pytest.raises(ConfigError, match="distill.teacher.url"):  # the teacher: a config error at start-up
        ServerTeacher(srv.url, None, timeout_s=DEADLINE)


def test_reward_model_verifier_takes_its_cap_from_its_kwargs(hostile):
    srv = hostile(_json(b'{"scores": [0.5, -0.5]}'))  # 1 + 8 + 2 + 1 + 3 + 2 + 4 + 1 + 1 = 23 bytes
    assert [r.score for r in reward_model(["a", "b"], EXAMPLES, url=srv.url, max_reply_bytes=23)] == [0.5, -0.5]
    out = reward_model(["a", "b"], EXAMPLES, url=srv.url, max_reply_bytes=22)
    assert all(r.failed and "over the cap of 22 bytes" in r.error for r in out)


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
def test_env_client(hostile, behaviour):
    srv = hostile(HOSTILE[behaviour])
    client = HTTPEnvClient(srv.url, "calc", timeout_s=DEADLINE, retries=0, max_reply_bytes=CAP)
    msg = _bounded(lambda: client.reset(0), EnvError)
    why = "answer longer than 1048576 bytes" if behaviour in ("endless", "huge_length") else \
        f"timed out after {DEADLINE:g} s (whole-call deadline)"
    assert msg == f"calc: POST /create failed: {why}"


MODELS = _json(b'{"data": [{"id": "m"}]}')
OK = _json(b"{}")


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
def test_weight_sync(hostile, behaviour):
    srv = hostile(HOSTILE[behaviour])
    sync = HTTPWeightSync(srv.url, timeout_s=DEADLINE)  # its default cap: 1 MiB = CAP
    msg = _bounded(lambda: sync.post("update_weights", {"update_info": {"blob": "AAAA"}}))
    assert f"POST {srv.url}/update_weights" in msg and _why(behaviour) in msg


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
def test_vllm_scorer_completions(hostile, small_caps, behaviour):
    srv = hostile(HOSTILE[behaviour], {"/v1/models": MODELS})
    scorer = VLLMScorer(srv.url, timeout_s=DEADLINE)
    try:
        msg = _bounded(lambda: scorer.score([[1, 2, 3]]))
    finally:
        scorer.close()
    assert f"POST {srv.url}/v1/completions" in msg and _why(behaviour) in msg


def test_vllm_scorer_takes_its_cap_from_its_arguments(hostile):
    srv = hostile(_json(b'{"tokens": [1, 2]}'), {"/v1/models": MODELS})  # 1 + 8 + 2 + 1 + 1 + 2 + 1 + 1 + 1 = 18 bytes
    assert VLLMScorer(srv.url, timeout_s=DEADLINE, max_reply_bytes=18).tokenize("ab") == [1, 2]
    with pytest.raises(OSError, match="over the cap of 17 bytes"):
        VLLMScorer(srv.url, timeout_s=DEADLINE, max_reply_bytes=17).tokenize("ab")


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
def test_distill_teacher_model_list(hostile, behaviour):
    srv = hostile(HOSTILE[behaviour])  # GET /v1/models: the 1 MiB control cap
    msg = _bounded(lambda: ServerTeacher(srv.url, None, timeout_s=DEADLINE), ConfigError)
    assert f"cannot reach a vLLM server there (GET {srv.url}/v1/models" in msg and _why(behaviour) in msg


def _server(url: str) -> ServerVLLM:
    return ServerVLLM(url=url, model_path=None, seed=0, opts=VLLMOptions(mode="server", request_timeout_s=DEADLINE))


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
def test_vllm_server_transport(hostile, small_caps, behaviour):
    bad = HOSTILE[behaviour]
    srv = hostile(OK, {"/v1/models": MODELS, "/v1/completions": bad, "/weight_info": bad})
    server = _server(srv.url)
    try:
        msg = _bounded(lambda: server.complete([[1, 2]], [{"logprobs": 0, "max_tokens": 4}]))
        assert f"POST {srv.url}/v1/completions" in msg and _why(behaviour) in msg
        msg = _bounded(server.served_version)  # GET weight_info: the 1 MiB control cap
        assert f"GET {srv.url}/weight_info" in msg and _why(behaviour) in msg
    finally:
        server.close()
