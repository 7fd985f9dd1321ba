"""Shared HTTP hardening for credo's three servers (``credo sandbox serve``, ``credo env serve``, ``credo rm serve``).

* An optional bearer token: when a token is set, every request must carry ``Authorization: Bearer <token>``;
  anything else is answered 401 before the request body is read. ``GET /health`` is covered too (a probe that
  needs no token can use the TCP port). The token is compared in constant time.
* The token comes from ``--token`` or, so that it does not show in ``ps``, from an environment variable
  (``CREDO_SANDBOX_TOKEN`` / ``CREDO_ENV_TOKEN`` / ``CREDO_RM_TOKEN``, see :func:`resolve_token`).
* A warning on standard error when a server binds a non-loopback address without a token.

Clients (:mod:`credo.envs.client`, :func:`credo.rewards.reward_model.score_http`) send the
token with :func:`auth_headers`.
"""
from __future__ import annotations

import hmac
import ipaddress
import os
import sys
from typing import Any

TOKEN_ENV = {"sandbox": "CREDO_SANDBOX_TOKEN", "env": "CREDO_ENV_TOKEN", "rm": "CREDO_RM_TOKEN"}


def resolve_token(server: str, token: str | None = None) -> str | None:
    """``token`` if given (non-empty), else the server's environment variable (``TOKEN_ENV[server]``), else None."""
    if token:
        return token
    value = os.environ.get(TOKEN_ENV[server], "")
    return value or None


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; False for any other address, ``0.0.0.0`` and ``::`` included."""
    if host.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def warn_if_exposed(host: str, token: str | None, *, what: str, stream=None) -> bool:
    """Print a one-line warning when ``host`` is not loopback and no token is set; returns whether it warned."""
    if token or is_loopback(host):
        return False
    print(f"warning: {what} binds {host} without a token: anyone who can reach this address can use it "
          f"(set --token or the environment variable; see docs/security.md)", file=stream or sys.stderr, flush=True)
    return True


def auth_headers(token: str | None) -> dict[str, str]:
    """The request headers a client sends for ``token`` (none when the token is None)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def install_bearer_auth(app: Any, token: str | None) -> None:
    """Require ``Authorization: Bearer <token>`` on every request of the FastAPI ``app`` (no-op when None)."""
    if not token:
        return
    from fastapi.responses import JSONResponse

    expected = f"Bearer {token}".encode()

    @app.middleware("http")
    async def _require_token(request, call_next):
        got = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(got, expected):
            return JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401,  # and hang up:
                                headers={"WWW-Authenticate": "Bearer", "Connection": "close"})  # body unread
        return await call_next(request)
