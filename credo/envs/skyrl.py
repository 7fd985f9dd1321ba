"""skyrl-gym environments as credo environments: ``skyrl_gym:<env id>`` over a dataset of SkyRL rows.

SkyRL's environments (the ``skyrl-gym`` package: ``gsm8k``, ``gsm8k_multi_turn``, ``text2sql``, ``search``,
``aime``, ``lcb``, ``searchcode``, or one a plugin registered with ``skyrl_gym.register``) are text-in / text-out:
``env.init(prompt messages) -> (messages, metadata)`` opens an episode, ``env.step(model text)`` answers
``observations`` (chat messages), ``reward``, ``done``, ``metadata``. Each episode is one row of a SkyRL dataset
(SkyRL's parquet layout: ``prompt`` as chat messages, ``env_class``, ``reward_spec``, ``extra_info``, and any other
column); the environment is built per row with ``skyrl_gym.make(env_id, env_config=..., extras=<the row without
prompt and env_class>)``, as SkyRL's own generator (``skyrl_gym_generator.py``) does::

    credo train rollout.collector.type=agent 'rollout.collector.envs=[skyrl_gym:gsm8k]' \\
        "rollout.collector.env_params={skyrl_gym:gsm8k: {data: train.parquet, eval_data: test.parquet}}" ...

Task ids map onto rows: training ids are ``0 .. len(data) - 1`` and held-out ids ``EVAL_OFFSET + i`` for the rows of
``eval_data`` (the ``data`` rows when it is not set), through :attr:`~credo.envs.base.EnvSpec.task_space`. Rows whose
``env_class`` names another environment are left out, so one mixed file can feed several ``skyrl_gym:*`` names
(``env_class: gsm8k`` takes a gsm8k file's rows for ``skyrl_gym:gsm8k_multi_turn``).

How an episode is rendered (docs/bring-your-own.md, "skyrl-gym environments"): the prompt's system messages are the
episode's instruction and its one user message the first observation (the agent loop renders both with the
tokenizer's chat template, as SkyRL does with ``apply_chat_template(prompt, add_generation_prompt=True)``); the
model's whole turn is the action (skyrl-gym parses it itself); each step's observation messages are joined into one
user turn (SkyRL appends them as chat messages); the episode's reward is the sum of its step rewards (``reward:
sum``, what SkyRL's GRPO sums over its token-level rewards) or the last step's (``reward: last``).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass
from typing import Any

from credo.envs.base import EVAL_OFFSET, PREFIXES, EnvSpec, StepResult
from credo.registry import UnknownName

PREFIX = "skyrl_gym:"

# parameter defaults (rollout.collector.env_params.<skyrl_gym:id>); check_env_params checks the kinds
PARAMS: dict[str, Any] = {
    "data": None,  # JSONL / Parquet file of SkyRL rows: the training tasks (required)
    "eval_data": None,  # the held-out tasks; None = the rows of data
    "env_class": None,  # the rows used: those whose env_class column is this (None = the environment's id) or unset
    # a field every row must have (a row without is skipped as a bad row); aime's rows: reward_model.ground_truth;
    # "" = no check
    "ground_truth_field": "reward_spec.ground_truth",
    "env_config": {},  # skyrl_gym.make's env_config (text2sql: {db_path: DIR}); over the env's *EnvConfig defaults
    "max_turns": None,  # extras["max_turns"], as SkyRL's generator sets it; None = the row's / the environment's own
    "reward": "sum",  # the episode's reward: "sum" of its step rewards or the "last" step's
    "success_reward": 1.0,  # an episode succeeded when its last step's own reward is at least this
}


@dataclass(frozen=True)
class WholeText:
    """An :class:`~credo.envs.base.ActionParser` look-alike: a skyrl-gym environment parses the model's whole turn
    itself (``<sql>``, ``<search>``, ``#### answer``), so every text is the action, unchanged."""

    tags: tuple[str, ...] = ()

    def parse(self, text: str) -> str:
        return text


@dataclass(frozen=True)
class SkyRLRow:
    """One task: the prompt's messages and the ``extras`` skyrl_gym.make receives (the row's other columns)."""

    messages: tuple[dict[str, str], ...]
    env_class: str | None
    extras: dict[str, Any]
    where: str  # file:row, for messages


# ------------------------------------------------------------------------------------------------ rows

def split_prompt(messages: list[dict[str, Any]], where: str) -> tuple[str, str]:
    """``(instruction, first observation)`` of a SkyRL prompt: its leading system messages (joined by blank
    lines) and the one user message after them. Any other layout (few-shot assistant turns, two user messages)
    raises ValueError: credo's agent loop opens an episode with an instruction and one observation."""
    systems = [m for m in messages[:-1] if m.get("role") == "system"]
    last = messages[-1] if messages else {}
    if len(systems) != len(messages) - 1 or last.get("role") != "user" or not isinstance(last.get("content"), str):
        layout = [m.get("role") for m in messages]
        raise ValueError(f"{where}: prompt roles {layout}: credo starts a skyrl-gym episode from system messages "
                         f"followed by one user message")
    return "\n\n".join(str(m["content"]) for m in systems), last["content"]


def observation_text(messages: list[dict[str, Any]] | None) -> str:
    """One observation text of a step's observation messages (their contents joined by newlines)."""
    return "\n".join(str(m.get("content", "")) for m in messages or [] if m)


def _raw_rows(path: str) -> list[tuple[int, Any]]:
    """(1-based line or row, parsed row) of a JSONL or Parquet file; a JSONL line that is no JSON is ``None``."""
    from credo.data.files import JSONL_SUFFIXES, PARQUET_SUFFIXES

    suffix = os.path.splitext(path)[1].lower()
    if suffix in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        return list(enumerate(pq.read_table(path).to_pylist(), 1))
    if suffix not in JSONL_SUFFIXES:
        raise ValueError(f"skyrl-gym dataset {path}: expected a {'/'.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)} file")
    out = []
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, 1):
            if text.strip():
                try:
                    out.append((line, json.loads(text)))
                except ValueError:
                    out.append((line, None))
    return out


