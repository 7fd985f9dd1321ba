"""Bounded HTTP calls, shared by every HTTP client credo has: the reward-model client
(:func:`credo.rewards.reward_model.score_http`), the environment client (:class:`credo.envs.client.HTTPEnvClient`),
the vLLM server transport and weight sync (:mod:`credo.rollout.vllm_transport`, :mod:`credo.rollout.vllm_sync`) and
the distillation teacher (:class:`credo.rollout.vllm_transport.VLLMScorer`).

:func:`request` makes one HTTP/1.1 call (``http://`` or ``https://``) with two bounds that ``urllib`` lacks:

* a whole-call deadline, ``deadline_s``: connecting, the TLS handshake, sending the request, the status line, the
  headers and the body share it. Every socket operation waits at most the time left (the socket's timeout is set to
  it before each receive), so a server that trickles a byte at a time is cut at the deadline however steadily the
  bytes come (:class:`DeadlineExceeded`). No thread is started.
* a reply cap, ``max_reply_bytes``: a ``Content-Length`` above it fails before the body is read; any other body is
  read in chunks and the call fails as soon as more than the cap arrived (:class:`ReplyTooLarge`), so an endless
  chunked stream costs at most the cap in memory (header lines and count are bounded by ``http.client``).

Every failure is an :class:`OSError`, so code that treats an ``OSError`` as a failed call keeps doing so: the
:class:`HTTPCallError` family below (one-line messages naming the method and URL), or the socket's own error when
the server cannot be reached (``ConnectionRefusedError``, ``socket.gaierror``, ...). A reply with a status other
than 2xx is an :class:`HTTPStatusError` carrying the status and the body's first bytes; redirects are not followed.

Proxies are used as ``urllib`` uses them (``http_proxy`` / ``https_proxy`` / ``no_proxy``; ``https`` through a
``CONNECT`` tunnel), except that a loopback host is always called directly. Not bounded by the deadline: the host-name lookup (``getaddrinfo`` takes no timeout; an IP
address needs none).

This module imports nothing from credo (it sits at the bottom layer, as :mod:`credo.http_auth`).
"""
from __future__ import annotations

import base64
import functools
import http.client
import io
import ipaddress
import json
import socket
import ssl
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping

CHUNK_BYTES = 256 << 10  # the body is read this much at a time (at most cap + 1 bytes are ever held)
ERROR_BODY_BYTES = 1000  # of a non-2xx reply's body, kept for the error message
USER_AGENT = "credo"


