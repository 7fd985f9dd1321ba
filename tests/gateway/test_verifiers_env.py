"""credo.gateway.verifiers_env: verifiers v1 environments (tests/gateway/vf_envs) rolled out against a fake
OpenAI-compatible server on 127.0.0.1, scored by their own rewards and judges."""
from __future__ import annotations

import asyncio
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from credo.gateway.contract import AgentClient, AgentSource, reward_of

VF_ENVS = Path(__file__).parent / "vf_envs"


# -- a fake OpenAI-compatible endpoint ------------------------------------------------------------------------


class FakeOpenAI:
    """``POST /v1/chat/completions`` answered by ``policy(body) -> message dict``; every request is kept with
    its Authorization header."""

    def __init__(self, policy):
        self.policy = policy
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                fake.requests.append({"path": self.path, "auth": self.headers.get("authorization"), "body": body})
                if not self.path.endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                try:
                    message = fake.policy(body)
                except Exception as e:  # a test policy bug shows up as the agent's error
                    return self._send(500, {"error": {"message": repr(e)}})
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                if body.get("stream"):
                    return self._stream(body, message, finish)
                self._send(200, {
                    "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body.get("model"),
                    "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

            def _stream(self, body, message, finish):
                """The same reply as server-sent chat.completion.chunk events (the OpenAI streaming format)."""
                base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                        "model": body.get("model")}
                delta = {"role": "assistant", "content": message.get("content")}
                if message.get("tool_calls"):
                    delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
                events = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                          {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                          {**base, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                                                            "total_tokens": 15}}]
                data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                raw = data.encode()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    servers = []

    def start(policy):
        server = FakeOpenAI(policy)
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.close()


@pytest.fixture(autouse=True)
def _envs_on_path(monkeypatch):
    """The fixture environments import by module name, here and in the tool servers verifiers starts."""
    monkeypatch.syspath_prepend(str(VF_ENVS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(VF_ENVS), os.environ.get("PYTHONPATH", "")]))


def _user_text(body) -> str:
    return "\n".join(str(m.get("content")) for m in body["messages"] if m.get("role") == "user")


def _sum_policy(right: bool):
    """Answers 'What is a + b?' with a + b (right) or a + b + 1 (wrong)."""
    import re

    def policy(body):
        a, b = map(int, re.search(r"What is (\d+) \+ (\d+)", _user_text(body)).groups())
        return {"content": f"The sum is {a + b + (0 if right else 1)}"}

    return policy


def _client(server, key="episode-key-1"):
    return AgentClient(base_url=server.url, api_key=key, model="policy", timeout_s=60)


def _run(agent, row, client):
    return asyncio.run(agent(row, client))


# -- (a) local environments ----------------------------------------------------------------------------------


def test_single_turn_rows_and_rewards(fake):
    from credo.gateway.verifiers_env import load_environment_agent

    agent = load_environment_agent({"env": "vf_single", "args": {"count": 4}})
    assert isinstance(agent, AgentSource)
    rows = agent.rows("train", 10, seed=0)
    assert len(rows) == 4 and len({r["uid"] for r in rows}) == 4
    assert sorted(r["answer"] for r in rows) == ["12", "17", "5", "9"]
    assert all("What is" in r["prompt"] for r in rows)
    assert [r["uid"] for r in agent.rows("train", 2, seed=0)] == [r["uid"] for r in rows[:2]]
    assert {r["uid"] for r in agent.rows("train", 4, seed=1)} == {r["uid"] for r in rows}

    right = fake(_sum_policy(True))
    out = _run(agent, rows[0], _client(right))
    assert out == {"reward": 1.0, "correct": 1.0}
    assert reward_of(out) == (1.0, {"correct": 1.0})
    calls = right.requests
    assert len(calls) == 1 and calls[0]["path"] == "/v1/chat/completions"
    assert calls[0]["auth"] == "Bearer episode-key-1" and calls[0]["body"]["model"] == "policy"
    assert calls[0]["body"]["messages"][0] == {"role": "system", "content": "You add numbers."}

    wrong = fake(_sum_policy(False))
    assert _run(agent, rows[1], _client(wrong, key="k2")) == {"reward": 0.0, "correct": 0.0}
    assert wrong.requests[0]["auth"] == "Bearer k2"
    assert not any(k.startswith("CREDO_VF_API_KEY_") for k in os.environ)


