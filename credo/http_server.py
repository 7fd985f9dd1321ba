"""Connection-level hardening shared by credo's three HTTP servers (``credo sandbox serve``, ``credo env serve``,
``credo rm serve``): slow or greedy clients cannot lock the others out (``docs/security.md``).

:class:`ServerLimits` holds the bounds; each is a flag of the three serve commands (:func:`add_limit_args`):

* **connections**: at most ``max_connections`` open connections per server and ``max_connections_per_peer`` per
  client address (an IPv6 client counts per /64); a connection over either cap is answered 503 and closed as soon
  as it is accepted, before anything of it is parsed. The server's open-file limit is raised to fit the cap
  (:func:`fit_fd_limit`), so accepting never fails for lack of descriptors;
* **request head**: a connection must deliver a complete request head within ``header_timeout_s`` of connecting
  or of its previous response ending (keep-alive), and a head may not exceed ``max_header_bytes``; otherwise it is
  closed (408 / 431 when nothing was answered on it yet). The clock is not reset by bytes that arrive, so a head
  trickled one byte at a time is closed too. This is :func:`guarded_protocol`, a subclass of the protocol uvicorn
  would pick (httptools' when importable, else h11's) that counts connections and watches the ASGI calls;
* **request body**: :class:`BodyLimit`, an ASGI middleware, reads the whole body before the app sees it, within
  ``body_timeout_s`` (else 408 and close) and up to ``max_body_bytes`` (413 before reading when Content-Length is
  larger; a chunked body is counted as it arrives, 413 once past the cap), then replays it to the app.

:func:`install_body_limit` puts :class:`BodyLimit` into a FastAPI app (call it before
:func:`credo.http_auth.install_bearer_auth`, so a request without the token is refused before its body is read);
:func:`serve` runs an app under uvicorn with the guarded protocol. This module imports nothing else of credo.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable

if TYPE_CHECKING:
    import asyncio  # imported where it runs: every credo command imports this module for its flags

MiB = 2**20
FD_RESERVE = 256  # descriptors kept for everything but client connections (logs, workers' pipes, models)


@dataclass(frozen=True)
class ServerLimits:
    """The connection, head and body bounds of one server (module docstring); the defaults are the flags'."""

    max_connections: int = 512
    max_connections_per_peer: int = 64
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 8 * MiB

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_peer", "max_header_bytes", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


# ------------------------------------------------------------------------------------------------ CLI flags

def add_limit_args(parser: argparse.ArgumentParser, *, max_request_mb: int | None, body_note: str = "") -> None:
    """The flags of :class:`ServerLimits` on a serve command's parser; ``--max-request-mb`` (the body cap, default
    ``max_request_mb``, ``body_note`` added to its help) only when it is not None (``credo rm serve`` keeps its
    ``--max-request-bytes``)."""
    d = ServerLimits()
    parser.add_argument("--max-connections", type=int, default=d.max_connections,
                        help=f"open connections at most; more get 503 and are closed (default {d.max_connections})")
    parser.add_argument("--max-connections-per-peer", type=int, default=d.max_connections_per_peer,
                        help="open connections per client address (IPv6: per /64) at most "
                        f"(default {d.max_connections_per_peer})")
    parser.add_argument("--header-timeout-s", type=float, default=d.header_timeout_s,
                        help="seconds a connection has to send a complete request head, from connecting or from "
                        f"its previous response (default {d.header_timeout_s:g})")
    parser.add_argument("--body-timeout-s", type=float, default=d.body_timeout_s,
                        help=f"seconds a request has to send its whole body; then 408 (default {d.body_timeout_s:g})")
    parser.add_argument("--max-header-kb", type=int, default=d.max_header_bytes // 1024,
                        help=f"largest request head in KiB; more: 431 (default {d.max_header_bytes // 1024})")
    if max_request_mb is not None:
        parser.add_argument("--max-request-mb", type=int, default=max_request_mb,
                            help=f"largest request body in MiB; more: 413 (default {max_request_mb}){body_note}")