class HTTPCallError(OSError):
    """One HTTP call failed (the base of this module's errors); ``url`` is the URL called."""

    def __init__(self, message: str, *, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class DeadlineExceeded(HTTPCallError, TimeoutError):
    """The call did not complete (connect to the reply's last byte) within its deadline."""


class ReplyTooLarge(HTTPCallError):
    """The reply's body is longer than the call's cap (announced by Content-Length, or as it arrived)."""


class BadReply(HTTPCallError):
    """The reply broke HTTP: a garbage status line, malformed headers or chunking, a body cut short."""


class HTTPStatusError(HTTPCallError):
    """The server answered with a status other than 2xx; ``body`` is at most the first ``ERROR_BODY_BYTES``."""

    def __init__(self, message: str, *, url: str, status: int, reason: str, body: bytes) -> None:
        super().__init__(message, url=url)
        self.status, self.reason, self.body = status, reason, body


@dataclass(frozen=True)
class Reply:
    """A 2xx reply: its status, headers (lower-case names) and whole body."""

    status: int
    headers: dict[str, str]
    body: bytes


def request(url: str, *, method: str = "GET", body: bytes | None = None, headers: Mapping[str, str] | None = None,
            deadline_s: float, max_reply_bytes: int) -> Reply:
    """One call to ``url``, complete (every byte of the reply read) within ``deadline_s`` seconds and with a body of
    at most ``max_reply_bytes``; raises as the module docstring says (ValueError for a URL that is not http(s))."""
    if not deadline_s > 0 or max_reply_bytes < 0:
        raise ValueError(f"deadline_s must be > 0 and max_reply_bytes >= 0, got {deadline_s!r}, {max_reply_bytes!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {_shown(url)!r}")
    call = _Call(method, url, deadline_s)
    conn, target, extra = _connection(parts, call)
    sent = {"User-Agent": USER_AGENT, "Connection": "close", **extra, **(headers or {})}
    resp: http.client.HTTPResponse | None = None
    try:
        conn.request(method, target, body=body, headers=sent)
        resp = conn.getresponse()
        if not 200 <= resp.status < 300:
            raise _status_error(resp, call)
        got = {k.lower(): v for k, v in resp.getheaders()}
        return Reply(resp.status, got, _read_body(resp, call, max_reply_bytes))
    except HTTPCallError:
        raise
    except TimeoutError:  # connecting or sending ran out of the time left, or the OS gave up before (ETIMEDOUT)
        if call.end - time.monotonic() > 0.05:
            raise
        raise call.late() from None
    except http.client.HTTPException as exc:  # BadStatusLine, IncompleteRead, LineTooLong, ... (not OSErrors)
        raise BadReply(f"{call.what}: {type(exc).__name__}: {_one_line(str(exc))}", url=call.url) from None
    finally:  # the response holds the socket open on its own once the connection handed it over: close both now
        if resp is not None:
            resp.close()
        conn.close()


def request_json(url: str, payload: Any = None, *, method: str | None = None,
                 headers: Mapping[str, str] | None = None, deadline_s: float, max_reply_bytes: int) -> Any:
    """:func:`request` with a JSON body (``payload``; POST when given, else GET unless ``method`` says) and a JSON
    reply: its decoded value, None for an empty body; a malformed one is a ValueError."""
    body = None if payload is None else json.dumps(payload).encode()
    sent = {"Content-Type": "application/json", **(headers or {})} if body is not None else dict(headers or {})
    reply = request(url, method=method or ("GET" if body is None else "POST"), body=body, headers=sent,
                    deadline_s=deadline_s, max_reply_bytes=max_reply_bytes)
    return json.loads(reply.body) if reply.body.strip() else None


# ------------------------------------------------------------------------------------------ the call's deadline

class _Call:
    """One call's deadline (on the monotonic clock) and its name in error messages (``METHOD URL``)."""

    def __init__(self, method: str, url: str, deadline_s: float) -> None:
        self.url, self.deadline_s = _shown(url), deadline_s
        self.what = f"{method} {self.url}"
        self.end = time.monotonic() + deadline_s

    def left(self) -> float:
        """Seconds left (> 0); DeadlineExceeded when none are."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.late()
        return left

    def late(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"{self.what}: no complete reply within {self.deadline_s:g} s (whole-call deadline)",
                                url=self.url)


class _DeadlineIO(io.RawIOBase):
    """A socket's receiving side where no receive outlasts the call's deadline. It reads through the socket's own
    ``makefile`` object, which keeps the socket open while the response is read (``HTTPConnection.getresponse``
    closes the connection's reference early when the reply ends with the connection)."""

    def __init__(self, sock: socket.socket, call: _Call) -> None:
        super().__init__()
        self._sock, self._raw, self._call = sock, sock.makefile("rb", buffering=0), call

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._call.left())
        try:
            return self._raw.readinto(buffer)
        except TimeoutError:  # socket.timeout; ssl's "The read operation timed out"
            raise self._call.late() from None

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Source:
    """Stands for the socket in ``HTTPResponse.__init__``, which only calls ``makefile``: the bounded reader."""

    def __init__(self, sock: socket.socket, call: _Call) -> None:
        self.sock, self.call = sock, call

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineIO(self.sock, self.call))


class _Response(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, debuglevel: int = 0, method: str | None = None, url: str | None = None,
                 *, call: _Call) -> None:
        super().__init__(_Source(sock, call), debuglevel, method, url)  # type: ignore[arg-type]


class _HTTP(http.client.HTTPConnection):
    """A connection whose connect, send and every receive end by the call's deadline."""

    def __init__(self, host: str, port: int, call: _Call) -> None:
        super().__init__(host, port, timeout=call.left())
        self.call = call
        self.response_class = functools.partial(_Response, call=call)  # type: ignore[assignment]

    def connect(self) -> None:
        self.timeout = self.call.left()
        super().connect()  # TCP (and a proxy's CONNECT tunnel, read through _Response)
        self.sock.settimeout(self.call.left())  # sendall: the timeout bounds the whole send


