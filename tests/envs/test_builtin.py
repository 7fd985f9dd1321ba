"""Environments: built-in task logic, action parsing, the HTTP server and client, and env faults."""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from credo.envs import (
    EVAL_OFFSET,
    ActionParser,
    EnvError,
    HTTPEnvClient,
    LocalEnvClient,
    eval_task_ids,
    get_env_spec,
    list_envs,
    train_task_ids,
)
from credo.envs.builtin import safe_eval, wordle_marks
from tests.env_util import JSONHandler, env_server, free_port


def test_registry_and_splits():
    assert set(list_envs()) >= {"calc", "maze", "wordle"}
    train = train_task_ids(100, seed=0)
    assert train == train_task_ids(100, seed=0) and train != train_task_ids(100, seed=1)
    assert all(t < EVAL_OFFSET for t in train) and all(t >= EVAL_OFFSET for t in eval_task_ids(10))
    with pytest.raises(KeyError, match="did you mean 'maze'"):
        get_env_spec("mazee")


def test_action_parser_takes_the_first_complete_action():
    p = ActionParser(("tool", "answer"))
    assert p.parse("think... <tool>1+2</tool> then <answer>3</answer>") == "tool:1+2"
    assert p.parse("<answer> 42 </answer>") == "answer:42"
    assert p.parse("<tool>1+2") is None and p.parse("nothing") is None


def test_calc_env():
    c = LocalEnvClient("calc")
    expr = c.reset(7)
    assert expr == LocalEnvClient("calc").reset(7)  # deterministic per task id
    value = safe_eval(expr)
    r = c.step(f"<tool>{expr}</tool>")
    assert r.observation == f"= {value}" and not r.done and r.info["tool_call"]
    assert c.step("<tool>__import__('os')</tool>").observation == "= error"
    assert c.step("no action here").info["invalid_action"]
    r = c.step(f"<answer>{value + 1}</answer>")
    assert r.done and r.reward == 0.0
    c.reset(7)
    r = c.step(f"<answer>{value}</answer>")
    assert r.done and r.reward == 1.0 and r.info["success"]


def test_maze_env_moves_walls_and_goal():
    c = LocalEnvClient("maze", size=3)
    obs = c.reset(1)
    assert obs.startswith("at ") and "goal" in obs
    env = c.env
    env.pos, env.goal, env.walls = (0, 0), (0, 2), {(0, 1)}
    assert c.step("<move>up</move>").observation.startswith("blocked")  # border
    assert c.step("<move>right</move>").observation.startswith("blocked")  # wall
    assert env.shortest_path() == ["down", "right", "right", "up"]
    for move in env.shortest_path()[:-1]:
        assert not c.step(f"<move>{move}</move>").done
    r = c.step("<move>up</move>")
    assert r.done and r.reward == 1.0


def test_wordle_marks_and_env():
    assert wordle_marks("cat", "cat") == "GGG"
    assert wordle_marks("act", "cat") == "YYG"
    assert wordle_marks("eee", "bee") == "XGG"  # duplicate letters count once per occurrence
    assert wordle_marks("dog", "cat") == "XXX"
    c = LocalEnvClient("wordle")
    c.reset(3)
    assert c.step("<guess>toolong</guess>").observation == "invalid guess"
    secret = c.env.secret
    r = c.step(f"<guess>{secret}</guess>")
    assert r.done and r.reward == 1.0


@pytest.mark.parametrize("name", ["calc", "maze", "wordle"])
def test_oracles_solve_their_environments(name):
    spec = get_env_spec(name)
    client = LocalEnvClient(name)
    for tid in train_task_ids(20, seed=3) + eval_task_ids(5):
        obs = client.reset(tid)
        for _ in range(12):
            r = client.step(spec.oracle(client.env, obs))
            obs = r.observation
            if r.done:
                break
        assert r.done and r.reward == 1.0


# ----------------------------------------------------------------------------- HTTP server and client

@pytest.fixture(scope="module")
def calc_server():
    with env_server("calc") as (url, proc):
        yield url, proc