def limits_from_args(args: argparse.Namespace, *, max_body_bytes: int | None = None) -> ServerLimits:
    """The :class:`ServerLimits` of parsed flags (:func:`add_limit_args`); ``max_body_bytes`` replaces
    ``--max-request-mb`` (``credo rm serve``'s ``--max-request-bytes``). A bad value raises a one-line ValueError
    that names its flag."""
    checks = [("--max-connections", args.max_connections, int), ("--max-connections-per-peer",
              args.max_connections_per_peer, int), ("--header-timeout-s", args.header_timeout_s, float),
              ("--body-timeout-s", args.body_timeout_s, float), ("--max-header-kb", args.max_header_kb, int)]
    if max_body_bytes is None:
        checks.append(("--max-request-mb", args.max_request_mb, int))
    for flag, value, kind in checks:
        if not 0 < value < (1e6 if kind is float else 2**40):
            raise ValueError(f"{flag} must be {'> 0' if kind is float else '>= 1'}"
                             f"{' (seconds)' if kind is float else ''}, got {value:g}")
    body = max_body_bytes if max_body_bytes is not None else args.max_request_mb * MiB
    return ServerLimits(max_connections=args.max_connections, max_connections_per_peer=args.max_connections_per_peer,
                        header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                        max_header_bytes=args.max_header_kb * 1024, max_body_bytes=body)


# ------------------------------------------------------------------------------------------------ body limit