class _HTTPS(_HTTP):
    """:class:`_HTTP` with TLS to ``server_name`` (the target host, also through a proxy's tunnel)."""

    default_port = http.client.HTTPS_PORT  # no ":443" in the Host header

    def __init__(self, host: str, port: int, call: _Call, *, server_name: str) -> None:
        super().__init__(host, port, call)
        self.server_name = server_name

    def connect(self) -> None:
        super().connect()
        # ssl counts one timeout for a whole handshake / read / write, so the handshake ends by the deadline too
        self.sock = _tls_context().wrap_socket(self.sock, server_hostname=self.server_name)
        self.sock.settimeout(self.call.left())


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """The default verifying context (system CAs, ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), built once."""
    return ssl.create_default_context()


def _connection(parts: urllib.parse.SplitResult, call: _Call) -> tuple[_HTTP, str, dict[str, str]]:
    """The connection for the URL ``parts`` (direct, or through the proxy urllib would use), the request target
    and the extra headers the proxy needs."""
    https = parts.scheme == "https"
    host, port = parts.hostname or "", parts.port or (443 if https else 80)
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    proxy = _proxy_for(parts.scheme, host)
    if proxy is None:
        return (_HTTPS(host, port, call, server_name=host) if https else _HTTP(host, port, call)), path, {}
    p = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
    auth = {}
    if p.username is not None:
        user = f"{urllib.parse.unquote(p.username)}:{urllib.parse.unquote(p.password or '')}"
        auth = {"Proxy-Authorization": "Basic " + base64.b64encode(user.encode()).decode("ascii")}
    if https:
        conn = _HTTPS(p.hostname or "", p.port or 80, call, server_name=host)
        conn.set_tunnel(host, port, headers=auth)
        return conn, path, {}
    return _HTTP(p.hostname or "", p.port or 80, call), urllib.parse.urlunsplit(parts._replace(fragment="")), auth


def _proxy_for(scheme: str, host: str) -> str | None:
    """The proxy urllib would use for ``scheme://host`` (``*_proxy`` and ``no_proxy``), or None; never one for a
    loopback host (``localhost``, 127.0.0.0/8, ``::1``): a call to this machine stays on it, whatever the proxy
    settings say (urllib would send it to the proxy unless ``no_proxy`` names it)."""
    if _loopback(host):
        return None
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return proxy


def _loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------------------------------ the reply

def _read_body(resp: http.client.HTTPResponse, call: _Call, cap: int) -> bytes:
    """The whole body, at most ``cap`` bytes of it ever held; ReplyTooLarge past it, BadReply when cut short."""
    if resp.length is not None and resp.length > cap:
        raise ReplyTooLarge(f"{call.what}: the reply announces {resp.length} bytes, over the cap of {cap} bytes",
                            url=call.url)
    chunks: list[bytes] = []
    size = 0
    while True:  # a Content-Length body in one read (one buffer), any other CHUNK_BYTES at a time
        chunk = resp.read(min(resp.length or CHUNK_BYTES, cap + 1 - size))
        if not chunk:
            break
        size += len(chunk)
        if size > cap:
            raise ReplyTooLarge(f"{call.what}: reply longer than the cap of {cap} bytes", url=call.url)
        chunks.append(chunk)
    if resp.length:  # Content-Length promised more than came before the connection closed
        raise BadReply(f"{call.what}: the reply ended after {size} of its {size + resp.length} bytes", url=call.url)
    return b"".join(chunks)


def _status_error(resp: http.client.HTTPResponse, call: _Call) -> HTTPStatusError:
    """The error of a non-2xx reply, with the first bytes of its body (whatever arrived of them in time)."""
    try:
        body = resp.read(ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException):
        body = b""
    return HTTPStatusError(f"{call.what}: HTTP {resp.status}: {body[:200]!r}", url=call.url, status=resp.status,
                           reason=resp.reason, body=body)


def _shown(url: str) -> str:
    """``url`` without a ``user:password@`` part (error messages name URLs)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]
