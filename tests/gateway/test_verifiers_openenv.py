"""verifiers' OpenEnv adapter (``verifiers.v1.tasksets.openenv``) through credo.gateway.verifiers_env: full OpenEnv
episodes, offline. The environment is the echo environment that ships with openenv (its ``openenv init`` template,
rendered by openenv's own template code, minus the ``uv lock`` that ``openenv init`` runs), served by openenv's own
server (``create_app`` under uvicorn) in a process of its own on 127.0.0.1; the adapter connects to it by
``args.base_url`` (docs/bring-your-own.md, "verifiers environments"). The model is the fake OpenAI-compatible
server of tests/gateway/test_verifiers_env.py, then credo's real Gateway in front of a tiny HF model. Neither
process connects anywhere but this machine (an audit hook on ``socket.connect`` / ``getaddrinfo`` in both)."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from credo.gateway.contract import AgentClient
from tests.gateway.test_verifiers_env import FakeOpenAI

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False", "DO_NOT_TRACK": "1", "ENABLE_WEB_INTERFACE": "false"}

# Installed in both processes: any socket.connect / getaddrinfo to a host that is not loopback is recorded
# (the server prints it as an OFFBOX line; the test process keeps it in _OFFBOX).
_GUARD = r'''
import sys

def _loopback(host):
    host = host.decode() if isinstance(host, bytes) else str(host)
    return host in ("localhost", "::1", "0:0:0:0:0:0:0:1") or host.startswith("127.")

def _hook(event, args):
    if event == "socket.connect" and isinstance(args[1], tuple) and not _loopback(args[1][0]):
        _offbox(f"connect {args[1]!r}")
    elif event == "socket.getaddrinfo" and args[0] is not None and not _loopback(args[0]):
        _offbox(f"getaddrinfo {args[0]!r}")
'''
_SERVE = _GUARD + r'''
def _offbox(what):
    print("OFFBOX", what, file=sys.stderr, flush=True)

sys.addaudithook(_hook)
import uvicorn
uvicorn.run("echo_env.server.app:app", host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
'''
_OFFBOX: list[str] = []
_WATCHING = [False]


def _offbox(what: str) -> None:
    if _WATCHING[0]:
        _OFFBOX.append(what)


exec(compile(_GUARD, "<offbox guard>", "exec"), globals())
sys.addaudithook(_hook)  # noqa: F821 (defined by _GUARD): records only while a test watches (_WATCHING)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    """(base_url, log path): openenv's echo environment served by openenv's ``create_app`` under uvicorn on a
    free loopback port, in a process of its own."""
    from openenv.cli.commands.init import _copy_template_directory, _create_template_replacements

    root = tmp_path_factory.mktemp("openenv")
    _copy_template_directory("openenv.cli.templates.openenv_env", "", root / "echo_env",
                             _create_template_replacements("echo_env"), "echo_env")
    # the template serves one WebSocket session at a time ("increase this number to allow more concurrent
    # WebSocket sessions"): a group's episodes run at once
    app = root / "echo_env" / "server" / "app.py"
    assert "max_concurrent_envs=1," in app.read_text()
    app.write_text(app.read_text().replace("max_concurrent_envs=1,", "max_concurrent_envs=4,"))
    port, log = _free_port(), root / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(port)], cwd=root, stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, **OFFLINE})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the OpenEnv server exited ({proc.returncode}):\n{log.read_text()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the OpenEnv server did not answer /health in 90 s:\n{log.read_text()}")
            time.sleep(0.2)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "OFFBOX" not in log.read_text(), log.read_text()


@pytest.fixture
def offline(monkeypatch):
    """The offline flags of a credo process, and the test process's connections watched."""
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)
    _OFFBOX.clear()
    _WATCHING[0] = True
    yield
    _WATCHING[0] = False
    assert _OFFBOX == [], f"connections off 127.0.0.1: {_OFFBOX}"


def _observations(body) -> list[dict]:
    """The OpenEnv payloads (observation + action schema) the adapter sent as user turns, in order."""
    return [json.loads(m["content"]) for m in body["messages"] if m.get("role") == "user"]


def _agent(url: str, max_turns: int, **args):
    from credo.gateway.verifiers_env import load_environment_agent

    agent = load_environment_agent({"env": "openenv", "args": {"base_url": url, **args}, "max_turns": max_turns})
    [row] = agent.rows("train", 1, 0)
    return agent, row


