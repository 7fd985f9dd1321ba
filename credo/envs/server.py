"""Serve any registered credo environment with the AgentGym HTTP contract (``credo env serve NAME``).

    POST /create                    -> {"id": int}
    POST /reset {"id", "data_idx"}  -> {"id", "observation"}   (or item_id / game / seed: AgentGym's clients)
    POST /step  {"id", "action"}    -> {"observation", "reward", "done", "info"}
    GET  /observation?id=           -> "observation text"       (a bare string, as AgentGym servers answer)
    GET  /filtered_vocab?id=        -> ["word", ...]            (wordle: the words it accepts, AgentGym's route)
    POST /close {"id"}              -> {"closed": true}
    GET  /stats                     -> {"env", "created", "live", "steps"}   (credo's addition, for operators)

``env_idx`` is accepted wherever ``id`` is (AgentGym servers use both). An action is credo's ``kind:argument``
(what credo's client sends after parsing), the model's text with credo's tags (``<move>down</move>``), or
AgentGym's: the text after the last ``Action:`` in the environment's own words (``move down``, ``f r o w n``,
:attr:`credo.envs.base.EnvSpec.native`); anything else (or any action over ``MAX_ACTION_CHARS``, which is not
searched) goes to the environment as it is, which calls it invalid. At most ``max_instances`` instances live at
once (the oldest is closed first), so clients that never call /close cannot exhaust the server.

Input handling: ids and ``data_idx`` must be JSON integers (``0.0``, ``true`` or ``"0"`` are 422, as is a
missing id or a non-string action); an unknown id is 404. Calls on one instance (/reset, /step, /close) are
serialised by a lock of that instance; different instances run concurrently. With a ``token`` every request
needs ``Authorization: Bearer <token>`` (401 otherwise, :func:`credo.http_auth.install_bearer_auth`).
Connections, request heads and bodies (8 MiB by default, ``--max-request-mb``) are bounded by
:class:`credo.http_server.ServerLimits`.
"""
from __future__ import annotations

import itertools
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from credo.envs.base import check_env_params, get_env_spec, make_env
from credo.http_auth import install_bearer_auth, resolve_token, warn_if_exposed
from credo.http_server import ServerLimits, install_body_limit
from credo.http_server import serve as serve_http


@dataclass
class _Instance:
    """One live environment and the lock that serialises the calls made on it."""

    env: Any
    observation: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


def _int_field(value: Any, name: str) -> int:
    """``value`` if it is a JSON integer (bools and floats are not), else a 422."""
    from fastapi import HTTPException

    if not isinstance(value, int) or isinstance(value, bool):
        raise HTTPException(status_code=422, detail=f"{name} must be an integer, got {value!r:.80}")
    return value


RESET_KEYS = ("data_idx", "item_id", "game", "seed")  # credo, AgentGym's generic, LMRL-Gym maze, wordle


def _task_id(body: dict[str, Any]) -> int:
    """The task index of a /reset body: the first of ``RESET_KEYS`` present (0 when none is)."""
    key = next((k for k in RESET_KEYS if k in body), None)
    return 0 if key is None else _int_field(body[key], key)


MAX_ACTION_CHARS = 1 << 16  # longer actions are not searched for tags (a hostile one could cost quadratic time)


def as_action(env_name: str, text: str) -> str:
    """An action in any of the accepted forms (module docstring) as credo's ``kind:argument``."""
    spec = get_env_spec(env_name)  # a registered name or a prefixed one (skyrl_gym:<id>)
    kind, sep, _ = text.partition(":")
    if (sep and kind in spec.parser.tags) or len(text) > MAX_ACTION_CHARS:
        return text
    tagged = spec.parser.parse(text)
    if tagged is not None:
        return tagged
    words = text.rsplit("Action:", 1)[-1].strip().removesuffix("</s>").strip()
    native = spec.native(words) if spec.native is not None else None
    return native if native is not None else text


def _instance_id(body: dict[str, Any]) -> int:
    return _int_field(body.get("id", body.get("env_idx")), "id")


class _Pool:
    """The live instances of one environment: at most ``max_instances`` (creating one more closes the oldest),
    their ids and the server's counters. ``lock`` guards the pool; it is never held while waiting for an
    instance's own lock."""

    def __init__(self, env_name: str, params: dict[str, Any], max_instances: int):
        self.env_name, self.params, self.max_instances = env_name, params, max_instances
        self.instances: OrderedDict[int, _Instance] = OrderedDict()
        self.lock = threading.Lock()
        self.counter = itertools.count()
        self.counts = {"created": 0, "steps": 0}

    def get(self, env_id: int) -> _Instance:
        """The live instance ``env_id``, else a 404."""
        from fastapi import HTTPException

        with self.lock:
            if env_id not in self.instances:
                raise HTTPException(status_code=404, detail=f"no environment instance {env_id}")
            return self.instances[env_id]

    def create(self) -> int:
        """A new instance's id; the oldest instances beyond ``max_instances`` are closed."""
        env = make_env(self.env_name, **self.params)
        with self.lock:
            env_id = next(self.counter)
            self.instances[env_id] = _Instance(env)
            self.counts["created"] += 1
            evicted = [self.instances.popitem(last=False)[1] for _ in range(len(self.instances) - self.max_instances)]
        for old in evicted:
            with old.lock:
                old.env.close()
        return env_id

    def close(self, env_id: int) -> None:
        inst = self.get(env_id)
        with self.lock:
            self.instances.pop(env_id, None)
        with inst.lock:
            inst.env.close()

    def count_step(self) -> None:
        with self.lock:
            self.counts["steps"] += 1

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"env": self.env_name, "live": len(self.instances), **self.counts}


