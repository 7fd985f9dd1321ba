"""``credo train`` with agents written against the real clients (tests/collect/gateway_agents.py), each through the
gateway on 127.0.0.1: the ``openai`` package with tools (sync and async), the OpenAI Agents SDK and a LangGraph
ReAct agent. Each run trains on-policy: the update's first ratio against the sampler's log-probs is 1 (no
``first_ratio`` / ``finite_logprobs`` trip); one learns (its reward rises)."""
from __future__ import annotations

import json

from tests.collect.test_gateway import assert_trained_on_policy, dumped, steps, train

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


def test_an_agent_reward_is_learned(tmp_path):
    """The reward of an async openai agent (the share of the letter ``a`` in its answer) rises under GRPO through
    the gateway: measured 0.003 over the first 3 steps to 0.19 over the last 3 of 10, and the greedy evaluation's
    reward from 0 to 1 (every greedy answer all ``a``)."""
    code, run = train(tmp_path, "learn", f"rollout.collector.agent={AGENTS}:likes_a", "train.steps=10",
                      "rollout.group_size=8", "train.prompts_per_step=2", "train.lr=3e-2", "log.rollouts_every=0")
    assert code == 0
    rewards = [m["gateway/reward_mean"] for m in steps(run)]
    assert len(rewards) == 10 and sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.05, rewards
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final/eval/reward_mean"] >= summary["start/eval/reward_mean"] + 0.5, summary
    # guard/<name>_trips appears from the first step whose update ran the check: a step whose groups all tied
    # (every reward 0 at the start) trains nothing and reports none (the CI failure of 3df7b50)
    checked = [m for m in steps(run) if "guard/first_ratio_trips" in m]
    assert checked and all(m["guard/first_ratio_trips"] == 0 for m in checked)
