"""What the gateway collector hands the user's agent and what the agent may return (docs/bring-your-own.md).

An agent is a Python callable, sync or async::

    def agent(task: dict, client: AgentClient) -> float | dict[str, float] | None: ...

``task`` is the task row (``prompt``, ``answer``, ``uid`` and every other field of the row), ``client`` the
OpenAI configuration of one episode: ``client.openai()`` / ``client.async_openai()`` build the ``openai``
package's clients pointed at the gateway, ``client.env()`` the ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` /
``OPENAI_MODEL`` variables a command agent gets. The return value is the episode's reward (a number), its reward
components (a dict of numbers; the reward is their sum unless it has a ``reward`` key), or None: the run's
verifier (``reward.*``) scores the final answer (the text of the episode's last completion).

An agent with its own tasks (a verifiers environment) is an :class:`AgentSource`: the collector takes the task
rows from ``rows`` instead of ``task.*``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, Union, runtime_checkable

AgentReturn = Union[float, int, dict, None]
Agent = Callable[[dict, "AgentClient"], Union[AgentReturn, Awaitable[AgentReturn]]]


@dataclass(frozen=True)
class AgentClient:
    """The OpenAI client configuration of one episode: the gateway's base URL (ending in ``/v1``), the episode's
    key (it scopes every call to this episode) and the served model name."""

    base_url: str
    api_key: str
    model: str
    timeout_s: float = 600.0

    def env(self) -> dict[str, str]:
        """The environment variables of a command agent (the ``openai`` package reads the first two itself)."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "OPENAI_MODEL": self.model}

    def openai(self, **kw: Any):
        """An ``openai.OpenAI`` client for this episode (no retries: a refused call is the agent's to handle)."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s,
                             max_retries=kw.pop("max_retries", 0), **kw)

    def async_openai(self, **kw: Any):
        """An ``openai.AsyncOpenAI`` client for this episode."""
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s,
                                  max_retries=kw.pop("max_retries", 0), **kw)


@runtime_checkable
class AgentSource(Protocol):
    """An agent that brings its own tasks (e.g. a verifiers environment with its dataset)."""

    def rows(self, split: str, size: int, seed: int) -> list[dict]:
        """At most ``size`` task rows of ``split`` ("train" or "eval"), each with a unique ``uid``."""

    def __call__(self, task: dict, client: AgentClient) -> AgentReturn | Awaitable[AgentReturn]: ...


class AgentResultError(ValueError):
    """An agent returned something that is not a reward."""


def reward_of(value: AgentReturn) -> tuple[float | None, dict[str, float]]:
    """(reward, components) of an agent's return value; (None, {}) when the verifier is to score. A reward that is
    not a finite number raises :class:`AgentResultError` (the episode is failed, not trained on)."""
    if value is None:
        return None, {}
    if isinstance(value, bool):
        raise AgentResultError(f"an agent returned {value!r}: return a number, a dict of numbers or None")
    if isinstance(value, (int, float)):
        return _finite("reward", value), {}
    if isinstance(value, dict):
        comps = {str(k): _finite(str(k), v) for k, v in value.items()}
        if "reward" in comps:
            return comps["reward"], {k: v for k, v in comps.items() if k != "reward"}
        return float(sum(comps.values())), comps
    raise AgentResultError(f"an agent returned a {type(value).__name__}: return a number, a dict of numbers or "
                           "None")


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AgentResultError(f"reward component {name!r} is {value!r}, not a number")
    x = float(value)
    if not math.isfinite(x):
        raise AgentResultError(f"reward component {name!r} is {x}, not a finite number")
    return x
