"""Issue 17, agent environments over HTTP: client failures become EnvErrors (item 6), env-failed episodes are left
out of the update and stop the run past a share (item 7), the env server's input handling and per-instance locks
(item 15), one-line errors of ``credo env serve`` (item 14) and its bearer token. Every server is on 127.0.0.1."""
from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import urllib.request
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.envs import EVAL_OFFSET, EnvError, HTTPEnvClient
from credo.envs.builtin import CalcEnv
from credo.models.tokenizer import build_char_tokenizer
from credo.rollout.agent_loop import AgentLoop, plain_template, to_trajectory
from credo.tracking.metrics import read_metrics
from credo.types import Example, RewardResult, SamplingParams, Trajectory
from tests.conftest import TINY_RUN
from tests.env_util import REPO, JSONHandler, free_port, read_request

# ============================================================================ item 6: broken servers

def _reply(body: bytes, *, status: bytes = b"200 OK", length: int | None = None) -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body


DEEP = b"[" * 100_000 + b"]" * 100_000  # valid JSON nested 100,000 levels deep
FAULTS = {  # what /step answers; /create and /reset behave
    "truncated": _reply(b'{"observation": "', length=100_000),  # IncompleteRead
    "garbage_status": b"SPAM/9 200 whatever\r\n\r\n",  # BadStatusLine
    "deeply_nested": _reply(DEEP),  # RecursionError in json.loads
    "reset": None,  # RST instead of an answer
    "error_truncated": _reply(b'{"detail": "', status=b"500 Internal Server Error", length=10_000),
    "bad_utf8": _reply(b'{"observation": "\xff\xfe", "reward": 0, "done": false}'),  # UnicodeDecodeError
    "nan_reward": _reply(b'{"observation": "x", "reward": NaN, "done": false}'),  # NaN would reach the loss
}


class RawServer:
    """A one-thread socket server: reads each request whole, answers /create and /reset, and /step with
    ``FAULTS[fault]`` (raw bytes, then closes). Accepts with a short timeout so it stops promptly."""

    def __init__(self, fault: str):
        self.fault = fault
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                conn.settimeout(5)
                try:
                    self._handle(conn)
                except OSError:
                    pass

    def _handle(self, conn: socket.socket) -> None:
        got = read_request(conn)
        if got is None:
            return
        head, body = got
        path = head.split(b" ")[1]
        if path == b"/create":
            conn.sendall(_reply(b'{"id": 0}'))
        elif path == b"/reset":
            conn.sendall(_reply(b'{"id": 0, "observation": "1+1"}'))
        elif self.fault == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
        else:
            conn.sendall(FAULTS[self.fault])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def raw_server():
    servers: list[RawServer] = []

    def start(fault: str) -> str:
        servers.append(RawServer(fault))
        return servers[-1].url

    yield start
    for s in servers:
        s.close()


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_every_transport_or_decoding_failure_is_an_env_error(raw_server, fault):
    client = HTTPEnvClient(raw_server(fault), "calc", timeout_s=5, retries=0)
    assert client.reset(0) == "1+1"
    with pytest.raises(EnvError) as info:
        client.step("<tool>1+1</tool>")
    assert "\n" not in str(info.value) and len(str(info.value)) < 600  # a short one-line message


def test_an_oversized_answer_is_an_env_error(raw_server):
    client = HTTPEnvClient(raw_server("deeply_nested"), "calc", timeout_s=5, retries=0, max_reply_bytes=1000)
    client.reset(0)
    with pytest.raises(EnvError, match="longer than 1000 bytes"):
        client.step("<tool>1+1</tool>")  # the reply is 200,000 bytes; only 1001 are read