def _row(raw: Any, where: str, ground_truth_field: str) -> SkyRLRow | str:
    """The task of one parsed row, or why it is a bad row."""
    if not isinstance(raw, dict):
        return "not a JSON object"
    prompt = raw.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt):
        return "prompt must be a list of {role, content} chat messages"
    if ground_truth_field:
        node: Any = raw
        for part in ground_truth_field.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return f"no {ground_truth_field}"
    messages = tuple({"role": m["role"], "content": m["content"]} for m in prompt)
    split_prompt(list(messages), where)  # the layout is checked once, at load (ValueError: not a bad row, a limit)
    env_class = raw.get("env_class")
    return SkyRLRow(messages, env_class if isinstance(env_class, str) else None,
                    {k: v for k, v in raw.items() if k not in ("prompt", "env_class")}, where)


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int, size: int, ground_truth_field: str) -> tuple[SkyRLRow, ...]:
    import warnings

    from credo.data.files import BadRowsWarning

    base = os.path.basename(path)
    rows, bad = [], []
    for line, raw in _raw_rows(path):
        row = _row(raw, f"{base}:{line}", ground_truth_field)
        if isinstance(row, str):
            bad.append(f"{base}:{line}: {row}")
        else:
            rows.append(row)
    if bad and not rows:
        raise ValueError(f"skyrl-gym dataset {path}: no valid row ({'; '.join(bad[:3])})")
    if bad:
        warnings.warn(f"skyrl-gym dataset {path}: skipped {len(bad)} of {len(bad) + len(rows)} rows: "
                      f"{'; '.join(bad[:5])}", BadRowsWarning, stacklevel=2)
    return tuple(rows)


def load_rows(path: str, env_class: str, ground_truth_field: str) -> tuple[SkyRLRow, ...]:
    """The rows of ``path`` whose ``env_class`` is ``env_class`` or unset, cached per file version; ValueError in
    one line when none is left."""
    path = os.path.realpath(os.fspath(path))
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"skyrl-gym dataset {path}: {exc.strerror or exc}") from None
    rows = _select(path, st.st_mtime_ns, st.st_size, ground_truth_field, env_class)
    if not rows:
        raise ValueError(f"skyrl-gym dataset {path}: no row of env_class {env_class!r} (the env_class parameter "
                         f"picks another)")
    return rows


@functools.lru_cache(maxsize=16)
def _select(path: str, mtime_ns: int, size: int, ground_truth_field: str, env_class: str) -> tuple[SkyRLRow, ...]:
    """The rows of one file version for ``env_class`` (an instance is built per episode: this is looked up, once)."""
    return tuple(r for r in _load(path, mtime_ns, size, ground_truth_field)
                 if r.env_class in (None, env_class))


def _check_params(env_id: str, params: dict[str, Any]) -> None:
    name = PREFIX + env_id
    for key in ("data", "eval_data"):
        value = params[key]
        if (key == "data" or value is not None) and not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"environment {name!r}: parameter {key} must be the path of a JSONL / Parquet file of "
                             f"SkyRL rows (rollout.collector.env_params={{{name}: {{data: FILE}}}}), got {value!r}")
    if params["env_class"] is not None and not isinstance(params["env_class"], str):
        raise ValueError(f"environment {name!r}: parameter env_class={params['env_class']!r} must be a string")
    if params["reward"] not in ("sum", "last"):
        raise ValueError(f"environment {name!r}: parameter reward={params['reward']!r} must be sum or last")
    turns = params["max_turns"]
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        raise ValueError(f"environment {name!r}: parameter max_turns={turns!r} must be null or an integer >= 1")


def task_space(env_id: str, params: dict[str, Any], split: str) -> tuple[int, int]:
    """[lo, hi) of the task ids of ``split``: the rows of ``data`` (train) or ``eval_data`` (eval)."""
    _check_params(env_id, params)
    path = params["data"] if split == "train" or params["eval_data"] is None else params["eval_data"]
    n = len(load_rows(path, params["env_class"] or env_id, params["ground_truth_field"]))
    return (0, n) if split == "train" else (EVAL_OFFSET, EVAL_OFFSET + n)