def test_an_openenv_episode_against_the_fake_server(echo_server, offline):
    """Three turns of the echo env: each reply (raw text, then a JSON action object, then fenced JSON) is parsed
    into the env's action, stepped on the server, and its echo comes back in the next observation; the reward is
    the server's per-step rewards summed (0.1 per character echoed), reported as ``openenv_reward`` too."""
    url, _ = echo_server
    actions = ["hello", "openenv", "offline!!"]
    replies = [actions[0], json.dumps({"message": actions[1]}),
               "```json\n" + json.dumps({"message": actions[2]}) + "\n```"]

    def policy(body):
        return {"content": replies[len(_observations(body)) - 1]}

    fake = FakeOpenAI(policy)
    try:
        agent, row = _agent(url, max_turns=3)
        assert row["info"]["base_url"] == url
        t0 = time.monotonic()
        result = asyncio.run(agent(row, AgentClient(base_url=fake.url, api_key="ep-key", model="policy",
                                                    timeout_s=60)))
        elapsed = time.monotonic() - t0
    finally:
        fake.close()
    expected = 0.1 * sum(len(a) for a in actions)
    assert result == {"reward": pytest.approx(expected), "openenv_reward": pytest.approx(expected)}
    assert len(fake.requests) == 3 and all(r["auth"] == "Bearer ep-key" for r in fake.requests)
    seen = _observations(fake.requests[-1]["body"])
    assert len(seen) == 3
    assert seen[0]["observation"]["echoed_message"] == "Echo Env environment ready!"
    assert seen[0]["action_schema"]["title"] == "EchoAction"
    assert seen[0]["action_schema"]["required"] == ["message"]
    # what the server echoed back is each action, with its length and the server's step count
    for step, (action, payload) in enumerate(zip(actions, seen[1:]), 1):
        obs = payload["observation"]
        assert obs["echoed_message"] == action and obs["message_length"] == len(action)
        assert obs["metadata"] == {"original_message": action, "step": step}
    assert elapsed < 30


def test_an_openenv_episode_through_credos_gateway(echo_server, offline):
    """The same env played by a tiny HF model behind credo's Gateway: every turn is recorded by the gateway under
    the episode's key, and the episode's reward is the server's for the model's own replies (0.1 per character
    of each stepped action)."""
    import dataclasses

    import torch

    from credo.gateway.server import Gateway, GatewayLimits, stitch
    from credo.models import build_model
    from credo.rollout.hf import HFRolloutEngine
    from credo.types import SamplingParams
    from tests.gateway.gateway_fakes import ROOMY
    from verifiers.v1.tasksets.openenv.taskset import parse_action

    url, _ = echo_server
    torch.manual_seed(0)
    # one token a character: the observation + action schema payload is ~1.1k characters a turn
    model, tok = build_model(dataclasses.replace(ROOMY, max_position_embeddings=8192), seed=0)
    engine = HFRolloutEngine(model, tok, seed=3)
    with Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=8),
                 limits=GatewayLimits(batch_wait_s=0.0)) as gw:
        agent, row = _agent(url, max_turns=3)
        client = gw.open_episode("openenv-0", deadline_s=120)
        result = asyncio.run(agent(row, client))
        rec = gw.close_episode(client)
    assert rec.refused == [] and 1 <= len(rec.calls) <= 3
    schema = {"required": ["message"]}
    stepped = []
    for call in rec.calls:
        ids = call.completion_ids[:-1] if call.completion_ids[-1] == tok.eos_token_id else call.completion_ids
        text = tok.decode(ids, skip_special_tokens=True).strip()
        if not text:  # the adapter stops on an empty action
            break
        stepped.append(str(parse_action(text, schema)["message"]))
    assert stepped, "the tiny model's first reply was empty: no action reached the server"
    expected = 0.1 * sum(len(a) for a in stepped)
    assert result == {"reward": pytest.approx(expected), "openenv_reward": pytest.approx(expected)}
    # the turns after the first carry the server's echo of the previous action
    for prev, call in zip(stepped, rec.calls[1:]):
        prompt = tok.decode(call.prompt_ids, skip_special_tokens=True)
        assert json.dumps(prev, ensure_ascii=False)[1:-1] in prompt
    assert len(stitch(rec.calls)) == 1  # the turns extend one another: one trajectory


def test_credo_train_on_an_openenv_env(tmp_path, echo_server, offline):
    """`credo train` with the gateway collector on the OpenEnv echo env: one step of a group of two concurrent
    episodes (two WebSocket sessions on the server), three turns each, none failed, each stitched into one
    trajectory, rewarded by the server (0.1 per character of the tiny model's 8-token replies)."""
    from credo.cli.main import main

    url, _ = echo_server
    run_dir = tmp_path / "run"
    args = [
        "model.hidden_size=32", "model.intermediate_size=64", "model.max_position_embeddings=4096",
        "task.train_size=1", "task.eval_size=1", "rollout.group_size=2", "train.prompts_per_step=1",
        "rollout.max_new_tokens=8", "warm_start.steps=0", "train.steps=1", "train.threads=1",
        "rollout.collector.type=gateway", "rollout.collector.verifiers.env=openenv",
        f"rollout.collector.verifiers.args.base_url={url}", "rollout.collector.verifiers.max_turns=3",
    ]
    assert main(["-q", "train", "--run-dir", str(run_dir), *args]) == 0
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    [step] = [m for m in metrics if "gateway/episodes" in m]
    assert step["gateway/episodes"] == 2 and step["gateway/failed_episodes"] == 0
    assert step["gateway/calls_per_episode"] == 3 and step["gateway/segments_per_episode"] == 1
    assert 0 < step["reward/min"] <= step["reward/max"] <= 0.1 * 8 * 3 + 1e-9  # one character a token