class _ScriptedEngine:
    """Every turn is ``<tool>1+1</tool>`` and EOS (a valid calc action, so it reaches the server)."""

    def __init__(self, tok):
        self.tok = tok

    def continue_ids(self, prefixes, sp, stop_ids=(), top_logprobs=0, stop_sequences=()):
        from credo.rollout.hf import Continuation

        ids = list(self.tok("<tool>1+1</tool>", add_special_tokens=False)["input_ids"]) + [self.tok.eos_token_id]
        return [Continuation(ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop") for _ in prefixes]


def test_broken_servers_end_their_episodes_as_env_failures_not_the_rollout(raw_server):
    """One episode per broken server in one lockstep rollout: none raises out of the loop, each is a recorded
    env failure (zero score, ``failed``)."""
    tok = build_char_tokenizer()
    faults = sorted(FAULTS)
    clients = [HTTPEnvClient(raw_server(f), "calc", timeout_s=5, retries=0) for f in faults]
    examples = [Example(prompt=f"calc:{i}", answer="", uid=f"calc/{i}", meta={"env": "calc", "task_id": i})
                for i in range(len(faults))]
    loop = AgentLoop(_ScriptedEngine(tok), tok, plain_template(tok), max_turns=3, max_tokens_per_turn=32,
                     max_response_tokens=400, threads=4)
    episodes = loop.run(examples, clients, list(range(len(faults))), SamplingParams())
    for fault, ep in zip(faults, episodes):
        _, result = to_trajectory(ep, tok)
        assert ep.env_failure and len(ep.turns) == 1, fault  # ended at the first /step
        assert result.failed and result.score == 0.0 and not result.correct, fault


# ============================================================================ item 7: env failures are not trained


def _traj(group: int, score: float, failed: bool) -> tuple[Trajectory, RewardResult]:
    ex = Example(prompt="p", answer="", uid=f"calc/train/{group}", meta={"env": "calc", "task_id": group})
    traj = Trajectory(example=ex, group_id=group, prompt_ids=[1, 2], response_ids=[5, 6, 7],
                      rollout_logprobs=[-0.1] * 3, response_mask=[1, 1, 1], finish_reason="eos",
                      info={"env_failure": "HTTP 500" if failed else ""})
    return traj, RewardResult(score=0.0 if failed else score, failed=failed, error="HTTP 500" if failed else "")


def test_env_failed_episodes_leave_the_batch_and_the_group_statistics():
    from credo.algo import compute_advantages
    from credo.collect.agent import drop_env_failures
    from credo.models.batch import collate

    # group 0: scores 1, 0, (failed), 1 | group 1: three failed and one valid | group 2: 0, 0, 1, 1 all valid
    rows = [(0, 1, False), (0, 0, False), (0, 0, True), (0, 1, False),
            (1, 0, True), (1, 0, True), (1, 0, True), (1, 1, False),
            (2, 0, False), (2, 0, False), (2, 1, False), (2, 1, False)]
    trajs, results = zip(*[_traj(*r) for r in rows])
    kept_t, kept_r, metrics = drop_env_failures(list(trajs), list(results))
    assert metrics == {"env/failed_episodes": 4, "env/failed_share": 4 / 12, "env/dropped_episodes": 5,
                       "env/dropped_groups": 1}
    assert not any(r.failed for r in kept_r) and len(kept_t) == 7
    assert [t.group_id for t in kept_t] == [0, 0, 0, 1, 1, 1, 1]  # group 1 (one survivor) is gone, 2 renumbered
    batch = collate(kept_t, kept_r, pad_id=0)
    adv = compute_advantages("grpo", rewards=batch.scores, group_ids=batch.group_ids,
                             response_mask=batch.response_mask).advantages[:, 0]
    # group 0 over its 3 valid episodes [1, 0, 1]: mean 2/3, unbiased std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2)
    # = sqrt(1/3) = 0.57735; A = (1 - 2/3) / 0.57735 = 0.57735, (0 - 2/3) / 0.57735 = -1.15470
    # (with the failure counted as a 0: [1, 0, 0, 1] -> +-0.866)
    # group 2 [0, 0, 1, 1]: mean 0.5, std sqrt(4 * 0.25 / 3) = 0.57735, A = -+0.5 / 0.57735 = -+0.86603
    expected = [0.57735, -1.15470, 0.57735, -0.86603, -0.86603, 0.86603, 0.86603]
    assert adv.tolist() == pytest.approx(expected, abs=1e-4)


def test_a_group_of_one_keeps_its_valid_episode():
    from credo.collect.agent import drop_env_failures

    trajs, results = zip(*[_traj(0, 1, False), _traj(1, 0, True)])  # rollout.group_size=1
    kept_t, _, metrics = drop_env_failures(list(trajs), list(results))
    assert [t.group_id for t in kept_t] == [0] and metrics["env/dropped_groups"] == 1


def test_env_failure_share_above_the_limit_stops():
    from credo.collect.agent import EnvOutageError, check_env_failures

    bad, good = RewardResult(0.0, failed=True, error="HTTP 500:\nboom"), RewardResult(1.0)
    check_env_failures([bad] * 8 + [good] * 8, max_share=0.5, step=0)  # 8/16 = 0.5 is not above 0.5
    with pytest.raises(EnvOutageError, match=r"9 of 16 episodes .*rollout.collector.max_env_failure_share=0.5") as info:
        check_env_failures([bad] * 9 + [good] * 7, max_share=0.5, step=2)  # 9/16 = 0.5625 > 0.5
    assert "\n" not in str(info.value) and "RL step 3" in str(info.value) and "HTTP 500: boom" in str(info.value)
    check_env_failures([bad] * 16, max_share=1.0, step=0)  # 1.0: never stops


LOCK = threading.Lock()
AGENT_RUN = [*TINY_RUN, "agent.envs=[calc]", "agent.max_turns=3", "agent.max_tokens_per_turn=8",
             "agent.max_response_tokens=96", "model.max_position_embeddings=192", "task.eval_size=1", "eval.every=0",
             "eval.k=1", "warm_start.steps=0", "train.steps=1", "log.tensorboard=false", "log.report=false",
             "log.progress=false", "checkpoint.save_final=false", "agent.timeout_s=2", "agent.retries=0",
             "log.rollouts_every=1"]


class _FailingCalc(JSONHandler):
    """A calc server whose /step answers HTTP 500 for training instances of the failing tasks: ``mode`` "one":
    the first training task it sees (one whole group of the step), "all": every training task. Held-out tasks
    (ids >= EVAL_OFFSET) behave."""

    mode = "one"
    state: dict

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        st = self.state
        with LOCK:
            if self.path == "/create":
                st["ids"] += 1
                st["envs"][st["ids"]] = CalcEnv()
                return self._reply(200, json.dumps({"id": st["ids"]}).encode())
            env_id = body.get("id")
            if self.path == "/close":
                return self._reply(200, b'{"closed": true}')
            if self.path == "/reset":
                task = int(body["data_idx"])
                if task < EVAL_OFFSET and (self.mode == "all" or st.setdefault("task", task) == task):
                    st["failing"].add(env_id)
                    st["failed_tasks"].add(task)
                obs = st["envs"][env_id].reset(task)
                return self._reply(200, json.dumps({"observation": obs}).encode())
            if env_id in st["failing"]:
                return self._reply(500, b'{"detail": "env backend down"}')
            r = st["envs"][env_id].step(body["action"])
        return self._reply(200, json.dumps({"observation": r.observation, "reward": r.reward, "done": r.done,
                                            "info": r.info}).encode())


@contextmanager
def failing_calc(mode: str):
    state = {"ids": 0, "envs": {}, "failing": set(), "failed_tasks": set()}
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_FailingCalc,), {"mode": mode, "state": state}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def scripted(monkeypatch):
    """Every continuation is a valid calc action (``<tool>1+2</tool>``, then ``<answer>3</answer>``), so the
    barely-trained model reaches the server."""
    from credo.rollout.hf import Continuation, HFRolloutEngine

    def continue_ids(self, prefixes, sampling, *, stop_ids=(), top_logprobs=0, stop_sequences=(), sessions=None):
        out = []
        for prefix in prefixes:
            text = "<answer>3</answer>" if "= 3\n" in self.tokenizer.decode(prefix) else "<tool>1+2</tool>"
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.eos_id]
            out.append(Continuation(ids, [-0.5] * len(ids), "stop"))
        return out

    monkeypatch.setattr(HFRolloutEngine, "continue_ids", continue_ids)


