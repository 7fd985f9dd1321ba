"""Helpers for tests that start environment servers."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_request(conn) -> tuple[bytes, bytes] | None:
    """(head, body) of one HTTP request read from the raw socket ``conn`` (the body by its Content-Length), or None
    when the client hung up before its head was complete: the raw test servers' reader."""
    import re

    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.search(rb"content-length:\s*(\d+)", head, re.I)
    while m and len(body) < int(m.group(1)):
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


def post_json(url: str, body=None, headers: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    """(status, decoded JSON answer) of a POST of ``body`` (JSON-encoded unless bytes) to ``url``; a GET when
    ``body`` is None. HTTP errors are answers too."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def wait_up(url: str, proc=None, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/observation?id=-1", timeout=1)
        except urllib.error.HTTPError:
            return  # the server answered (404 for the unknown id)
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()[-2000:])
            time.sleep(0.1)
    raise TimeoutError(url)


@contextmanager
def env_server(name: str, *params: str):
    """``credo env serve NAME`` in a subprocess on a free loopback port; yields (url, process)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "credo.cli.main", "env", "serve", name, "--port", str(port),
                             *params], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, proc)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class JSONHandler(BaseHTTPRequestHandler):
    """Base of the tests' hand-written env servers: quiet, JSON replies, tolerant of clients that gave up."""

    def log_message(self, *args):
        pass

    def _reply(self, code: int, body: bytes) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and closed the connection
            pass
