"""Serve any registered credo environment with the AgentGym HTTP contract (``credo env serve NAME``).

    POST /create                    -> {"id": int}
    POST /reset {"id", "data_idx"}  -> {"id", "observation"}
    POST /step  {"id", "action"}    -> {"observation", "reward", "done", "info"}
    GET  /observation?id=           -> {"observation"}
    POST /close {"id"}              -> {"closed": true}
    GET  /stats                     -> {"env", "created", "live", "steps"}   (credo's addition, for operators)

``env_idx`` is accepted wherever ``id`` is (AgentGym servers use both). Actions arrive parsed
(``kind:argument``); the client does the parsing. At most ``max_instances`` instances live at once (the
oldest is closed first), so clients that never call /close cannot exhaust the server.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Any

from credo.envs.base import get_env_spec, make_env


def create_app(env_name: str, *, max_instances: int = 4096, **params: Any):
    from fastapi import FastAPI, HTTPException

    get_env_spec(env_name)
    app = FastAPI(title=f"credo env: {env_name}")
    instances: OrderedDict[int, Any] = OrderedDict()
    observations: dict[int, str] = {}
    lock = threading.Lock()
    counter = itertools.count()
    stats = {"created": 0, "steps": 0}

    def get(body_or_id: Any) -> tuple[int, Any]:
        env_id = body_or_id if isinstance(body_or_id, int) else (body_or_id.get("id", body_or_id.get("env_idx")))
        with lock:
            if env_id not in instances:
                raise HTTPException(status_code=404, detail=f"no environment instance {env_id}")
            return env_id, instances[env_id]

    @app.post("/create")
    def create() -> dict[str, int]:
        env = make_env(env_name, **params)
        with lock:
            env_id = next(counter)
            instances[env_id] = env
            stats["created"] += 1
            while len(instances) > max_instances:
                old_id, old = instances.popitem(last=False)
                observations.pop(old_id, None)
                old.close()
        return {"id": env_id}

    @app.post("/reset")
    def reset(body: dict[str, Any]) -> dict[str, Any]:
        env_id, env = get(body)
        obs = env.reset(int(body.get("data_idx", body.get("item_id", 0))))
        observations[env_id] = obs
        return {"id": env_id, "observation": obs}

    @app.post("/step")
    def step(body: dict[str, Any]) -> dict[str, Any]:
        env_id, env = get(body)
        result = env.step(str(body.get("action", "")))
        with lock:
            stats["steps"] += 1
        observations[env_id] = result.observation
        return {"observation": result.observation, "reward": result.reward, "done": result.done, "info": result.info}

    @app.get("/observation")
    def observation(id: int | None = None, env_idx: int | None = None) -> dict[str, str]:
        env_id, _ = get(id if id is not None else env_idx)
        return {"observation": observations.get(env_id, "")}

    @app.post("/close")
    def close(body: dict[str, Any]) -> dict[str, bool]:
        env_id, env = get(body)
        with lock:
            instances.pop(env_id, None)
            observations.pop(env_id, None)
        env.close()
        return {"closed": True}

    @app.get("/stats")
    def get_stats() -> dict[str, Any]:
        with lock:
            return {"env": env_name, "live": len(instances), **stats}

    return app


def serve(env_name: str, *, host: str = "127.0.0.1", port: int = 8000, **params: Any) -> None:
    import uvicorn

    uvicorn.run(create_app(env_name, **params), host=host, port=port, log_level="warning")