def test_eval_args_select_the_eval_rows():
    from credo.gateway.verifiers_env import load_environment_agent

    agent = load_environment_agent({"env": "vf_single", "args": {"count": 4}, "eval_args": {"offset": 4}})
    train = {r["answer"] for r in agent.rows("train", 10, 0)}
    evals = agent.rows("eval", 10, 0)
    assert {r["answer"] for r in evals} == {"9", "18"} and not train & {"18"}
    assert all(r["uid"].split(":")[2] == "eval" for r in evals)


def test_single_turn_with_reference_judge(fake):
    """verifiers' reference judge, plugged through args.task.judges, scores via its own endpoint (here a second
    fake on 127.0.0.1 that says yes iff the graded response holds the right sum)."""
    from credo.gateway.verifiers_env import load_environment_agent

    def judge(body):
        text = _user_text(body)
        import re

        a, b = map(int, re.search(r"What is (\d+) \+ (\d+)", text).groups())
        return {"content": "yes" if f"The sum is {a + b}" in text else "no"}

    judge_server = fake(judge)
    agent = load_environment_agent({"env": "vf_single", "args": {
        "task": {"judges": [{"id": "reference", "base_url": judge_server.url, "model": "judge",
                             "api_key_var": "CREDO_TEST_JUDGE_KEY"}]}}})
    rows = agent.rows("train", 2, 0)
    out = _run(agent, rows[0], _client(fake(_sum_policy(True))))
    assert out == {"reward": 2.0, "correct": 1.0, "reference": 1.0}
    out = _run(agent, rows[1], _client(fake(_sum_policy(False))))
    assert out == {"reward": 0.0, "correct": 0.0, "reference": 0.0}
    assert [r["body"]["model"] for r in judge_server.requests] == ["judge", "judge"]


def test_judge_on_another_host_is_refused():
    from credo.gateway.verifiers_env import VerifiersEnvError, load_environment_agent

    with pytest.raises(VerifiersEnvError, match="judge 'reference' calls"):
        load_environment_agent({"env": "vf_single", "args": {"task": {"judges": [{"id": "reference"}]}}})


def _tool_policy(body):
    """First call: call the first advertised tool on the numbers of the prompt; then answer with what the tool
    returned."""
    import re

    tool_results = [m for m in body["messages"] if m.get("role") == "tool"]
    if not tool_results:
        a, b = map(int, re.search(r"multiply (\d+) by (\d+)", _user_text(body)).groups())
        name = body["tools"][0]["function"]["name"]
        return {"content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": name, "arguments": json.dumps({"a": a, "b": b})}}]}
    product = re.search(r"product=(\d+)", str(tool_results[-1]["content"])).group(1)
    return {"content": f"The product is {product}"}


def test_multi_turn_tool_env(fake):
    from credo.gateway.verifiers_env import load_environment_agent

    agent = load_environment_agent({"env": "vf_tool", "max_turns": 4})
    rows = agent.rows("train", 3, 0)
    server = fake(_tool_policy)

    async def all_rows():  # concurrent episodes share the taskset's one tool server
        return await asyncio.gather(*(agent(r, _client(server, key=f"k{i}")) for i, r in enumerate(rows)))

    assert asyncio.run(all_rows()) == [{"reward": 1.5, "correct": 1.0, "used_tool": 0.5}] * 3
    assert len(server.requests) == 6
    for key in ("k0", "k1", "k2"):
        first, second = [r["body"] for r in server.requests if r["auth"] == f"Bearer {key}"]
        assert [t["function"]["name"] for t in first["tools"]] == ["calc_multiply"]
        assert second["messages"][-1]["role"] == "tool" and "product=" in second["messages"][-1]["content"]

    def no_tool(body):  # a policy that answers without the tool: right answer, no tool reward
        import re

        a, b = map(int, re.search(r"multiply (\d+) by (\d+)", _user_text(body)).groups())
        return {"content": f"It is {a * b}"}

    assert _run(agent, rows[0], _client(fake(no_tool))) == {"reward": 1.0, "correct": 1.0, "used_tool": 0.0}