def test_http_client_plays_an_episode_against_a_real_server(calc_server):
    url, _ = calc_server
    client = HTTPEnvClient(url, "calc", timeout_s=5)
    expr = client.reset(11)
    assert expr == LocalEnvClient("calc").reset(11)
    r = client.step(f"<tool>{expr}</tool>")
    assert r.observation == f"= {safe_eval(expr)}" and r.info["tool_call"]
    r = client.step(f"<answer>{safe_eval(expr)}</answer>")
    assert r.done and r.reward == 1.0
    assert client.step("garbage").info["invalid_action"]  # parsed client-side, never sent
    client.close()
    with urllib.request.urlopen(urllib.request.Request(url + "/create", data=b"{}", method="POST")) as resp:
        assert isinstance(json.loads(resp.read())["id"], int)


class _FaultyHandler(JSONHandler):
    mode = "ok"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/create":
            return self._reply(200, b'{"id": 0}')
        if self.path == "/reset":
            return self._reply(200, b'{"observation": "1+1"}')
        if self.mode == "500":
            return self._reply(500, b'{"detail": "boom"}')
        if self.mode == "hang":
            time.sleep(5)
            return self._reply(200, b'{}')
        if self.mode == "malformed":
            return self._reply(200, b'{"observation": "x", "reward": ')
        if self.mode == "wrong_fields":
            return self._reply(200, b'{"observation": 3, "reward": "a lot"}')
        return self._reply(200, b'{"observation": "ok", "reward": 0, "done": false}')


@pytest.fixture
def faulty():
    servers = []

    def start(mode: str) -> str:
        handler = type("H", (_FaultyHandler,), {"mode": mode})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()


@pytest.mark.parametrize("mode,message", [("500", "HTTP 500"), ("hang", "timed out"), ("malformed", "malformed JSON"),
                                          ("wrong_fields", "malformed step answer")])
def test_env_faults_raise_env_error(faulty, mode, message):
    client = HTTPEnvClient(faulty(mode), "calc", timeout_s=0.5, retries=1, backoff_s=0.01)
    assert client.reset(0) == "1+1"
    t0 = time.time()
    with pytest.raises(EnvError, match=message):
        client.step("<tool>1+1</tool>")
    assert time.time() - t0 < 3  # a step is not retried after a timeout (it may have been applied)


class _NoCloseHandler(JSONHandler):
    """An AgentGym-style server without /close (404), counting the requests it gets."""

    calls: list = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.calls.append(self.path)
        if self.path == "/create":
            return self._reply(200, b'{"id": 0}')
        if self.path == "/reset":
            return self._reply(200, b'{"observation": "1+1"}')
        return self._reply(404, b'{"detail": "Not Found"}')


def test_a_4xx_answer_is_not_retried():
    """Regression (issue 20): a server without /close cost 0.6 s per episode, every 404 retried with backoff."""
    handler = type("H", (_NoCloseHandler,), {"calls": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = HTTPEnvClient(f"http://127.0.0.1:{server.server_address[1]}", "calc", retries=3, backoff_s=0.2)
        assert client.reset(0) == "1+1"
        t0 = time.time()
        client.close()  # the 404 is swallowed by close(), as before, but asked once
        assert handler.calls.count("/close") == 1 and time.time() - t0 < 0.2
    finally:
        server.shutdown()


def test_refused_connection_is_retried_then_an_env_error():
    client = HTTPEnvClient(f"http://127.0.0.1:{free_port()}", "calc", timeout_s=0.5, retries=2, backoff_s=0.01)
    with pytest.raises(EnvError, match="connection refused"):
        client.reset(0)


def test_server_killed_mid_episode():
    with env_server("maze") as (url, proc):
        client = HTTPEnvClient(url, "maze", timeout_s=2, retries=1, backoff_s=0.01)
        client.reset(0)
        proc.kill()
        proc.wait()
        with pytest.raises(EnvError):
            client.step("<move>up</move>")



def test_a_builtin_environment_is_listed_and_found_without_importing_its_module_first():
    """The environment registry names its built-in modules (credo.registry.Registry builtins): the first listing
    or lookup imports them, the AgentGym prefix included."""
    import subprocess
    import sys

    code = ("import sys; from credo.envs.base import get_env_spec, list_envs; "
            "before = 'credo.envs.toolgraph' in sys.modules; names = list_envs(); "
            "print(before, 'credo.envs.toolgraph' in sys.modules, 'toolgraph' in names, 'verify' in names)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True", "True"]
    code = "from credo.envs.base import get_env_spec; print(get_env_spec('agentgym:textcraft').name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "agentgym:textcraft"