def test_cli_run_leaves_env_failed_episodes_out_and_counts_them(tmp_path: Path, scripted):
    with failing_calc("one") as (url, state):
        code = main(["-q", "train", *AGENT_RUN, f"output_dir={tmp_path}", "run_name=some",
                     f"agent.server_urls={{calc: '{url}'}}"])
    assert code == 0
    (failed_task,) = state["failed_tasks"]
    rows = [json.loads(line) for line in (tmp_path / "some" / "rollouts.jsonl").read_text().splitlines()]
    # 4 prompts x group 4; the failing task's whole group (4 episodes) never reaches the batch, so no gradient
    assert len(rows) == 12 and not any(r["failed"] for r in rows)
    assert all(int(r["uid"].split("/")[-1]) != failed_task for r in rows)
    (step1,) = [m for m in read_metrics(tmp_path / "some" / "metrics.jsonl") if m["step"] == 1]
    assert step1["env/failed_episodes"] == 4 and step1["env/failed_share"] == 0.25
    assert step1["env/dropped_groups"] == 1 and step1["env/dropped_episodes"] == 4
    assert step1["agent/env_failures"] == 4  # the rollout's own count (all 16 episodes)


def test_cli_run_stops_when_most_episodes_fail_in_the_environment(tmp_path: Path, scripted, capsys):
    with failing_calc("all") as (url, _):
        code = main(["-q", "train", *AGENT_RUN, f"output_dir={tmp_path}", "run_name=down",
                     f"agent.server_urls={{calc: '{url}'}}"])
    assert code == 3  # issue 33 item 9: an environment outage, not a configuration error (which exits 2)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("credo:")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("credo: environment failure: RL step 1: ")
    assert "16 of 16 episodes failed in the environment" in lines[0]
    assert "rollout.collector.max_env_failure_share=0.5" in lines[0] and "HTTP 500" in lines[0]
    assert not (tmp_path / "down" / "metrics.jsonl").is_file() or all(
        "env/failed_episodes" not in m for m in read_metrics(tmp_path / "down" / "metrics.jsonl"))


