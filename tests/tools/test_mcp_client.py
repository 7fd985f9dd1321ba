"""The MCP client (credo.tools.mcp_client): a real MCP server built with the mcp package's own server class
(FastMCP, named MCPServer in mcp 2), run over stdio as a subprocess; its tools listed as schemas and called."""
from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

import mcp  # noqa: F401  (the test extra installs it: a missing mcp fails here, never skips)

from credo.tools.mcp_client import MCPSessionEnded, MCPTools
from credo.tools.parsers import get_parser

SERVER = textwrap.dedent('''
    try:
        from mcp.server.mcpserver import MCPServer
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP as MCPServer

    server = MCPServer("credo-test", log_level="CRITICAL")


    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b


    @server.tool()
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()


    @server.tool()
    def broken(x: int) -> int:
        """Always fails."""
        raise ValueError("no")


    if __name__ == "__main__":
        server.run("stdio")
''')


def test_mcp_round_trip_over_stdio(tmp_path: Path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    with MCPTools([sys.executable, str(script)], timeout_s=60) as tools:
        schemas = {s["function"]["name"]: s["function"] for s in tools.schemas()}
        assert set(schemas) == {"add", "shout", "broken"}
        assert schemas["add"]["description"] == "Add two integers."
        assert schemas["add"]["parameters"]["required"] == ["a", "b"]
        assert schemas["add"]["parameters"]["properties"]["a"]["type"] == "integer"
        # a model's Hermes call, parsed and sent to the server: 2 + 40 = 42
        turn = get_parser("hermes").parse('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>')
        assert tools.call(turn.calls[0].name, turn.calls[0].arguments) == ("42", True)
        assert tools.call("shout", {"text": "hi"}) == ("HI", True)
        text, ok = tools.call("broken", {"x": 1})  # the tool raised on the server: an error result, not a crash
        assert not ok and text.startswith("error:")
        text, ok = tools.call("add", {"a": "two", "b": 1})  # refused before the server by the listed schema
        assert not ok and "must be integer" in text
        assert tools.call("nope", {})[1] is False
    assert not tools._thread.is_alive()


def test_a_server_that_exits_fails_the_session_at_once(tmp_path: Path):
    # mcp 2.0 (verifiers 0.4.0's pin) ended the session with an error the waiting call never heard of: it waited for
    # the whole timeout. The session's end now fails the waiting call with the session's error as the cause.
    started = time.monotonic()
    with pytest.raises(MCPSessionEnded) as failed:
        MCPTools([sys.executable, "-c", "import sys; sys.exit(3)"], timeout_s=60)
    assert time.monotonic() - started < 30
    assert failed.value.__cause__ is not None
    with pytest.raises(MCPSessionEnded) as failed:
        MCPTools([str(tmp_path / "no-such-server")], timeout_s=60)
    assert isinstance(failed.value.__cause__, FileNotFoundError)