# ------------------------------------------------------------------------------------------------ the environment

def env_config(env_id: str, user: dict[str, Any]):
    """skyrl_gym.make's ``env_config``: an omegaconf DictConfig (skyrl-gym reads attributes: ``env_config.db_path``)
    of ``user`` over the defaults of the environment module's ``*EnvConfig`` dataclass, when it has exactly one
    (``Text2SQLEnvConfig``, ``SearchEnvConfig``), as SkyRL's config file sets them."""
    import importlib

    import skyrl_gym
    from omegaconf import OmegaConf

    entry = skyrl_gym.registry[env_id].entry_point
    defaults: dict[str, Any] = {}
    if isinstance(entry, str):
        module = importlib.import_module(entry.split(":")[0])
        found = [v for k, v in vars(module).items() if k.endswith("EnvConfig") and dataclasses.is_dataclass(v)
                 and getattr(v, "__module__", "") == module.__name__]
        if len(found) == 1:
            defaults = dataclasses.asdict(found[0]())
    return OmegaConf.create({**defaults, **user})


class SkyRLEnv:
    """credo's :class:`~credo.envs.base.Env` over one skyrl-gym environment id: a fresh skyrl-gym instance per
    episode, built from the task's row. ``instruction`` is the task's (its prompt's system messages), read by
    :class:`~credo.envs.client.LocalEnvClient` after every reset."""

    def __init__(self, env_id: str, **params: Any):
        _check_params(env_id, params)
        self.env_id, self.name, self.params = env_id, PREFIX + env_id, params
        env_class, truth = params["env_class"] or env_id, params["ground_truth_field"]
        self.train_rows = load_rows(params["data"], env_class, truth)
        self.eval_rows = self.train_rows if params["eval_data"] is None else \
            load_rows(params["eval_data"], env_class, truth)
        self.config = env_config(env_id, dict(params["env_config"]))
        self.instruction = ""
        self.env: Any = None
        self.total = 0.0

    def row(self, task_id: int) -> SkyRLRow:
        rows, i, split = (self.train_rows, task_id, "data") if task_id < EVAL_OFFSET else \
            (self.eval_rows, task_id - EVAL_OFFSET, "eval_data" if self.params["eval_data"] is not None else "data")
        if not 0 <= i < len(rows):
            raise ValueError(f"{self.name}: task id {task_id} is outside the {len(rows)} rows of {split}")
        return rows[i]

    def reset(self, task_id: int) -> str:
        import skyrl_gym

        row = self.row(task_id)
        self.close()
        extras = copy.deepcopy(row.extras)
        if self.params["max_turns"] is not None:
            extras["max_turns"] = self.params["max_turns"]
        self.env = skyrl_gym.make(self.env_id, env_config=self.config, extras=extras)
        messages, _ = self.env.init(copy.deepcopy(list(row.messages)))
        self.instruction, first = split_prompt(list(messages), f"{self.name} init() of {row.where}")
        self.total = 0.0
        return first

    def step(self, action: str) -> StepResult:
        if self.env is None:
            raise ValueError(f"{self.name}: step before reset")
        out = self.env.step(action)
        if out.get("postprocessed_action") is not None:
            raise NotImplementedError(f"{self.name} rewrote the model's action (postprocessed_action): credo trains "
                                      f"on the tokens the model sampled and does not re-encode a rewritten action")
        reward = out["reward"]
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"{self.name}: step answered the reward {reward!r}")
        self.total += float(reward)
        done = bool(out["done"])
        info: dict[str, Any] = {"success": float(reward) >= self.params["success_reward"]} if done else {}
        value = self.total if self.params["reward"] == "sum" else float(reward)
        return StepResult(observation_text(out.get("observations")), value, done, info)

    def close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            env.close()


# ------------------------------------------------------------------------------------------------ the name prefix

def env_ids() -> list[str]:
    """The environment ids skyrl-gym has registered (its built-ins and any a plugin added)."""
    import skyrl_gym

    return sorted(skyrl_gym.registry)


def skyrl_spec(name: str) -> EnvSpec:
    """The EnvSpec of ``skyrl_gym:<id>``: the whole turn is the action, the instruction comes with each task, the
    task space is the dataset's rows; no oracle (no warm start from demonstrations)."""
    env_id = name.removeprefix(PREFIX)
    try:
        known = env_ids()
    except ImportError:
        raise UnknownName(f"{name}: the skyrl-gym package is not installed (pip install skyrl-gym)") from None
    if env_id not in known:
        raise UnknownName(f"unknown skyrl-gym environment {env_id!r}; skyrl-gym has: {', '.join(known)} "
                          f"(a plugin module can add one with skyrl_gym.register)")
    return EnvSpec(name=PREFIX + env_id, factory=functools.partial(SkyRLEnv, env_id),  # type: ignore[arg-type]
                   parser=WholeText(), instruction="", params=copy.deepcopy(PARAMS),  # type: ignore[arg-type]
                   task_space=functools.partial(task_space, env_id))


PREFIXES.add(PREFIX, skyrl_spec)
