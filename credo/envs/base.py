"""The environment protocol, the action parsers, and the registry of built-in environments.

An environment instance serves one episode at a time::

    obs = env.reset(task_id)                       # task_id picks the task deterministically ("data_idx")
    result = env.step(action)                      # StepResult(observation, reward, done, info)
    env.close()

Environments receive *parsed* actions. Parsing the model's text into an action belongs to the client
(AgentGym's convention): every registered environment names its :class:`ActionParser`, which
:class:`~credo.envs.client.LocalEnvClient` and :class:`~credo.envs.client.HTTPEnvClient` apply before
calling ``step``. A text without a valid action becomes an error observation with reward 0.

Task ids split into train (``0 <= id < EVAL_OFFSET``) and held-out evaluation (``id >= EVAL_OFFSET``) ranges.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from credo.registry import Registry

EVAL_OFFSET = 1_000_000


@dataclass
class StepResult:
    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    def reset(self, task_id: int) -> str: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ActionParser:
    """Finds ``<tag>content</tag>`` actions in model text. ``tags`` maps a tag to the action kind it produces;
    the action string passed to the environment is ``"kind:content"``. The *first* complete tag wins (the
    model should stop after one action per turn); a text with none is invalid."""

    tags: tuple[str, ...]

    def parse(self, text: str) -> str | None:
        best = None
        for tag in self.tags:
            m = re.search(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
            if m and (best is None or m.start() < best[0]):
                best = (m.start(), f"{tag}:{m.group(1).strip()}")
        return best[1] if best else None


@dataclass(frozen=True)
class EnvSpec:
    name: str
    factory: Callable[..., Env]  # factory(**params) -> a fresh instance
    parser: ActionParser
    instruction: str  # what the agent is told once, before the first observation
    params: dict[str, Any] = field(default_factory=dict)  # parameter defaults
    oracle: Callable[..., Any] | None = None  # oracle(env, observation) -> next action text (for SFT warm starts)
    # the environment's own action words, as AgentGym's clients send them ("move down", "f r o w n") -> credo's
    # "kind:argument" action, or None (credo.envs.server accepts both)
    native: Callable[[str], str | None] | None = None
    # task_group(params, task_id) -> a label (toolgraph: "tier2"); held-out evaluation reports success per label
    task_group: Callable[[dict[str, Any], int], str] | None = None
    # structured tool calling (credo.tools, docs/tools.md): the instance has ``tool_schemas()`` (OpenAI function
    # schemas), takes ``call:{"name", "arguments"}`` and ``answer:text`` actions, and its oracle returns a
    # credo.tools.parsers.ToolCall or the final answer's text
    tools: bool = False
    # task_space(params, split) -> [lo, hi) of the task ids of split ("train" / "eval") for an environment with a
    # bounded set of tasks (skyrl_gym:<id>: its dataset's rows); None = every id (train ids below EVAL_OFFSET)
    task_space: Callable[[dict[str, Any], str], tuple[int, int]] | None = None


# The built-in environments' modules are named, imported on the first lookup or listing (``verify``, AgentV-RL's
# agentic verifier, lives in its method package above this registry).
ENVS: Registry[EnvSpec] = Registry("environment", builtins=(
    "credo.envs.builtin", "credo.methods.agentic_verifier.env", "credo.envs.agentgym", "credo.envs.toolgraph",
    "credo.envs.tooled", "credo.envs.skyrl"))
# name prefixes resolved by a function instead of the registry ("agentgym:" -> credo.envs.agentgym.remote_spec,
# "skyrl_gym:" -> credo.envs.skyrl.skyrl_spec), filled by the built-in modules above
PREFIXES: Registry[Callable[[str], EnvSpec]] = Registry("environment prefix")


def register_env(spec: EnvSpec) -> EnvSpec:
    """Register ``spec`` under its name (a different spec under a taken name raises ValueError)."""
    return ENVS.add(spec.name, spec)


def list_envs() -> list[str]:
    return ENVS.names()


def get_env_spec(name: str) -> EnvSpec:
    """The spec of a registered environment, or of a name with a registered prefix (:data:`PREFIXES`):
    ``agentgym:<name>`` (an AgentGym server's contract from :data:`credo.envs.agentgym.ADAPTERS`),
    ``skyrl_gym:<id>`` (a skyrl-gym environment over a dataset of SkyRL rows, :mod:`credo.envs.skyrl`)."""
    ENVS.load_builtins()  # they register the prefixes too
    for prefix, resolve in PREFIXES.items():
        if name.startswith(prefix):
            return resolve(name)
    return ENVS.get(name)


def make_env(name: str, **params: Any) -> Env:
    """A fresh instance of ``name``; a bad parameter raises a one-line ValueError (see :func:`check_env_params`)."""
    spec = get_env_spec(name)
    return spec.factory(**check_env_params(name, params))


def check_env_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The defaults of ``name`` updated with ``params``, after checking every name and value type against the
    defaults (an int parameter takes an int, not a bool; a float one any finite number; a None default anything).
    Ranges are checked by the environment's constructor. Raises ValueError in one line."""
    spec = get_env_spec(name)
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        raise ValueError(f"environment {name!r} has no parameter(s) {unknown}; it takes: "
                         f"{', '.join(sorted(spec.params)) or 'none'}")
    for key, value in params.items():
        kind = _param_kind(spec.params[key], value)
        if kind:
            raise ValueError(f"environment {name!r}: parameter {key}={value!r} must be {kind}")
    return {**spec.params, **params}


def _param_kind(default: Any, value: Any) -> str:
    """'' when ``value`` has the kind of ``default``, else the kind it must have."""
    if default is None:
        return ""
    if isinstance(default, bool):
        return "" if isinstance(value, bool) else "true or false"
    if isinstance(default, int):
        return "" if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return "" if ok else "a finite number"
    if isinstance(default, (list, tuple)):
        return "" if isinstance(value, (list, tuple)) else "a list"
    return "" if isinstance(value, type(default)) else f"a {type(default).__name__}"


def train_task_ids(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(f"credo/env-train/{seed}")
    return [rng.randrange(EVAL_OFFSET) for _ in range(n)]


def eval_task_ids(n: int) -> list[int]:
    return [EVAL_OFFSET + i for i in range(n)]
