"""credo.http_auth: the bearer token shared by the three servers, loopback detection and the exposure warning."""
import io

import pytest

from credo.http_auth import auth_headers, install_bearer_auth, is_loopback, resolve_token, warn_if_exposed


@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
                                       ("localhost", True), ("0.0.0.0", False), ("::", False),
                                       ("192.168.1.4", False), ("example.org", False)])
def test_is_loopback(host, loop):
    assert is_loopback(host) is loop


def test_warn_only_when_exposed_without_token():
    out = io.StringIO()
    assert warn_if_exposed("0.0.0.0", None, what="credo env serve", stream=out)
    assert "0.0.0.0" in out.getvalue() and "token" in out.getvalue()
    out = io.StringIO()
    assert not warn_if_exposed("0.0.0.0", "s3cret", what="x", stream=out)
    assert not warn_if_exposed("127.0.0.1", None, what="x", stream=out)
    assert out.getvalue() == ""


def test_resolve_token_prefers_argument_then_env(monkeypatch):
    monkeypatch.setenv("CREDO_RM_TOKEN", "from-env")
    assert resolve_token("rm", "from-flag") == "from-flag"
    assert resolve_token("rm") == "from-env"
    monkeypatch.setenv("CREDO_RM_TOKEN", "")
    assert resolve_token("rm") is None
    assert auth_headers(None) == {} and auth_headers("t") == {"Authorization": "Bearer t"}


def test_bearer_middleware_rejects_missing_and_wrong_tokens():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    app = FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    install_bearer_auth(app, "s3cret")
    client = TestClient(app)
    assert client.get("/health").status_code == 401
    assert client.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/health", headers={"Authorization": "s3cret"}).status_code == 401
    ok = client.get("/health", headers=auth_headers("s3cret"))
    assert ok.status_code == 200 and ok.json() == {"status": "ok"}