# ============================================================================ item 15: server input handling


@pytest.fixture
def calc_app():
    from fastapi.testclient import TestClient

    from credo.envs.server import create_app

    client = TestClient(create_app("calc"))
    env_id = client.post("/create").json()["id"]
    return client, env_id


@pytest.mark.parametrize("body", [{"data_idx": "abc"}, {"data_idx": 1.5}, {"data_idx": True}, {"data_idx": None}])
def test_reset_with_a_bad_task_id_is_422(calc_app, body):
    client, env_id = calc_app
    r = client.post("/reset", json={"id": env_id, **body})
    assert r.status_code == 422 and "data_idx" in r.text


@pytest.mark.parametrize("env_id", [0.0, True, "0", None])
def test_ids_must_be_integers(calc_app, env_id):
    client, real_id = calc_app
    assert real_id == 0  # so 0.0 / True would hash onto it
    for path, extra in (("/reset", {"data_idx": 1}), ("/step", {"action": "tool:1+1"}), ("/close", {})):
        body = {"id": env_id, **extra} if env_id is not None else extra
        r = client.post(path, json=body)
        assert r.status_code == 422, (path, env_id, r.text)
    assert client.post("/reset", json={"id": 0, "data_idx": 1}).status_code == 200  # the instance is still there


@pytest.mark.parametrize("query", ["", "?id=", "?id=0.0", "?id=true", "?env_idx=x"])
def test_observation_without_a_valid_id_is_422(calc_app, query):
    client, _ = calc_app
    assert client.get("/observation" + query).status_code == 422


