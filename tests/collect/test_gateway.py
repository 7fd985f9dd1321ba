"""The ``gateway`` collector (credo.collect.gateway): episodes and their faults, stitched and split trajectories,
the config checks, and ``credo train`` runs through the real gateway with a command agent, a scripted tool round
trip, faulty agents and a verifiers-style agent source. The agent frameworks' runs are in test_gateway_agents.py."""
from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import sys
import time
import types
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.collect import gateway as gw
from credo.collect.gateway_agents import AgentSpec, verifiers_source
from credo.config import ConfigError, load_config
from credo.gateway.capture import CallRecord, EpisodeRecord
from credo.gateway.contract import AgentClient
from credo.models.tokenizer import build_char_tokenizer
from credo.tracking.metrics import read_metrics
from credo.types import Example, RewardResult
from tests.collect.gateway_agents import dense

HERE = Path(__file__).parent
CMD = f"{sys.executable} {HERE / 'gateway_cmd_agent.py'}"
GATEWAY_RUN = [
    "model.hidden_size=32", "model.intermediate_size=64", "task.train_size=16", "task.eval_size=2", "eval.every=0",
    "rollout.group_size=2", "train.prompts_per_step=2", "rollout.max_new_tokens=8", "warm_start.steps=0",
    "eval.k=1", "reward.workers=1", "train.threads=1", "train.steps=1", "rollout.collector.type=gateway",
    "rollout.collector.episode_timeout_s=60", "log.tensorboard=false", "log.report=false", "log.progress=false",
    "checkpoint.save_final=false", "log.rollouts_every=1",
]


def train(tmp_path: Path, name: str, *overrides: str) -> tuple[int, Path]:
    """``credo train`` (the CLI's entry point, in this process) with the tiny gateway run and ``overrides``."""
    code = main(["train", *GATEWAY_RUN, f"output_dir={tmp_path}", f"run_name={name}", *overrides])
    return code, tmp_path / name


def steps(run: Path) -> list[dict]:
    return [m for m in read_metrics(run / "metrics.jsonl") if m["step"] >= 1]


def assert_trained_on_policy(run: Path, n_steps: int) -> list[dict]:
    """``n_steps`` RL steps, each with updates whose first mini-batch matched the sampler's log-probs (the
    first_ratio guard checked and never tripped; no sampled token without a finite log-prob)."""
    rows = steps(run)
    assert [m["step"] for m in rows] == list(range(1, n_steps + 1))
    for m in rows:
        assert m["gateway/episodes"] == 4 and m["gateway/failed_episodes"] == 0, m
        assert m["gateway/trained_rows"] >= 4 and m["actor/skipped_rows_frac"] < 1, m
        assert m["actor/first_ratio_dev"] < 1e-3, m
        assert m["guard/first_ratio_trips"] == 0 and m["guard/finite_logprobs_trips"] == 0, m
    return rows


