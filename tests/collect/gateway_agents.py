"""Agents of the gateway collector's tests (tests/collect/test_gateway*.py), written as their users would write them
against the real clients: the ``openai`` package with tools, the OpenAI Agents SDK, a LangGraph ReAct agent, and
agents that fail in each way an episode can fail. The task is credo's built-in ``reversal`` (``rev abc=`` ->
``cba``); the tool reverses a string. Rewards are dense (:func:`dense`), so a random tiny model's groups differ and
the update has advantages to follow.

Nothing here reaches anything but the gateway on 127.0.0.1 (the Agents SDK's tracing is disabled).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time

TOOLS = [{"type": "function", "function": {
    "name": "rev", "description": "reverse a string",
    "parameters": {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}}}]
MAX_TOKENS = 8  # each call's completion cap (the gateway caps it by rollout.max_new_tokens too)


def dense(text: str | None, answer: str) -> float:
    """The share of ``answer``'s characters that ``text`` has in the same place, plus a small text-dependent
    tie-breaker (< 0.1), so that a random tiny model's episodes of one group score differently and the update has
    advantages to follow (the first_ratio guard is checked on the rows an update moves)."""
    text = (text or "").strip()
    return sum(a == b for a, b in zip(text, answer)) / max(len(answer), 1) + sum(map(ord, text)) % 97 / 1000


def run_tool(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return "error: arguments are not JSON"
    if name != "rev" or not isinstance(args, dict) or not isinstance(args.get("s"), str):
        return f"error: no tool {name!r} taking s"
    return args["s"][::-1]


# ----------------------------------------------------------------------------- (a) the openai package, with tools

def openai_tools(task: dict, client, max_tokens: int | None = MAX_TOKENS) -> float:
    """A tool loop as written against the ``openai`` client: offer ``rev``, run the calls the model makes, send
    their results back, and score the final answer."""
    messages: list[dict] = [{"role": "user", "content": task["prompt"]}]
    cap = {"max_tokens": max_tokens} if max_tokens else {}
    with client.openai() as oa:
        for _ in range(3):
            resp = oa.chat.completions.create(model=client.model, messages=messages, tools=TOOLS,
                                              tool_choice="auto", **cap)
            msg = resp.choices[0].message
            if not msg.tool_calls:
                return dense(msg.content, task["answer"])
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": run_tool(call.function.name, call.function.arguments)})
    return 0.0


def openai_tools_uncapped(task: dict, client) -> float:
    """:func:`openai_tools` without a ``max_tokens`` of its own (the run's ``rollout.max_new_tokens`` caps calls)."""
    return openai_tools(task, client, max_tokens=None)


async def openai_async(task: dict, client) -> dict:
    """The async client, two turns (the second asks again); reward components (summed)."""
    messages: list[dict] = [{"role": "user", "content": task["prompt"]}]
    async with client.async_openai() as oa:
        first = await oa.chat.completions.create(model=client.model, messages=messages, max_tokens=MAX_TOKENS)
        messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                     {"role": "user", "content": "again:"}]
        second = await oa.chat.completions.create(model=client.model, messages=messages, max_tokens=MAX_TOKENS)
    return {"first": 0.5 * dense(first.choices[0].message.content, task["answer"]),
            "second": 0.5 * dense(second.choices[0].message.content, task["answer"])}


# ----------------------------------------------------------------------------- (b) the OpenAI Agents SDK

async def agents_sdk(task: dict, client) -> float:
    """An Agents SDK agent with a function tool, on the gateway as a chat-completions model."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def rev(s: str) -> str:
        """Reverse a string."""
        return s[::-1]

    async with client.async_openai() as oa:
        model = OpenAIChatCompletionsModel(model=client.model, openai_client=oa)
        agent = Agent(name="reverser", instructions="rev", model=model, tools=[rev],
                      model_settings=ModelSettings(max_tokens=MAX_TOKENS))
        result = await Runner.run(agent, task["prompt"], max_turns=3)
    return dense(str(result.final_output), task["answer"])


# ----------------------------------------------------------------------------- (c) LangGraph

def langgraph_react(task: dict, client) -> float:
    """LangGraph's prebuilt ReAct agent over langchain-openai's ChatOpenAI, with one tool (sync: run in a thread)."""
    import warnings

    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent's move to langchain.agents
        from langgraph.prebuilt import create_react_agent

    @tool
    def rev(s: str) -> str:
        """Reverse a string."""
        return s[::-1]

    llm = ChatOpenAI(base_url=client.base_url, api_key=client.api_key, model=client.model, max_tokens=MAX_TOKENS,
                     max_retries=0)
    graph = create_react_agent(llm, [rev])
    out = graph.invoke({"messages": [("user", task["prompt"])]}, {"recursion_limit": 7})
    return dense(out["messages"][-1].content, task["answer"])


# ----------------------------------------------------------------------------- faults

def raises(task: dict, client) -> float:
    with client.openai() as oa:
        oa.chat.completions.create(model=client.model, messages=[{"role": "user", "content": task["prompt"]}],
                                   max_tokens=MAX_TOKENS)
    raise RuntimeError("the agent's own bug")


_counter = itertools.count()
_lock = threading.Lock()


def faulty(task: dict, client):
    """Episode i (in the order they start, over the process): i % 8 == 1 raises, == 3 hangs past any deadline,
    == 5 returns a string (a bad reward), the others are good episodes: of any 8 consecutive episodes 3 fail."""
    with _lock:
        i = next(_counter) % 8
    if i == 1:
        raise ValueError("boom")
    if i == 3:
        time.sleep(30)  # abandoned at the deadline: a daemon thread
        return 1.0
    reward = openai_tools(task, client)
    return "not a reward" if i == 5 else reward


async def hangs(task: dict, client) -> float:
    await asyncio.sleep(3600)
    return 1.0


def silent(task: dict, client) -> float:
    """Makes no model call (nothing to train on)."""
    return 1.0


def verifier_scores(task: dict, client) -> None:
    """Answers once and leaves the scoring to the run's verifier (None)."""
    with client.openai() as oa:
        oa.chat.completions.create(model=client.model, messages=[{"role": "user", "content": task["prompt"]}],
                                   max_tokens=MAX_TOKENS)
    return None


def dense_verifier(response: str, example, **_) -> float:
    """:func:`dense` as a run's verifier (``reward.name=tests.collect.gateway_agents:dense_verifier``)."""
    return dense(response, example.answer)


async def likes_a(task: dict, client) -> float:
    """One call; the reward is the share of the letter ``a`` in the answer (a preference a tiny model can learn
    in a few steps)."""
    async with client.async_openai() as oa:
        resp = await oa.chat.completions.create(model=client.model, max_tokens=MAX_TOKENS,
                                                messages=[{"role": "user", "content": task["prompt"]}])
    text = resp.choices[0].message.content or ""
    return text.count("a") / MAX_TOKENS
