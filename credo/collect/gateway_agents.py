"""Running the user's agent of a ``gateway`` run (docs/bring-your-own.md): a Python callable (sync in a thread of
its own, async on the collector's event loop), a command (a subprocess per episode) or a verifiers environment
(credo.gateway.verifiers_env), each episode against its own key and deadline.

Every way an episode can fail raises :class:`EpisodeFailed` with a short ``reason`` (the metrics'
``gateway/failed/<reason>``): ``raised`` (the agent raised), ``timeout`` (past ``episode_timeout_s``),
``exit_code`` (a command exited non-zero), ``no_json`` (a command's last stdout line is not JSON), ``bad_reward``
(a return value that is not a reward: credo.gateway.contract.reward_of), ``no_calls`` (no model call: nothing to
train on), ``limit`` (the agent raised or exited after the gateway refused a call past the episode's
``max_calls`` / ``max_tokens`` / deadline or the model's context).
"""
from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import shlex
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from credo.config import ConfigError
from credo.gateway.contract import AgentClient, AgentSource

REASONS = ("raised", "timeout", "exit_code", "no_json", "bad_reward", "no_calls", "limit")
LIMIT_CODES = ("episode_limit", "context_length_exceeded")  # refusals that end an episode an agent does not catch


class EpisodeFailed(Exception):
    """An episode that is not trained on: ``reason`` (one of :data:`REASONS`) and a one-line message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def one_line(text: str, limit: int = 200) -> str:
    return " ".join(str(text).split())[:limit]


# ----------------------------------------------------------------------------- resolving the agent

_SOURCES: dict[str, AgentSource] = {}  # verifiers spec (JSON) -> its AgentSource, loaded once per process


def import_agent(spec: str) -> Callable:
    """The callable ``pkg.module:function`` names (a dotted attribute path after the colon works too); the working
    directory is searched last, so a ``my_agent.py`` beside the run's command is found."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # my_agent.py next to where `credo train` runs (as uvicorn's app dir)
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"rollout.collector.agent={spec}: cannot import {module_name} ({one_line(exc)})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"rollout.collector.agent={spec}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"rollout.collector.agent={spec}: {type(obj).__name__} {attr!r} is not callable")
    return obj


def verifiers_source(spec: dict) -> AgentSource:
    """The verifiers environment ``spec`` (``{env, args}``) as an AgentSource, by
    ``credo.gateway.verifiers_env.load_environment_agent`` (cached per process: the task data and the collector
    read the same one)."""
    key = json.dumps(spec, sort_keys=True, default=str)
    if key not in _SOURCES:
        try:
            from credo.gateway.verifiers_env import load_environment_agent
        except ImportError as exc:
            if "verifiers_env" in str(exc) or "load_environment_agent" in str(exc):
                raise NotImplementedError("rollout.collector.verifiers: this credo has no "
                                          "credo.gateway.verifiers_env.load_environment_agent (the verifiers "
                                          "adapter is not installed in this build)") from None
            raise
        source = load_environment_agent(spec)
        if not isinstance(source, AgentSource):
            raise TypeError(f"rollout.collector.verifiers={spec}: load_environment_agent returned a "
                            f"{type(source).__name__}, not an AgentSource (rows() and __call__)")
        _SOURCES[key] = source
    return _SOURCES[key]


@dataclass(frozen=True)
class AgentSpec:
    """One of: ``fn`` (a callable, or a verifiers AgentSource) or ``argv`` (a command)."""

    fn: Callable | None = None
    argv: tuple[str, ...] = ()
    label: str = ""

    @classmethod
    def of(cls, g) -> "AgentSpec":
        """The agent a ``GatewayCollectorConfig`` names."""
        if g.agent is not None:
            return cls(fn=import_agent(g.agent), label=g.agent)
        if g.command is not None:
            return cls(argv=tuple(shlex.split(g.command)), label=g.command)
        if g.verifiers is not None:
            return cls(fn=verifiers_source(g.verifiers), label=f"verifiers:{g.verifiers['env']}")
        raise ConfigError("rollout.collector: set one of agent, command and verifiers")

    async def run(self, row: dict, client: AgentClient, timeout_s: float) -> Any:
        """The agent's return value (a command's parsed last stdout line); :class:`EpisodeFailed` otherwise."""
        if self.argv:
            return await run_command(self.argv, row, client, timeout_s)
        assert self.fn is not None
        try:
            if _is_async(self.fn):
                return await asyncio.wait_for(self.fn(row, client), timeout_s)
            return await asyncio.wait_for(_in_thread(self.fn, row, client), timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            raise EpisodeFailed("timeout", f"the agent ran past rollout.collector.episode_timeout_s={timeout_s:g}") \
                from None
        except EpisodeFailed:
            raise
        except Exception as exc:
            raise EpisodeFailed("raised", f"the agent raised {type(exc).__name__}: {one_line(exc)}") from None


def _is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _in_thread(fn: Callable, row: dict, client: AgentClient) -> asyncio.Future:
    """``fn(row, client)`` in a daemon thread of its own (awaiting what it returns when that is awaitable): a sync
    agent that outlives its deadline is abandoned there (its later calls are refused), never joined."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not fut.done():
            fut.set_exception(error) if error is not None else fut.set_result(value)

    def work() -> None:
        value, error = None, None
        try:
            value = fn(row, client)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
        except BaseException as exc:  # handed to the episode's coroutine
            error = exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the step's loop is gone: the episode was given up long ago
            pass

    threading.Thread(target=work, name="credo-gateway-agent", daemon=True).start()
    return fut


async def _await(x: Any) -> Any:
    return await x


async def run_command(argv: tuple[str, ...], row: dict, client: AgentClient, timeout_s: float) -> Any:
    """One episode of a command agent: ``argv`` (no shell) with the episode's OpenAI variables and ``CREDO_TASK``
    in its environment, killed (its process group) at the deadline; its last non-empty stdout line, parsed as
    JSON, is the return value."""
    env = {**os.environ, **client.env(), "CREDO_TASK": json.dumps(row, default=str)}
    env["NO_PROXY"] = ",".join(x for x in (env.get("NO_PROXY", ""), "127.0.0.1,localhost") if x)
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    env=env, start_new_session=True)
    except OSError as exc:
        raise EpisodeFailed("raised", f"cannot start {argv[0]!r}: {one_line(exc)}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        _kill_group(proc.pid)
        await proc.wait()
        raise EpisodeFailed("timeout", f"the command ran past rollout.collector.episode_timeout_s={timeout_s:g}") \
            from None
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        raise
    if proc.returncode != 0:
        tail = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        raise EpisodeFailed("exit_code", f"the command exited with code {proc.returncode}"
                            + (f": {one_line(tail[-1])}" if tail else ""))
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        raise EpisodeFailed("no_json", "the command printed nothing on stdout (its last line must be the reward "
                            "as JSON: a number, a dict of components, or null)")
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise EpisodeFailed("no_json", f"the command's last stdout line is not JSON: {one_line(lines[-1], 80)!r}") \
            from None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # start_new_session: the group is the command and its children
    except (ProcessLookupError, PermissionError):
        pass