def test_local_file_path_and_unknown_envs(tmp_path):
    from credo.gateway.verifiers_env import VerifiersEnvError, load_environment_agent

    src = (VF_ENVS / "vf_single.py").read_text()
    (tmp_path / "my_sums.py").write_text(src)
    agent = load_environment_agent({"env": str(tmp_path / "my_sums.py"), "args": {"count": 2}})
    assert len(agent.rows("train", 5, 0)) == 2
    with pytest.raises(VerifiersEnvError, match="'no_such_env' not found"):
        load_environment_agent({"env": "no_such_env"})
    with pytest.raises(VerifiersEnvError, match="yielded no tasks"):
        load_environment_agent({"env": "vf_single", "args": {"count": 0}}).rows("train", 4, 0)
    with pytest.raises(VerifiersEnvError, match="unknown keys"):
        load_environment_agent({"env": "vf_single", "argz": {}})
    with pytest.raises(VerifiersEnvError, match="bad args"):
        load_environment_agent({"env": "vf_single", "args": {"count": "many"}})


def test_hub_id_without_the_hub_says_so(monkeypatch, tmp_path):
    from credo.gateway.verifiers_env import VerifiersEnvError, load_environment_agent

    monkeypatch.setenv("PATH", str(tmp_path))  # no prime CLI
    with pytest.raises(VerifiersEnvError, match=r"Environments Hub id .* prime CLI .* not on PATH"):
        load_environment_agent({"env": "someone/not-installed-env@0.1.0"})
    # a prime CLI that cannot reach the hub: its failure is reported as such
    prime = tmp_path / "prime"
    prime.write_text("#!/bin/sh\necho 'error: could not connect to the Environments Hub' >&2\nexit 1\n")
    prime.chmod(0o755)
    with pytest.raises(VerifiersEnvError, match="may be unreachable.*could not connect"):
        load_environment_agent({"env": "someone/not-installed-env"})
    # an installed package resolves by the hub id's name, without the hub
    agent = load_environment_agent({"env": "someone/vf-single@1.0", "args": {"count": 1}})
    assert len(agent.rows("train", 3, 0)) == 1


def test_failed_episode_raises(fake):
    from credo.gateway.verifiers_env import VerifiersEpisodeError, load_environment_agent

    agent = load_environment_agent({"env": "vf_single"})
    row = agent.rows("train", 1, 0)[0]

    def broken(body):
        raise RuntimeError("engine down")

    with pytest.raises(VerifiersEpisodeError, match="verifiers episode failed"):
        _run(agent, row, _client(fake(broken)))


# -- (b) verifiers' bundled adapters --------------------------------------------------------------------------


def test_openenv_adapter_rows_offline_and_local_only():
    """verifiers' OpenEnv adapter loads offline: its rows are the configured resets, its seat runs credo's harness;
    an episode whose OpenEnv server is not there fails as an episode (not a crash); a remote server or an env id
    (started through uv/docker) is refused at load."""
    from credo.gateway.verifiers_env import (HARNESS_ID, VerifiersEnvError, VerifiersEpisodeError,
                                             load_environment_agent)

    agent = load_environment_agent({"env": "openenv", "args": {"base_url": "http://127.0.0.1:9",
                                                               "resets": [{}, {"seed": 1}]}})
    assert type(agent.env).__name__ == "OpenEnvEnv" and agent.config.player.harness.id == HARNESS_ID
    rows = agent.rows("train", 5, 0)
    assert [r["info"]["reset"] for r in sorted(rows, key=lambda r: r["uid"])] == [{}, {"seed": 1}]
    with pytest.raises(VerifiersEpisodeError, match="OpenEnvEnv.run"):
        _run(agent, rows[0], AgentClient(base_url="http://127.0.0.1:9/v1", api_key="k", model="m"))
    with pytest.raises(VerifiersEnvError, match="connects to 'https://openenv.example.org'"):
        load_environment_agent({"env": "openenv", "args": {"base_url": "https://openenv.example.org"}})
    with pytest.raises(VerifiersEnvError, match="without args.base_url"):
        load_environment_agent({"env": "openenv", "args": {"env": "echo-env"}})