def dumped(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- episodes against a fake gateway

class FakeGateway:
    """open_episode / close_episode of credo.gateway.server.Gateway, with calls recorded by :meth:`call`."""

    def __init__(self) -> None:
        self.records: dict[str, EpisodeRecord] = {}

    def open_episode(self, episode_id: str, *, deadline_s=None) -> AgentClient:
        key = f"key-{len(self.records)}"
        self.records[key] = EpisodeRecord(key=key, episode_id=episode_id)
        return AgentClient("http://127.0.0.1:9/v1", key, "credo-policy")

    def close_episode(self, client: AgentClient) -> EpisodeRecord:
        self.records[client.api_key].closed = True
        return self.records[client.api_key]

    def call(self, client: AgentClient, prompt: list[int], completion: list[int], text: str = "x") -> None:
        self.records[client.api_key].calls.append(
            CallRecord(prompt, completion, [-0.5] * len(completion), "stop", text, policy_version=3))


def options(**kw):
    cfg = load_config(None, ["rollout.collector.type=gateway", "rollout.collector.agent=a.b:c",
                             *(f"rollout.collector.{k}={v}" for k, v in kw.items())])
    return cfg.rollout.collector


def test_each_way_an_episode_fails_has_its_reason():
    fake = FakeGateway()
    g = options(episode_timeout_s=1.0)

    def raises(task, client):
        fake.call(client, [1, 2], [3])
        raise KeyError("x")

    async def hangs(task, client):
        await asyncio.sleep(60)

    def blocks(task, client):  # a sync agent past its deadline is abandoned in its thread
        time.sleep(3)

    agents = {"raised": AgentSpec(fn=raises), "timeout": AgentSpec(fn=hangs), "blocks": AgentSpec(fn=blocks),
              "exit_code": AgentSpec(argv=(*CMD.split(), "fail", "nocall")),
              "no_json": AgentSpec(argv=(*CMD.split(), "garbage", "nocall")),
              "hang": AgentSpec(argv=(*CMD.split(), "hang"))}
    ex = [Example("rev abc=", "cba", "t/0")]
    t0 = time.perf_counter()
    got = {name: gw.run_episodes(fake, spec, g, ex, 1, name)[0] for name, spec in agents.items()}
    assert got["raised"].failure == "raised" and "KeyError" in got["raised"].error
    assert got["raised"].record.calls and got["raised"].record.closed  # closed whatever happened
    assert got["timeout"].failure == got["blocks"].failure == got["hang"].failure == "timeout"
    assert got["exit_code"].failure == "exit_code" and "code 3: the agent's own error" in got["exit_code"].error
    assert got["no_json"].failure == "no_json" and "'reward: high'" in got["no_json"].error
    assert time.perf_counter() - t0 < 8  # three deadlines of 1 s, no wait for the abandoned agents


def test_rewards_no_calls_and_the_verifier():
    fake = FakeGateway()
    g = options()
    returns = iter(["high", math.nan, None, None, 0.5, {"a": 0.25, "b": 0.5}, {"reward": -1.0, "fmt": 1.0}, True])

    def agent(task, client):
        fake.call(client, [1, 2], [3, 4], text="the answer")
        return next(returns)

    def silent(task, client):
        return 1.0

    exs = [Example(f"p{i}", "the answer", f"t/{i}") for i in range(8)]
    eps = [gw.run_episodes(fake, AgentSpec(fn=agent), g, [ex], 1, "s")[0] for ex in exs]
    eps.append(gw.run_episodes(fake, AgentSpec(fn=silent), g, exs[:1], 1, "s")[0])

    class Verifier:
        def score(self, texts, examples):
            return [RewardResult(float(t == e.answer), correct=t == e.answer) for t, e in zip(texts, examples)]

    gw.score_episodes(eps, Verifier(), reward_from="agent")
    assert [ep.failure for ep in eps] == ["bad_reward", "bad_reward", "", "", "", "", "", "bad_reward", "no_calls"]
    assert [ep.result.score for ep in eps[2:7]] == [1.0, 1.0, 0.5, 0.75, -1.0]  # None: the verifier scored
    assert eps[5].result.info["components"] == {"a": 0.25, "b": 0.5} and not eps[6].result.correct
    eps[3].failure = ""
    gw.score_episodes(eps[3:4], None, reward_from="agent")  # None and no verifier: nothing can score it
    assert eps[3].failure == "bad_reward" and "no verifier" in eps[3].error
    gw.score_episodes(eps[4:5], Verifier(), reward_from="verifier")  # the agent's 0.5 is not asked
    assert eps[4].result.score == 1.0


def _episode(group: int, calls: list[tuple[list[int], list[int]]], reward: float, failure: str = ""):
    rec = EpisodeRecord(key="k", calls=[CallRecord(p, c, [-0.25] * len(c), "stop", "t", policy_version=2)
                                        for p, c in calls])
    return gw.Episode(Example("p", "a", f"u{group}"), group, record=rec, failure=failure,
                      result=None if failure else RewardResult(reward))


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return ",".join(map(str, ids))


def test_stitched_and_split_episodes_share_rewards_and_short_groups_drop():
    stitched = _episode(0, [([1, 2], [3, 4]), ([1, 2, 3, 4, 9], [5])], 1.0)  # call 2 extends call 1 by token 9
    split = _episode(0, [([1, 2], [3]), ([1, 7], [8, 6])], 0.5)  # call 2 rewrote the context: a new segment
    lone = _episode(1, [([1], [2])], 1.0)
    failed = _episode(1, [([1], [2])], 0.0, failure="raised")
    trajs, results, metrics = gw.training_rows([stitched, split, lone, failed], _Tok(), group_size=2, version=2)
    assert [t.group_id for t in trajs] == [0, 0, 0]  # group 1 kept one good episode: no baseline, dropped
    first = trajs[0]
    assert first.prompt_ids == [1, 2] and first.response_ids == [3, 4, 9, 5]
    assert first.response_mask == [1, 1, 0, 1] and first.rollout_logprobs == [-0.25, -0.25, 0.0, -0.25]
    assert first.turns == [(0, 2), (3, 4)] and first.policy_version == 2
    assert [t.prompt_ids for t in trajs[1:]] == [[1, 2], [1, 7]]
    assert [r.score for r in results] == [1.0, 0.5, 0.5]  # both segments of the split episode carry its reward
    assert metrics == {"gateway/kept_groups": 1.0, "gateway/dropped_groups": 1.0, "gateway/trained_rows": 3.0}
    m = gw.episode_metrics([stitched, split, lone, failed])
    assert m["gateway/stitched_episodes"] == 3 and m["gateway/split_episodes"] == 1  # the failed one too
    assert m["gateway/split/diverged"] == 1 and m["gateway/segments_per_episode"] == 5 / 4
    assert m["gateway/failed/raised"] == 1 and m["gateway/failed_share"] == 0.25
    assert m["gateway/calls_per_episode"] == 6 / 4 and m["gateway/reward_mean"] == 2.5 / 3


def test_a_mostly_failed_step_stops_the_run_and_a_few_failures_warn(caplog):
    eps = [_episode(0, [([1], [2])], 0.0, failure="timeout"), _episode(0, [([1], [2])], 1.0),
           _episode(1, [([1], [2])], 0.0, failure="no_json")]
    with pytest.raises(gw.AgentOutageError, match=r"RL step 3: 2 of 3 agent episodes failed \(67% > "):
        gw.check_failures(eps, max_share=0.5, step=2)
    with caplog.at_level(logging.WARNING):
        gw.check_failures(eps, max_share=0.7, step=2)
    assert "2 of 3 agent episodes failed" in caplog.text and "timeout" in caplog.text


@pytest.mark.parametrize("overrides, needle", [
    ([], "set exactly one of agent"),
    (["rollout.collector.agent=a:b", "rollout.collector.command=x"], "set exactly one of agent"),
    (["rollout.collector.agent=no_colon"], "expected pkg.module:function"),
    (["rollout.collector.command=''"], "expected a command line"),
    (["rollout.collector.command=\"python 'x\""], "No closing quotation"),
    (["rollout.collector.verifiers={args: {}}"], "expected {env:"),
    (["rollout.collector.verifiers={env: x, args: [1]}", "warm_start.steps=0"], "expected {env:"),
    (["rollout.collector.verifiers={env: x}"], "warm_start.steps: a verifiers environment"),
    (["rollout.collector.verifiers={env: x}", "warm_start.steps=0", "rollout.collector.reward_from=verifier"],
     "reward_from=verifier"),
    (["rollout.collector.agent=a:b", "rollout.collector.max_failed_share=2"], "max_failed_share"),
    (["rollout.collector.agent=a:b", "task.chat_template=true"], "wrapped twice"),
])
def test_config_errors_name_the_key(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("{", r"\{")):
        load_config(None, ["rollout.collector.type=gateway", *overrides])


def test_a_missing_verifiers_adapter_is_said_plainly(monkeypatch):
    monkeypatch.setitem(sys.modules, "credo.gateway.verifiers_env", None)  # as if the module did not exist
    monkeypatch.setattr("credo.collect.gateway_agents._SOURCES", {})
    with pytest.raises(NotImplementedError, match="load_environment_agent"):
        verifiers_source({"env": "x"})


# ----------------------------------------------------------------------------- credo train through the gateway

def test_command_agent_trains_and_the_verifier_scores_null(tmp_path):
    code, run = train(tmp_path, "cmd", f"rollout.collector.command='{CMD} null'", "train.steps=2",
                      "reward.name=tests.collect.gateway_agents:dense_verifier")
    assert code == 0
    rows = assert_trained_on_policy(run, 2)
    assert all(m["gateway/calls_per_episode"] == 2 for m in rows)  # two calls each, the second extends the first
    assert all(m["gateway/stitched_episodes"] == 4 and m["gateway/split_episodes"] == 0 for m in rows)
    tok = build_char_tokenizer()  # the tokenizer of every freshly built credo model
    for row in dumped(run):  # null: the run's verifier scored the last completion's text
        (s1, e1), (s2, e2) = row["turns"]
        last = tok.decode(row["response_ids"][s2:e2], skip_special_tokens=True)
        answer = re.search(r"rev (.*?)=", row["prompt"]).group(1)[::-1]
        assert row["score"] == pytest.approx(dense(last, answer), abs=1e-6)
        assert s1 == 0 and e1 < s2 and e2 == len(row["response_ids"])
        assert row["response_mask"] == [1] * e1 + [0] * (s2 - e1) + [1] * (e2 - s2)  # the user turn: mask 0


def test_command_agent_reward_from_its_stdout(tmp_path):
    code, run = train(tmp_path, "cmdscore", f"rollout.collector.command='{CMD} score'")
    assert code == 0
    (m,) = assert_trained_on_policy(run, 1)
    assert m["reward/mean"] == pytest.approx(m["gateway/reward_mean"])  # one segment per episode


def _script_tool_call(monkeypatch):
    """The engine answers every call without a tool result in its prompt with a well-formed hermes tool call
    (its log-probs the policy's own, so the update's first ratio is still 1); other calls are the model's."""
    import torch

    from credo.rollout.hf import Continuation, HFRolloutEngine

    real = HFRolloutEngine.continue_ids
    call = '<tool_call>{"name": "rev", "arguments": {"s": "abc"}}</tool_call>'

    def continue_ids(self, prefixes, sampling, **kw):
        out = real(self, prefixes, sampling, **kw)
        for i, prefix in enumerate(prefixes):
            if "-> " not in self.tokenizer.decode(prefix):
                ids = list(self.tokenizer(call, add_special_tokens=False)["input_ids"]) + [self.eos_id]
                with torch.no_grad():
                    logits = self.model(input_ids=torch.tensor([prefix + ids])).logits[0, len(prefix) - 1:-1]
                logp = torch.log_softmax(logits.float() / sampling.temperature, -1)
                out[i] = Continuation(ids, logp.gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist(), "stop")
        return out

    monkeypatch.setattr(HFRolloutEngine, "continue_ids", continue_ids)


def test_a_tool_round_trip_is_one_trajectory(tmp_path, monkeypatch):
    """The model calls the tool (scripted), the openai agent runs it and sends the result back, the model answers:
    one stitched trajectory per episode, the tool result's tokens in it with mask 0."""
    _script_tool_call(monkeypatch)
    code, run = train(tmp_path, "tool", "rollout.collector.agent=tests.collect.gateway_agents:openai_tools_uncapped",
                      "rollout.max_new_tokens=72")
    assert code == 0
    (m,) = assert_trained_on_policy(run, 1)
    assert m["gateway/calls_per_episode"] == 2 and m["gateway/stitched_episodes"] == 4
    for row in dumped(run):
        (s1, e1), (s2, e2) = row["turns"]
        assert "-> cba" in row["response"], row["response"]  # the tool's answer, inserted between the two completions
        assert row["response_mask"][e1:s2] == [0] * (s2 - e1) and all(row["response_mask"][s2:e2])


def test_failed_episodes_are_counted_and_left_out(tmp_path):
    """Of every 8 consecutive episodes of the faulty agent one raises, one hangs past the deadline and one returns
    a bad reward: counted by reason, not trained on, and the run goes on."""
    code, run = train(tmp_path, "faults", "rollout.collector.agent=tests.collect.gateway_agents:faulty",
                      "rollout.group_size=4", "rollout.collector.episode_timeout_s=1.5")
    assert code == 0
    (m,) = steps(run)
    assert m["gateway/episodes"] == 8 and m["gateway/failed_episodes"] == 3
    assert m["gateway/failed/raised"] == m["gateway/failed/timeout"] == m["gateway/failed/bad_reward"] == 1
    # 5 good episodes in 2 groups: at least one group is trained on, and only good episodes
    assert 2 <= len(dumped(run)) <= 5 == 8 - m["gateway/failed_episodes"]
    assert m["guard/finite_logprobs_trips"] == 0


def test_a_step_where_every_episode_fails_stops_with_one_line(tmp_path, capsys):
    code, run = train(tmp_path, "garbage", f"rollout.collector.command='{CMD} garbage'")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert err[-1].startswith("credo: agent failure: RL step 1: 4 of 4 agent episodes failed (100% > "
                              "rollout.collector.max_failed_share=0.5); first: no_json: the command's last stdout "
                              "line is not JSON: 'reward: high'"), err[-1]


class _Source:
    """An agent with its own rows (what credo.gateway.verifiers_env.load_environment_agent returns)."""

    def __init__(self, spec: dict) -> None:
        self.n = spec["args"]["n"]

    def rows(self, split: str, size: int, seed: int) -> list[dict]:
        return [{"prompt": [{"role": "user", "content": f"say {i}"}], "answer": str(i), "uid": f"src/{split}/{i}",
                 "info": {"k": i}} for i in range(min(size, self.n))]

    async def __call__(self, task: dict, client) -> float:
        async with client.async_openai() as oa:
            resp = await oa.chat.completions.create(model=client.model, messages=task["prompt"], max_tokens=6)
        text = resp.choices[0].message.content or ""
        return float(task["answer"] in text) + sum(map(ord, text)) % 89 / 1000


def test_an_agent_source_brings_its_rows_and_rewards(tmp_path, monkeypatch, capsys):
    """Rows and rewards from the source (as a verifiers environment's); ``credo eval`` of the run evaluates the
    agent on the source's eval rows too."""
    module = types.ModuleType("credo.gateway.verifiers_env")
    module.load_environment_agent = _Source
    monkeypatch.setitem(sys.modules, "credo.gateway.verifiers_env", module)
    monkeypatch.setattr("credo.collect.gateway_agents._SOURCES", {})
    code, run = train(tmp_path, "source", "rollout.collector.verifiers={env: local, args: {n: 5}}",
                      "checkpoint.save_final=true")
    assert code == 0
    assert_trained_on_policy(run, 1)
    assert {row["uid"].rsplit("/", 1)[0] for row in dumped(run)} == {"src/train"}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final/eval/gateway/episodes"] == 2  # task.eval_size rows of the source's eval split
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["examples"] == 2 and out["eval/gateway/episodes"] == 2 and out["eval/gateway/failed_episodes"] == 0


def test_an_agent_ended_by_the_episode_limits_fails_with_reason_limit(tiny_model):
    """Against the real gateway: an agent whose third call is refused (max_calls=2) and which does not catch the
    refusal is a ``limit`` failure; one that catches it and returns a reward is a good episode of 2 calls."""
    from credo.rollout.hf import HFRolloutEngine
    from credo.types import SamplingParams

    model, tok = tiny_model
    g = options(max_calls=2, episode_timeout_s=30)

    def chatty(task, client):
        with client.openai() as oa:
            for _ in range(3):
                oa.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "x"}])
        return 1.0

    def careful(task, client):
        try:
            return chatty(task, client)
        except Exception as exc:  # openai.BadRequestError: episode_limit
            assert "episode_limit" in str(exc)
            return 0.5

    gateway = gw.make_gateway(HFRolloutEngine(model, tok, seed=0), tok, g, SamplingParams(max_new_tokens=4))
    try:
        (bad,) = gw.run_episodes(gateway, AgentSpec(fn=chatty), g, [Example("p", "a", "t/0")], 1, "lim")
        (good,) = gw.run_episodes(gateway, AgentSpec(fn=careful), g, [Example("p", "a", "t/0")], 1, "lim")
    finally:
        gateway.stop()
    assert bad.failure == "limit" and "max_calls" in bad.error and len(bad.record.calls) == 2
    assert not good.failure and good.value == 0.5 and len(good.record.calls) == 2