def test_observation_and_unknown_ids(calc_app):
    client, env_id = calc_app
    obs = client.post("/reset", json={"id": env_id, "data_idx": 3}).json()["observation"]
    assert client.get(f"/observation?id={env_id}").json() == obs  # a bare string, as AgentGym servers answer
    assert client.get(f"/observation?env_idx={env_id}").json() == obs
    assert client.get("/observation?id=-1").status_code == 404
    assert client.post("/step", json={"id": 99, "action": "tool:1"}).status_code == 404


def test_a_non_string_action_is_422(calc_app):
    client, env_id = calc_app
    assert client.post("/step", json={"id": env_id, "action": {"kind": "tool"}}).status_code == 422


class _Gate:
    """Shared state of the ``_gate`` test environment: a step waits up to ``wait_s`` for another step to enter
    (which releases it), recording whether it ever overlapped with one."""

    lock = threading.Lock()
    active = 0
    overlaps: list[bool] = []
    entered = threading.Event()
    release = threading.Event()
    wait_s = 1.0


class GateEnv:
    def reset(self, task_id: int) -> str:
        return "ready"

    def step(self, action: str):
        from credo.envs import StepResult

        with _Gate.lock:
            _Gate.active += 1
            _Gate.overlaps.append(_Gate.active > 1)
            if _Gate.active > 1:
                _Gate.release.set()
        _Gate.entered.set()
        _Gate.release.wait(timeout=_Gate.wait_s)
        with _Gate.lock:
            _Gate.active -= 1
        return StepResult("ok")

    def close(self) -> None:
        pass


@contextmanager
def served(app):
    """``app`` on a real uvicorn server (a thread pool, so requests run concurrently) on a free loopback port."""
    import time

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):  # at most 20 s
        if server.started:
            break
        time.sleep(0.1)
    assert server.started
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def gate_server():
    from credo.envs import ENVS, ActionParser, EnvSpec, register_env
    from credo.envs.server import create_app

    register_env(EnvSpec(name="_gate", factory=GateEnv, parser=ActionParser(("go",)), instruction=""))
    _Gate.overlaps, _Gate.active = [], 0
    _Gate.entered.clear()
    _Gate.release.clear()
    try:
        with served(create_app("_gate")) as url:
            yield url
    finally:
        ENVS.remove("_gate")


def _post(url: str, path: str, body: dict, out: list) -> None:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        out.append(resp.status)


def _two_steps(url: str, ids: tuple[int, int]) -> list[int]:
    statuses: list[int] = []
    first = threading.Thread(target=_post, args=(url, "/step", {"id": ids[0], "action": "go:1"}, statuses))
    first.start()
    assert _Gate.entered.wait(timeout=20)  # the first step is inside env.step
    second = threading.Thread(target=_post, args=(url, "/step", {"id": ids[1], "action": "go:1"}, statuses))
    second.start()
    first.join(timeout=30)
    second.join(timeout=30)
    return statuses


def test_concurrent_steps_on_one_instance_are_serialised(gate_server, monkeypatch):
    monkeypatch.setattr(_Gate, "wait_s", 1.0)  # nobody releases the first step: it gives up after 1 s
    _post(gate_server, "/create", {}, [])
    assert _two_steps(gate_server, (0, 0)) == [200, 200]
    assert _Gate.overlaps == [False, False]


def test_steps_on_different_instances_run_concurrently(gate_server, monkeypatch):
    monkeypatch.setattr(_Gate, "wait_s", 20.0)  # the second step (another instance) releases the first
    _post(gate_server, "/create", {}, [])
    _post(gate_server, "/create", {}, [])
    assert _two_steps(gate_server, (0, 1)) == [200, 200]
    assert _Gate.overlaps == [False, True]


# ============================================================================ bearer token


def test_server_token_is_required_on_every_route():
    from fastapi.testclient import TestClient

    from credo.envs.server import create_app

    client = TestClient(create_app("calc", token="s3cret"))
    assert client.post("/create").status_code == 401
    assert client.get("/stats").status_code == 401
    assert client.post("/create", headers={"Authorization": "Bearer wrong"}).status_code == 401
    good = {"Authorization": "Bearer s3cret"}
    env_id = client.post("/create", headers=good).json()["id"]
    assert client.post("/reset", json={"id": env_id, "data_idx": 2}, headers=good).status_code == 200