# -- (c) through credo train ---------------------------------------------------------------------------------


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_credo_train_on_a_verifiers_env_with_a_judge(tmp_path, fake):
    """`credo train` with rollout.collector.type=gateway and the single-turn env, scored by its exact-match reward,
    a plugged reward function (has_digit) and verifiers' reference judge (on a fake endpoint on 127.0.0.1 that says
    yes when the graded reply holds a digit of the answer): both steps run, no episode fails, rewards are recorded
    and differ within groups, no log-prob guard trips."""
    import re

    from credo.cli.main import main

    def judge(body):
        text = _user_text(body)
        answer = str(sum(map(int, re.search(r"What is (\d+) \+ (\d+)", text).groups())))
        reply = text.split("Response:", 1)[1].split("Respond either", 1)[0]
        return {"content": "yes" if any(c in reply for c in answer) else "no"}

    judge_server = fake(judge)
    run_dir = tmp_path / "run"
    args = [
        "model.hidden_size=32", "model.intermediate_size=64", "task.train_size=4", "task.eval_size=2",
        "rollout.group_size=4", "train.prompts_per_step=2", "rollout.max_new_tokens=8", "warm_start.steps=0",
        "train.steps=2", "train.threads=1", "rollout.temperature=1.0",
        "rollout.collector.type=gateway", "rollout.collector.verifiers.env=vf_single",
        "rollout.collector.verifiers.args.task.rewards.has_digit.fn=vf_single:has_digit",
        f"rollout.collector.verifiers.args.task.judges=[{{id: reference, base_url: '{judge_server.url}', "
        "model: judge, api_key_var: CREDO_TEST_JUDGE_KEY}]",
    ]
    assert main(["-q", "train", "--run-dir", str(run_dir), *args]) == 0
    steps = [m for m in _metrics(run_dir) if "gateway/episodes" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["gateway/episodes"] == 8 and m["gateway/failed_episodes"] == 0 for m in steps)
    assert all(0.0 <= m["reward/min"] <= m["reward/max"] <= 3.0 for m in steps)
    assert max(m["reward/max"] for m in steps) > 0 and min(m["frac_reward_zero_std"] for m in steps) < 1
    assert all(m.get(f"guard/{g}_trips", 0) == 0 for m in steps for g in ("first_ratio", "finite_logprobs"))
    assert judge_server.requests and {r["body"]["model"] for r in judge_server.requests} == {"judge"}


def test_credo_train_on_a_verifiers_tool_env(tmp_path):
    """`credo train` on the multi-turn tool env: the gateway serves its calls with the taskset's tool advertised,
    the tool server runs (once per step's serving: one step keeps this test short), the step completes with no
    failed episode."""
    from credo.cli.main import main

    run_dir = tmp_path / "run"
    args = [
        "model.hidden_size=32", "model.intermediate_size=64", "task.train_size=3", "task.eval_size=1",
        "rollout.group_size=2", "train.prompts_per_step=2", "rollout.max_new_tokens=8", "warm_start.steps=0",
        "train.steps=1", "train.threads=1", "rollout.temperature=1.0",
        "rollout.collector.type=gateway", "rollout.collector.verifiers.env=vf_tool",
        "rollout.collector.verifiers.args.task.rewards.has_digit.fn=vf_single:has_digit",
    ]
    assert main(["-q", "train", "--run-dir", str(run_dir), *args]) == 0
    steps = [m for m in _metrics(run_dir) if "gateway/episodes" in m]
    assert [m["step"] for m in steps] == [1]
    assert all(m["gateway/episodes"] == 4 and m["gateway/failed_episodes"] == 0 for m in steps)
    assert all(m["gateway/calls_per_episode"] >= 1 for m in steps)
    assert all(m.get(f"guard/{g}_trips", 0) == 0 for m in steps for g in ("first_ratio", "finite_logprobs"))