def _reply_bytes(status: int, detail: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps({"detail": detail}).encode()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")], body


async def _refuse(send: Callable[[dict], Awaitable[None]], status: int, detail: str) -> None:
    """Answer ``status`` with a JSON ``detail`` and ``Connection: close`` (uvicorn closes after it)."""
    headers, body = _reply_bytes(status, detail)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Refusal(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class _Gone(Exception):
    """The client disconnected while sending its body."""


class BodyLimit:
    """ASGI middleware: reads each HTTP request's whole body under a deadline and a byte cap, then replays it to
    ``app`` as one message (module docstring). ``flag`` names the cap's flag in the 413 detail."""

    def __init__(self, app: Any, *, max_body_bytes: int, body_timeout_s: float, flag: str = "--max-request-mb"):
        self.app, self.max_body_bytes, self.body_timeout_s, self.flag = app, max_body_bytes, body_timeout_s, flag

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        import asyncio

        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_length(scope)
            body = await asyncio.wait_for(self._read(receive), self.body_timeout_s)
        except _Refusal as exc:
            await _refuse(send, exc.status, exc.detail)
            return
        except asyncio.TimeoutError:
            await _refuse(send, 408, f"the request body did not arrive within {self.body_timeout_s:g} s "
                                     f"(--body-timeout-s)")
            return
        except _Gone:
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> _Refusal:
        return _Refusal(413, f"request body over {self.max_body_bytes} bytes ({self.flag})")

    def _check_length(self, scope: dict) -> None:
        """400 for a Content-Length that is not a number, 413 for one over the cap (nothing read yet)."""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length":
                if not value.strip().isdigit():
                    raise _Refusal(400, "invalid Content-Length")
                if int(value) > self.max_body_bytes:
                    raise self._too_large()

    async def _read(self, receive: Callable) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Callable) -> Callable[[], Awaitable[dict]]:
    """A ``receive`` that gives ``body`` once, then whatever the connection says (a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict:
        return pending.pop() if pending else await receive()

    return replay


def install_body_limit(app: Any, limits: ServerLimits, *, flag: str = "--max-request-mb") -> None:
    """Add :class:`BodyLimit` to the FastAPI / Starlette ``app`` (before the bearer check is installed: that check
    then runs first, so a request without the token is answered 401 before its body is read)."""
    app.add_middleware(BodyLimit, max_body_bytes=limits.max_body_bytes, body_timeout_s=limits.body_timeout_s,
                       flag=flag)


# ------------------------------------------------------------------------------------------------ connections

def peer_key(transport: Any) -> str:
    """The address a connection counts against: the peer's IPv4 address (IPv4-mapped IPv6 included), its IPv6 /64,
    or ``"?"`` when the transport has none (a Unix socket)."""
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer:
        return "?"
    try:
        ip = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return str(peer[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class ConnectionTable:
    """Open connections of one server, in all and per peer (used on the event loop's thread only)."""

    def __init__(self, limits: ServerLimits):
        self.limits, self.total, self.per_peer = limits, 0, {}

    def admit(self, peer: str) -> bool:
        """Count one more connection of ``peer``; False (nothing counted) when a cap would be exceeded."""
        if self.total >= self.limits.max_connections \
                or self.per_peer.get(peer, 0) >= self.limits.max_connections_per_peer:
            return False
        self.total += 1
        self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
        return True

    def release(self, peer: str) -> None:
        self.total -= 1
        left = self.per_peer[peer] - 1
        if left:
            self.per_peer[peer] = left
        else:
            del self.per_peer[peer]


def _raw_reply(status: int, reason: str, detail: str, extra: bytes = b"") -> bytes:
    headers, body = _reply_bytes(status, detail)
    head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return f"HTTP/1.1 {status} {reason}\r\n".encode() + head + extra + b"\r\n" + body


_REFUSED = _raw_reply(503, "Service Unavailable", "too many connections (--max-connections, "
                      "--max-connections-per-peer)", b"retry-after: 1\r\n")
_HEAD_TIMEOUT = _raw_reply(408, "Request Timeout", "no complete request head in time (--header-timeout-s)")
_HEAD_TOO_LARGE = _raw_reply(431, "Request Header Fields Too Large", "request head too large (--max-header-kb)")


class _Guard:
    """Mixed in before uvicorn's HTTP protocol class by :func:`guarded_protocol`: the connection caps, the head
    deadline and the head size (module docstring). The protocol's ASGI app is wrapped to learn when a request
    starts (its head is complete), when its body is complete and when its response ends."""

    limits: ServerLimits
    table: ConnectionTable

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.app = self._tracked(self.app)  # uvicorn's HTTP protocols call self.app for each request
        self._peer: str | None = None  # set while the connection is counted in the table
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight = 0  # requests whose app call has started and whose response has not ended
        self._head_open = True  # the bytes arriving now belong to a request head
        self._head_bytes = 0
        self._answered = False  # a response was completed on this connection

    def connection_made(self, transport: Any) -> None:
        peer = peer_key(transport)
        if not self.table.admit(peer):
            transport.write(_REFUSED)
            transport.close()
            return
        self._peer = peer
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is None:
            return  # refused in connection_made: the protocol was never started
        self._cancel()
        self.table.release(self._peer)
        self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._peer is None:
            return
        cycle = getattr(self, "cycle", None)
        if self._head_open:
            self._head_bytes += len(data)
        super().data_received(data)
        if getattr(self, "cycle", None) is not cycle:  # a request head was completed by these bytes
            self._head_done()
        elif self._head_open and self._head_bytes > self.limits.max_header_bytes:
            self._close(_HEAD_TOO_LARGE)

    def pause_writing(self) -> None:
        if self._peer is not None:
            super().pause_writing()

    def resume_writing(self) -> None:
        if self._peer is not None:
            super().resume_writing()

    def _arm(self) -> None:
        self._cancel()
        self._timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timeout)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_done(self) -> None:
        self._cancel()
        self._head_open, self._head_bytes = False, 0

    def _head_timeout(self) -> None:
        self._timer = None
        if self._in_flight == 0:
            self._close(_HEAD_TIMEOUT if self._head_bytes else b"")

    def _close(self, reply: bytes) -> None:
        """Close the connection; ``reply`` is written first only when no request is running and none was answered
        on it (a stray reply on a kept-alive connection could be read as the answer to the client's next request)."""
        if self.transport.is_closing():
            return
        if reply and self._in_flight == 0 and not self._answered:
            self.transport.write(reply)
        self.transport.close()

    def _request_started(self) -> None:
        self._in_flight += 1
        self._head_done()

    def _request_ended(self) -> None:
        self._in_flight -= 1
        self._answered = True
        if self._in_flight == 0 and self._peer is not None and not self.transport.is_closing():
            if not self._head_open:
                self._head_open, self._head_bytes = True, 0
            self._arm()

    def _tracked(self, app: Callable) -> Callable:
        """``app`` reporting its request's start, body completion and response end to this connection."""

        async def tracked(scope: dict, receive: Callable, send: Callable) -> None:
            self._request_started()
            ended = False

            async def tracked_receive() -> dict:
                message = await receive()
                if message.get("type") == "http.request" and not message.get("more_body", False) \
                        and not self._head_open:
                    self._head_open, self._head_bytes = True, 0  # what arrives next is the next request's head
                return message

            async def tracked_send(message: dict) -> None:
                nonlocal ended
                await send(message)
                if message.get("type") == "http.response.body" and not message.get("more_body", False) \
                        and not ended:
                    ended = True
                    self._request_ended()

            try:
                await app(scope, tracked_receive, tracked_send)
            finally:
                if not ended:
                    self._request_ended()

        return tracked


def default_protocol_class() -> type:
    """The HTTP protocol class uvicorn's ``http="auto"`` picks: httptools' when importable, else h11's."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return HttpToolsProtocol


def guarded_protocol(limits: ServerLimits, base: type | None = None) -> type:
    """A uvicorn HTTP protocol class (``base``, default :func:`default_protocol_class`) under ``limits``, with its
    own :class:`ConnectionTable`: pass it as ``uvicorn.Config(http=...)``, one class per server."""
    base = base or default_protocol_class()
    return type(f"Guarded{base.__name__}", (_Guard, base), {"limits": limits, "table": ConnectionTable(limits)})


def fit_fd_limit(limits: ServerLimits, *, stream: Any = None) -> ServerLimits:
    """``limits`` once the open-file limit fits ``max_connections`` plus :data:`FD_RESERVE`: the soft limit is
    raised (up to the hard one) when it is lower; if it cannot be, the connection caps are lowered to fit, with a
    one-line warning. A server out of descriptors cannot accept anyone, so the caps must hold first."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = limits.max_connections + FD_RESERVE
    if soft == resource.RLIM_INFINITY or soft >= need:
        return limits
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError):
        pass
    if soft >= need:
        return limits
    room = max(1, soft - min(FD_RESERVE, soft // 2))
    print(f"warning: the open-file limit ({soft}) is too low for --max-connections {limits.max_connections}: "
          f"serving at most {room} connections", file=stream or sys.stderr, flush=True)
    return replace(limits, max_connections=room, max_connections_per_peer=min(room, limits.max_connections_per_peer))


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` / ``uvicorn.run`` options that enforce ``limits`` on connections and heads (the body
    limit is :func:`install_body_limit`'s); WebSocket upgrades are off (no credo server has a WebSocket route)."""
    return {"http": guarded_protocol(limits), "ws": "none",
            "timeout_keep_alive": max(1, min(5, int(limits.header_timeout_s)))}


def serve(app: Any, *, host: str, port: int, limits: ServerLimits, log_level: str = "warning",
          **uvicorn_kwargs: Any) -> None:
    """Run ``app`` (its body limit already installed) under uvicorn on ``host:port`` with the connection and head
    bounds of ``limits`` (after :func:`fit_fd_limit`); other uvicorn options pass through."""
    import uvicorn

    limits = fit_fd_limit(limits)
    uvicorn.run(app, host=host, port=port, log_level=log_level, **uvicorn_options(limits), **uvicorn_kwargs)
