"""``credo train`` with agents written against the real clients (tests/collect/gateway_agents.py), each through the
gateway on 127.0.0.1: the ``openai`` package with tools (sync and async), the OpenAI Agents SDK and a LangGraph
ReAct agent. Each run trains on-policy: the update's first ratio against the sampler's log-probs is 1 (no
``first_ratio`` / ``finite_logprobs`` trip)."""
from __future__ import annotations

from tests.collect.test_gateway import assert_trained_on_policy, dumped, train

AGENTS = "tests.collect.gateway_agents"


def test_openai_client_with_tools(tmp_path):
    code, run = train(tmp_path, "openai", f"rollout.collector.agent={AGENTS}:openai_tools", "train.steps=2")
    assert code == 0
    rows = assert_trained_on_policy(run, 2)
    assert all(m["gateway/calls_per_episode"] >= 1 and m["gateway/refused_calls"] == 0 for m in rows)
    for row in dumped(run):
        assert row["prompt"].startswith("tools: rev(s)")  # the request's tools, rendered by the chat template


def test_async_openai_client_turns_stitch_into_one_trajectory(tmp_path):
    code, run = train(tmp_path, "async", f"rollout.collector.agent={AGENTS}:openai_async")
    assert code == 0
    (m,) = assert_trained_on_policy(run, 1)
    assert m["gateway/calls_per_episode"] == 2 and m["gateway/stitched_episodes"] == 4
    assert all(len(row["turns"]) == 2 for row in dumped(run))


def test_openai_agents_sdk(tmp_path):
    code, run = train(tmp_path, "sdk", f"rollout.collector.agent={AGENTS}:agents_sdk")
    assert code == 0
    (m,) = assert_trained_on_policy(run, 1)
    for row in dumped(run):
        assert row["prompt"].startswith("tools: rev(s)\nrev")  # the SDK's tool and its instructions


def test_langgraph_react_agent(tmp_path):
    code, run = train(tmp_path, "langgraph", f"rollout.collector.agent={AGENTS}:langgraph_react")
    assert code == 0
    (m,) = assert_trained_on_policy(run, 1)
    assert all(row["prompt"].startswith("tools: rev(s)") for row in dumped(run))