def create_app(env_name: str, *, max_instances: int = 4096, token: str | None = None,
               server_limits: ServerLimits | None = None, **params: Any):
    """The FastAPI app serving ``env_name``; bad ``params`` raise ValueError here, before anything is served.
    Request bodies are bounded by ``server_limits`` (default :class:`ServerLimits`: 8 MiB), after the bearer check."""
    from fastapi import FastAPI

    make_env(env_name, **check_env_params(env_name, params)).close()  # a probe: constructor range checks
    app = FastAPI(title=f"credo env: {env_name}")
    install_body_limit(app, server_limits or ServerLimits())
    install_bearer_auth(app, token)
    _add_routes(app, _Pool(env_name, params, max_instances))
    return app


def _add_routes(app, pool: _Pool) -> None:
    """The AgentGym routes (and /stats) over ``pool``."""
    from fastapi import HTTPException

    @app.post("/create")
    def create() -> dict[str, int]:
        return {"id": pool.create()}

    @app.post("/reset")
    def reset(body: dict[str, Any]) -> dict[str, Any]:
        env_id = _instance_id(body)
        task_id = _task_id(body)
        inst = pool.get(env_id)
        with inst.lock:
            inst.observation = inst.env.reset(task_id)
            instruction = getattr(inst.env, "instruction", None)  # a per-task one (skyrl_gym: the row's system)
            return {"id": env_id, "observation": inst.observation,
                    **({"instruction": instruction} if isinstance(instruction, str) else {})}

    @app.post("/step")
    def step(body: dict[str, Any]) -> dict[str, Any]:
        inst = pool.get(_instance_id(body))
        action = body.get("action", "")
        if not isinstance(action, str):
            raise HTTPException(status_code=422, detail=f"action must be a string, got {type(action).__name__}")
        with inst.lock:
            result = inst.env.step(as_action(pool.env_name, action))
            inst.observation = result.observation
        pool.count_step()
        return {"observation": result.observation, "reward": result.reward, "done": result.done, "info": result.info}

    def query_instance(id: str | None, env_idx: str | None) -> _Instance:
        text = id if id is not None else env_idx
        if text is None or not re.fullmatch(r"-?[0-9]{1,18}", text):
            raise HTTPException(status_code=422, detail=f"id (or env_idx) must be an integer, got {text!r:.80}")
        return pool.get(int(text))

    @app.get("/observation")
    def observation(id: str | None = None, env_idx: str | None = None) -> str:
        return query_instance(id, env_idx).observation

    @app.get("/filtered_vocab")
    def filtered_vocab(id: str | None = None, env_idx: str | None = None) -> list[str]:
        words = getattr(query_instance(id, env_idx).env, "words", None)
        if words is None:
            raise HTTPException(status_code=404, detail=f"{pool.env_name} has no vocabulary")
        return list(words)

    @app.post("/close")
    def close(body: dict[str, Any]) -> dict[str, bool]:
        pool.close(_instance_id(body))
        return {"closed": True}

    @app.get("/stats")
    def get_stats() -> dict[str, Any]:
        return pool.stats()


def serve(env_name: str, *, host: str = "127.0.0.1", port: int = 8000, token: str | None = None,
          max_instances: int = 4096, server_limits: ServerLimits | None = None, **params: Any) -> None:
    """Serve ``env_name`` on ``host:port``. The token is ``token`` or ``$CREDO_ENV_TOKEN`` (none: no
    authentication, and a warning on a non-loopback bind); connections, heads and bodies are bounded by
    ``server_limits`` (default :class:`ServerLimits`, :mod:`credo.http_server`). An unknown environment (KeyError)
    or a bad parameter (ValueError, or TypeError from an environment's own checks) raises before anything binds."""
    server_limits = server_limits or ServerLimits()
    token = resolve_token("env", token)
    app = create_app(env_name, max_instances=max_instances, token=token, server_limits=server_limits, **params)
    warn_if_exposed(host, token, what=f"credo env serve {env_name}")
    serve_http(app, host=host, port=port, limits=server_limits)
