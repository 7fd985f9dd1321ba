"""Tools served over the Model Context Protocol (optional extra ``mcp``): a synchronous client of one MCP server
launched as a subprocess over stdio, with the :class:`~credo.tools.schema.ToolSet` interface (``schemas()`` and
``call(name, arguments) -> (text, ok)``), so an environment can serve MCP tools to the agent loop.

    with MCPTools(["python", "my_server.py"]) as tools:
        tools.schemas()                      # the server's tools as OpenAI function schemas
        tools.call("add", {"a": 1, "b": 2})  # ("3", True); a tool error or a bad call: ("error: ...", False)

The session runs on a private asyncio event loop in a daemon thread (the agent loop is synchronous); every call
has a timeout, after which the call counts as failed (the server keeps running). docs/tools.md
"""
from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from credo.tools.schema import check_arguments


class MCPSessionEnded(RuntimeError):
    """The session to the server is over (the server did not start, exited, or the tools were closed); the
    session's own error, if any, is the ``__cause__``."""

    @classmethod
    def of(cls, why: BaseException) -> "MCPSessionEnded":
        exc = cls(f"MCP session ended: {why!r}")
        exc.__cause__ = None if isinstance(why, cls) else why
        return exc


def _require_mcp():
    try:
        import mcp
    except ImportError as exc:  # the optional extra
        raise ImportError("MCP tools need the mcp package: pip install 'credo[mcp]'") from exc
    return mcp


def result_text(result: Any) -> tuple[str, bool]:
    """(text, ok) of an MCP CallToolResult: its text blocks joined by newlines (structured content as JSON when
    there is no text), ok unless ``is_error``."""
    texts = [c.text for c in (result.content or []) if getattr(c, "type", "") == "text"]
    text = "\n".join(texts) if texts else json.dumps(getattr(result, "structured_content", None) or {})
    return (f"error: {text}" if result.is_error else text), not result.is_error


class MCPTools:
    """A running MCP server (``command``: argv of a stdio server) and the session to it. The session lives in one
    task of the private loop (anyio's cancel scopes must be entered and left in the same task); calls reach it
    through a queue."""

    def __init__(self, command: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 30.0) -> None:
        mcp = _require_mcp()
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="credo-mcp")
        self._thread.start()
        self._queue: asyncio.Queue | None = None
        params = mcp.StdioServerParameters(command=command[0], args=list(command[1:]), env=env)
        # the stdio transport built here: mcp 2.3's Client also accepts the parameters themselves, mcp 2.0's (which
        # verifiers 0.4.0 pins) only a transport: given the parameters it fails entering them as one (TypeError)
        client = mcp.Client(mcp.stdio_client(params), read_timeout_seconds=timeout_s)
        self._ended: BaseException | None = None  # why the session task ended (set on the loop)
        self._session = asyncio.run_coroutine_threadsafe(self._serve(client), self._loop)
        try:
            listed = self._run(lambda c: c.list_tools())
        except BaseException:
            self.close()
            raise
        self._tools = {t.name: t for t in listed.tools}

    async def _serve(self, client) -> None:
        self._queue = queue = asyncio.Queue()
        try:
            async with client:
                while (item := await queue.get()) is not None:
                    fn, future = item
                    try:
                        future.set_result(await fn(client))
                    except Exception as exc:  # handed to the caller's thread
                        future.set_exception(exc)
        except BaseException as exc:  # the server did not start or the session broke: fail the waiting calls
            self._ended = exc
            raise
        finally:
            self._ended = self._ended or MCPSessionEnded("closed")
            while not queue.empty():
                if (item := queue.get_nowait()) is not None and not item[1].done():
                    item[1].set_exception(MCPSessionEnded.of(self._ended))

    def _run(self, fn):
        """``await fn(client)`` in the session's task; TimeoutError after ``timeout_s``; MCPSessionEnded at once
        when the session is over (a server that did not start or exited: its error is the cause)."""
        async def submit():
            while self._queue is None:  # the session task has not started yet
                if self._session.done():
                    self._session.result()  # the server failed to start: raise its error
                await asyncio.sleep(0.01)
            if self._ended is not None:  # checked on the loop, so a call is either served or failed by _serve
                raise MCPSessionEnded.of(self._ended)
            future = self._loop.create_future()
            self._queue.put_nowait((fn, future))
            return await future

        done = asyncio.run_coroutine_threadsafe(asyncio.wait_for(submit(), self.timeout_s), self._loop)
        try:
            return done.result(self.timeout_s + 5)
        except (FutureTimeout, asyncio.TimeoutError):
            raise TimeoutError(f"MCP server did not answer within {self.timeout_s:g} s") from None

    def schemas(self) -> list[dict]:
        """The server's tools as OpenAI function schemas (their ``inputSchema`` as the parameters)."""
        return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                  "parameters": t.input_schema or {"type": "object", "properties": {}}}}
                for t in self._tools.values()]

    def call(self, name: str, arguments: Any) -> tuple[str, bool]:
        """(result text, ok) of one call; an unknown tool, arguments that do not fit the schema, a tool error or a
        timeout give an ``error: ...`` text and ok False."""
        tool = self._tools.get(name)
        if tool is None:
            return f"error: unknown tool {name!r} (tools: {', '.join(self._tools)})", False
        why = check_arguments(tool.input_schema or {}, arguments)
        if why:
            return f"error: {name}: {why}", False
        try:
            return result_text(self._run(lambda c: c.call_tool(name, arguments)))
        except (TimeoutError, MCPSessionEnded) as exc:
            return f"error: {name}: {exc}", False

    def close(self) -> None:
        """End the session (the server subprocess exits with it) and the private loop."""
        if not self._thread.is_alive():
            return
        try:
            if self._queue is not None:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
            self._session.result(self.timeout_s)
        except Exception:  # noqa: BLE001 - a session that failed has nothing left to close
            pass
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=self.timeout_s)

    def __enter__(self) -> "MCPTools":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