def test_http_client_sends_the_token():
    from credo.envs.server import create_app

    with served(create_app("calc", token="s3cret")) as url:
        client = HTTPEnvClient(url, "calc", timeout_s=10, token="s3cret")
        assert client.reset(4) == CalcEnv().reset(4)
        assert client.step("<answer>0</answer>").done
        client.close()
        with pytest.raises(EnvError, match="HTTP 401"):
            HTTPEnvClient(url, "calc", timeout_s=10, retries=0).reset(4)


def test_serve_reads_the_token_from_the_environment_and_warns_when_exposed(monkeypatch, capsys):
    import uvicorn
    from fastapi.testclient import TestClient

    from credo.envs.server import serve

    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append((app, kw)))  # nothing binds
    monkeypatch.delenv("CREDO_ENV_TOKEN", raising=False)
    serve("calc", host="0.0.0.0", port=1)
    assert "warning: credo env serve calc binds 0.0.0.0 without a token" in capsys.readouterr().err
    serve("calc", host="127.0.0.1", port=1)
    assert "warning" not in capsys.readouterr().err  # loopback: no warning
    monkeypatch.setenv("CREDO_ENV_TOKEN", "from-env")
    serve("calc", host="0.0.0.0", port=1)
    assert "warning" not in capsys.readouterr().err
    client = TestClient(apps[-1][0])
    assert client.post("/create").status_code == 401
    assert client.post("/create", headers={"Authorization": "Bearer from-env"}).status_code == 200


def test_training_client_takes_the_token_from_the_environment_only(monkeypatch):
    from credo.config import load_config
    from credo.collect.agent import make_client

    cfg = load_config(None, ["agent.envs=[calc]", "agent.server_urls={calc: 'http://127.0.0.1:9'}"])
    monkeypatch.setenv("CREDO_ENV_TOKEN", "t0k")
    assert make_client(cfg.rollout.collector, "calc").token == "t0k"
    monkeypatch.delenv("CREDO_ENV_TOKEN")
    assert make_client(cfg.rollout.collector, "calc").token is None


# ============================================================================ item 14: one-line errors


@pytest.mark.parametrize("args,needle", [
    (["nope"], "unknown environment 'nope'; registered: calc, calc_tools, maze"),
    (["maze", "size=abc"], "size='abc' must be an integer"),
    (["maze", "size=1"], "size=1 must be in [2, 64]"),
    (["maze", "wall_fraction=0.9"], "wall_fraction=0.9 must be in [0.0, 0.5]"),
    (["calc", "digits=0"], "digits=0 must be in [1, 9]"),
    (["calc", "digits=true"], "digits=True must be an integer"),
    (["maze", "bogus=1"], "has no parameter(s) ['bogus']; it takes: size, wall_fraction"),
    (["verify", "task_params={bogus: 1}"], "task 'addition' has no parameter 'bogus'"),  # the env's own check
])
def test_env_serve_errors_are_one_line_exit_2(capsys, args, needle):
    assert main(["env", "serve", *args, "--port", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("credo: ") and needle in err[0], err


def test_env_serve_unknown_name_through_the_real_cli():
    proc = subprocess.run([sys.executable, "-m", "credo.cli.main", "env", "serve", "nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "unknown environment 'nope'" in proc.stderr


def test_bad_env_params_in_a_training_config_are_config_errors():
    from credo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"rollout.collector.env_params.maze: .*size=1 must be in \[2, 64\]"):
        load_config(None, ["agent.envs=[maze]", "agent.env_params={maze: {size: 1}}"])
    with pytest.raises(ConfigError, match=r"rollout.collector.env_params.calc: .*terms=12 must be in \[1, 8\]"):
        load_config(None, ["agent.envs=[calc]", "agent.env_params={calc: {terms: 12}}"])
