"""The gateway server with the real ``openai`` client, the OpenAI Agents SDK and langchain-openai: chat with
tools, streaming, /v1/completions, /v1/models, episode keys and limits, malformed requests (credo.gateway.server).
Exact outputs come from a scripted engine (tests/gateway/conftest.py); token-exactness from a tiny HF engine."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from credo.gateway.server import Gateway, GatewayLimits, stitch
from credo.types import SamplingParams
from tests.gateway.gateway_fakes import ROOMY, ScriptedEngine
from tests.tools.tool_templates import QWEN25, chat_tokenizer

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


@pytest.fixture(scope="module")
def scripted():
    """(gateway, engine, tokenizer): Qwen2.5's tool template on a character tokenizer, scripted outputs."""
    tok = chat_tokenizer(QWEN25)
    engine = ScriptedEngine(tok, ["hello"], end=tok.convert_tokens_to_ids("<|im_end|>"))
    gw = Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=200), token="operator-secret",
                 limits=GatewayLimits(max_calls=4, max_tokens=1000, batch_wait_s=0.0))
    gw.start()
    yield gw, engine, tok
    gw.stop()


def script(engine, *texts):
    engine.texts, engine.served = list(texts), 0


def test_models_and_keys(scripted):
    gw, _, _ = scripted
    c = gw.open_episode("m")
    assert [m.id for m in c.openai().models.list().data] == ["credo-policy"]
    op = openai.OpenAI(base_url=gw.base_url, api_key="operator-secret", max_retries=0)
    assert op.models.retrieve("credo-policy").id == "credo-policy"
    with pytest.raises(openai.AuthenticationError):  # the operator key scopes no completion
        op.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base_url, api_key="nope", max_retries=0).models.list()
    gw.close_episode(c)


def test_tool_call_round_trip_with_the_openai_client(scripted):
    gw, engine, tok = scripted
    script(engine, CALL, "The sum is 7.")
    c = gw.open_episode("tools")
    client = c.openai()
    msgs = [{"role": "user", "content": "What is 3+4?"}]
    r = client.chat.completions.create(model=c.model, messages=msgs, tools=[ADD])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [tc] = choice.message.tool_calls
    assert tc.id.startswith("call_") and tc.type == "function" and tc.function.name == "add"
    assert json.loads(tc.function.arguments) == {"a": 3, "b": 4}
    # usage: the scripted text is one token a character, then <|im_end|>
    assert r.usage.completion_tokens == len(CALL) + 1 and r.usage.prompt_tokens == len(engine.batches[-1][0])
    msgs += [choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": tc.id, "content": "7"}]
    r2 = client.chat.completions.create(model=c.model, messages=msgs, tools=[ADD])
    assert r2.choices[0].message.content == "The sum is 7." and r2.choices[0].finish_reason == "stop"
    rec = gw.close_episode(c)
    assert [x.finish_reason for x in rec.calls] == ["tool_calls", "stop"] and rec.refused == []
    assert rec.calls[1].reused_call == 0 and rec.calls[0].policy_version == 7
    [seg] = stitch(rec.calls)
    first, second = rec.calls
    inserted = second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids):]
    assert tok.decode(inserted) == ("\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
                                    "<|im_start|>assistant\n")
    n0, n1 = len(first.completion_ids), len(second.completion_ids)
    assert seg.response_mask == [1] * n0 + [0] * len(inserted) + [1] * n1
    assert seg.logprobs == [-0.25] * n0 + [0.0] * len(inserted) + [-0.25] * n1


def test_sampled_ids_are_substituted_when_the_render_would_differ(scripted):
    """The model writes compact JSON; the template re-renders the call with spaces: without the substitution the
    second prompt would not extend the first call's ids and the episode would split in two."""
    gw, engine, _ = scripted
    compact = '<tool_call>\n{"name":"add","arguments":{"a":3,"b":4}}\n</tool_call>'
    script(engine, compact, "7")
    c = gw.open_episode("compact")
    client = c.openai()
    msgs = [{"role": "user", "content": "What is 3+4?"}]
    r = client.chat.completions.create(model=c.model, messages=msgs, tools=[ADD])
    msgs += [r.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": r.choices[0].message.tool_calls[0].id, "content": "7"}]
    client.chat.completions.create(model=c.model, messages=msgs, tools=[ADD])
    rec = gw.close_episode(c)
    assert len(stitch(rec.calls)) == 1
    from credo.gateway.protocol import parse_messages

    plain = gw.renderer.render(parse_messages(msgs), [ADD])
    first = rec.calls[0]
    assert plain[:len(first.prompt_ids) + len(first.completion_ids)] != first.prompt_ids + first.completion_ids


def test_streaming_chat_with_tool_calls_and_usage(scripted):
    gw, engine, _ = scripted
    script(engine, "Sure. " + CALL)
    c = gw.open_episode("stream")
    stream = c.openai().chat.completions.create(model=c.model, messages=[{"role": "user", "content": "3+4?"}],
                                                tools=[ADD], stream=True, stream_options={"include_usage": True})
    content, args, names, finish, usage = "", "", [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                names += [tc.function.name] if tc.function.name else []
                args += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    assert content == "Sure." and names == ["add"] and json.loads(args) == {"a": 3, "b": 4}
    assert finish == "tool_calls" and usage.completion_tokens == len("Sure. " + CALL) + 1
    gw.close_episode(c)


def test_raw_stream_ends_with_done(scripted):
    gw, engine, _ = scripted
    script(engine, "abc")
    c = gw.open_episode("raw")
    r = httpx.post(f"{gw.base_url}/chat/completions", headers={"Authorization": f"Bearer {c.api_key}"},
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True})
    events = [line for line in r.text.split("\n\n") if line]
    assert r.headers["content-type"].startswith("text/event-stream") and events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"
    gw.close_episode(c)


def test_stop_strings_cut_the_answer_and_the_recorded_ids(scripted):
    gw, engine, tok = scripted
    script(engine, "one. two. three.")
    c = gw.open_episode("stop")
    r = c.openai().chat.completions.create(model=c.model, messages=[{"role": "user", "content": "count"}],
                                           stop=["two"])
    assert r.choices[0].message.content == "one. " and r.choices[0].finish_reason == "stop"
    [call] = gw.close_episode(c).calls
    assert tok.decode(call.completion_ids) == "one. two"  # up to the token that completed the stop string
    assert r.usage.completion_tokens == len(call.completion_ids) == len(call.logprobs) == 8


def test_completions_with_text_and_token_ids(scripted):
    gw, engine, tok = scripted
    script(engine, "xyz")
    c = gw.open_episode("cmpl")
    client = c.openai()
    r = client.completions.create(model=c.model, prompt="abc", max_tokens=2)
    assert r.choices[0].text == "xy" and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2
    engine.served = 0
    r = client.completions.create(model=c.model, prompt=[5, 6, 7], logprobs=0)
    assert r.choices[0].text == "xyz" and r.choices[0].logprobs.token_logprobs == [-0.25] * 4
    assert engine.batches[-1] == [[5, 6, 7]]  # token ids are used as they are
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=c.model, prompt=[5, len(tok) + 10])
    rec = gw.close_episode(c)
    assert [x.endpoint for x in rec.calls] == ["completions"] * 2 and len(rec.refused) == 1


def test_keys_scope_calls_to_their_episode(scripted):
    gw, engine, _ = scripted
    script(engine, "a")
    a, b = gw.open_episode("A"), gw.open_episode("B")
    a.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])
    b.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "2"}])
    b.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "3"}])
    rec_a = gw.close_episode(a)
    assert len(rec_a.calls) == 1 and rec_a.calls[0].messages[0]["content"] == "1"
    with pytest.raises(openai.AuthenticationError, match="episode_closed|closed"):
        a.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "4"}])
    b.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "5"}])  # B unaffected
    rec_b = gw.close_episode(b)
    assert [x.messages[0]["content"] for x in rec_b.calls] == ["2", "3", "5"]
    assert len(rec_a.calls) == 1  # a's record did not change
    with pytest.raises(KeyError):
        gw.close_episode(a)


def test_episode_limits(scripted):
    gw, engine, _ = scripted
    script(engine, "x" * 300)  # 300 tokens + <|im_end|> wanted; run cap 200
    c = gw.open_episode("limits")
    client = c.openai()
    msgs = [{"role": "user", "content": "go"}]
    # max_tokens 1000 per episode: calls of 200 + 200 + 200 + 200 = 800, then a 4th call is over max_calls 4
    for _ in range(4):
        r = client.chat.completions.create(model="m", messages=msgs)
        assert r.usage.completion_tokens == 200 and r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="m", messages=msgs)
    assert exc.value.body["code"] == "episode_limit" and "max_calls" in exc.value.body["message"]
    rec = gw.close_episode(c)
    assert len(rec.calls) == 4 and len(rec.refused) == 1 and rec.refused[0].startswith("episode_limit")


def test_token_budget_caps_the_last_call_then_refuses():
    tok = chat_tokenizer(QWEN25)
    engine = ScriptedEngine(tok, ["y" * 50], end=tok.convert_tokens_to_ids("<|im_end|>"))
    with Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=40),
                 limits=GatewayLimits(max_tokens=60, batch_wait_s=0.0)) as gw:
        c = gw.open_episode("budget", deadline_s=60)
        client = c.openai()
        msgs = [{"role": "user", "content": "go"}]
        sizes = [client.chat.completions.create(model="m", messages=msgs, max_tokens=100).usage.completion_tokens
                 for _ in range(2)]
        assert sizes == [40, 20]  # 60 = 40 (run cap) + 20 (what is left)
        assert engine.caps == [40, 20]
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            client.chat.completions.create(model="m", messages=msgs)
        gw.close_episode(c)
        d = gw.open_episode("deadline", deadline_s=0.3)
        time.sleep(0.5)
        with pytest.raises(openai.BadRequestError, match="deadline"):
            d.openai().chat.completions.create(model="m", messages=msgs)
        assert gw.close_episode(d).refused[0].startswith("episode_limit")


@pytest.mark.parametrize("body,needle", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"messages": "hi"}).encode(), "messages must be a non-empty list"),
    (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), "role must be one of"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), "n must be 1"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}).encode(), "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}).encode(),
     "only text content"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web"}]}).encode(),
     "function tools"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [ADD],
                 "tool_choice": {"type": "function", "function": {"name": "mul"}}}).encode(), "not among the tools"),
    (json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode(), "context"),
])
def test_malformed_requests_are_400_in_openai_format(scripted, body, needle):
    gw, engine, _ = scripted
    script(engine, "ok")
    c = gw.open_episode("bad")
    r = httpx.post(f"{gw.base_url}/chat/completions", content=body,
                   headers={"Authorization": f"Bearer {c.api_key}", "content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"
    ok = c.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert ok.choices[0].message.content == "ok"  # the server goes on
    rec = gw.close_episode(c)
    assert len(rec.refused) == 1 and len(rec.calls) == 1


def test_unauthenticated_requests_are_refused_before_the_body(scripted):
    gw, _, _ = scripted
    r = httpx.post(f"{gw.base_url}/chat/completions", content=b"x" * 1000)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_concurrent_calls_share_an_engine_batch():
    tok = chat_tokenizer(QWEN25)
    engine = ScriptedEngine(tok, ["z"], end=tok.convert_tokens_to_ids("<|im_end|>"))
    with Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=8),
                 limits=GatewayLimits(batch_wait_s=1.0, concurrency=3)) as gw:
        clients = [gw.open_episode(f"e{i}") for i in range(4)]

        async def all_calls():
            return await asyncio.gather(*[c.async_openai().chat.completions.create(
                model="m", messages=[{"role": "user", "content": str(i)}]) for i, c in enumerate(clients)])

        answers = asyncio.run(all_calls())
        assert all(a.choices[0].message.content == "z" for a in answers)
        sizes = [len(b) for b in engine.batches]
        # 4 calls, at most 3 a batch: (3, 1) when they arrive within the scheduler's 1 s wait
        assert sum(sizes) == 4 and max(sizes) <= 3 and max(sizes) >= 2, sizes
        recs = [gw.close_episode(c) for c in clients]
        assert [r.calls[0].messages[0]["content"] for r in recs] == ["0", "1", "2", "3"]


def test_openai_agents_sdk_runs_a_tool_through_the_gateway(scripted):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    gw, engine, _ = scripted
    script(engine, CALL, "The sum is 7.")
    seen = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        seen.append((a, b))
        return a + b

    c = gw.open_episode("sdk")
    agent = Agent(name="calc", instructions="Use the tool.", tools=[add],
                  model=OpenAIChatCompletionsModel(model=c.model, openai_client=c.async_openai()))
    result = asyncio.run(Runner.run(agent, "What is 3+4?"))
    assert result.final_output == "The sum is 7." and seen == [(3, 4)]
    rec = gw.close_episode(c)
    assert [x.finish_reason for x in rec.calls] == ["tool_calls", "stop"] and len(stitch(rec.calls)) == 1


def test_langchain_chat_openai_tool_calls_plain_and_streamed(scripted):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    gw, engine, _ = scripted
    for streaming in (False, True):
        script(engine, CALL, "The sum is 7.")
        c = gw.open_episode(f"lc-{streaming}")
        llm = ChatOpenAI(model=c.model, base_url=c.base_url, api_key=c.api_key, max_retries=0,
                         streaming=streaming).bind_tools([add])
        msgs = [HumanMessage("What is 3+4?")]
        ai = llm.invoke(msgs)
        assert [(t["name"], t["args"]) for t in ai.tool_calls] == [("add", {"a": 3, "b": 4})]
        msgs += [ai, ToolMessage(content="7", tool_call_id=ai.tool_calls[0]["id"])]
        assert llm.invoke(msgs).content == "The sum is 7."
        rec = gw.close_episode(c)
        assert rec.calls[1].reused_call == 0 and len(stitch(rec.calls)) == 1


# ------------------------------------------------------------------------------------------------ a real engine

@pytest.fixture(scope="module")
def tiny_gateway():
    """A tiny HF engine (one token a character, no chat template: credo.tools.render.CHAR_TOOL_TEMPLATE)."""
    import torch

    from credo.models import build_model
    from credo.rollout.hf import HFRolloutEngine


    torch.manual_seed(0)
    model, tok = build_model(ROOMY, seed=0)
    engine = HFRolloutEngine(model, tok, seed=3)
    gw = Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=12), limits=GatewayLimits(batch_wait_s=0.0))
    gw.start()
    yield gw, engine, model, tok
    gw.stop()


def test_recorded_ids_and_logprobs_are_the_engines(tiny_gateway):
    from credo.rollout.hf import HFRolloutEngine

    gw, engine, model, tok = tiny_gateway
    state = engine.state_dict()  # the generator before the call: a twin engine replays the same draws
    c = gw.open_episode("exact")
    r = c.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "rev abc="}])
    [call] = gw.close_episode(c).calls
    twin = HFRolloutEngine(model, tok, seed=0)
    twin.load_state_dict(state)
    [cont] = twin.continue_ids([call.prompt_ids], SamplingParams(max_new_tokens=12), stop_ids=(tok.eos_token_id,))
    assert call.completion_ids == cont.ids and call.logprobs == pytest.approx(cont.logprobs, abs=1e-6)
    [scored] = engine.score_ids([call.prompt_ids + call.completion_ids], [len(call.prompt_ids)])
    assert scored == pytest.approx(call.logprobs, abs=1e-4)  # temperature 1: the sampler's are the model's
    assert r.usage.completion_tokens == len(call.completion_ids)
    ended = call.completion_ids[-1] == tok.eos_token_id
    text = tok.decode(call.completion_ids[:-1] if ended else call.completion_ids, skip_special_tokens=True)
    assert r.choices[0].message.content == text


def test_a_multi_turn_episode_stitches_into_one_trajectory(tiny_gateway):
    gw, engine, _, tok = tiny_gateway
    c = gw.open_episode("turns")
    client = c.openai()
    msgs = [{"role": "user", "content": "hi"}]
    for turn in range(3):
        r = client.chat.completions.create(model="m", messages=msgs)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": f"again {turn}"}]
    rec = gw.close_episode(c)
    [seg] = stitch(rec.calls)
    assert seg.calls == [0, 1, 2] and [x.reused_call for x in rec.calls] == [None, 0, 1]
    model_tokens = sum(len(x.completion_ids) for x in rec.calls)
    assert sum(seg.response_mask) == model_tokens
    ones = [lp for lp, m in zip(seg.logprobs, seg.response_mask) if m]
    assert ones == [lp for x in rec.calls for lp in x.logprobs]
    # the inserted ids are the template's: after a turn (ended by EOS, or closed by it), the next user message
    first = rec.calls[0]
    inserted = rec.calls[1].prompt_ids[len(first.prompt_ids) + len(first.completion_ids):]
    closed = [] if first.completion_ids[-1] == tok.eos_token_id else [tok.eos_token_id]
    assert inserted == closed + list(tok("again 0\n", add_special_tokens=False)["input_ids"])


def test_gateway_stop_refuses_new_calls():
    tok = chat_tokenizer(QWEN25)
    engine = ScriptedEngine(tok, ["z"], end=tok.convert_tokens_to_ids("<|im_end|>"))
    gw = Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=8))
    url = gw.start()
    c = gw.open_episode("s")
    threads = [gw._thread, gw.scheduler._thread]
    gw.stop()
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=url, api_key=c.api_key, max_retries=0, timeout=5).models.list()
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(RuntimeError, match="stopped"):
        gw.start()


def test_a_template_that_rewrites_past_turns_still_stitches():
    """Qwen3-style: a past assistant turn loses its <think> block when re-rendered; with render=append the sampled
    ids are kept (render=auto re-renders such a template: tests/tools/test_template_check.py)."""
    from credo.gateway.protocol import parse_messages
    from tests.tools.tool_templates import THINK_STRIPPING

    tok = chat_tokenizer(THINK_STRIPPING)
    engine = ScriptedEngine(tok, ["<think>greet back</think>Hi!", "Bye."], end=tok.convert_tokens_to_ids("<|im_end|>"))
    with Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=100), limits=GatewayLimits(batch_wait_s=0.0),
                 render="append") as gw:
        c = gw.open_episode("think")
        client = c.openai()
        msgs = [{"role": "user", "content": "Hello"}]
        r = client.chat.completions.create(model="m", messages=msgs)
        assert r.choices[0].message.content == "<think>greet back</think>Hi!"
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "ok"}]
        client.chat.completions.create(model="m", messages=msgs)
        rec = gw.close_episode(c)
        [seg] = stitch(rec.calls)
        assert seg.calls == [0, 1] and rec.calls[1].reused_call == 0
        assert "<think>" not in tok.decode(gw.renderer.render(parse_messages(msgs), []))  # what a plain render gives


def test_qwen3_coder_calls_round_trip():
    """Qwen3-Coder's XML calls (tool_parser=qwen3_coder); parameter values converted by the tool's schema."""
    from tests.tools.tool_templates import QWEN3_CODER

    tok = chat_tokenizer(QWEN3_CODER)
    xml = ("<tool_call>\n<function=add>\n<parameter=a>\n3\n</parameter>\n<parameter=b>\n4\n</parameter>\n"
           "</function>\n</tool_call>")
    engine = ScriptedEngine(tok, [xml, "7"], end=tok.convert_tokens_to_ids("<|im_end|>"))
    with Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=300), tool_parser="qwen3_coder",
                 limits=GatewayLimits(batch_wait_s=0.0)) as gw:
        c = gw.open_episode("coder")
        client = c.openai()
        msgs = [{"role": "user", "content": "3+4?"}]
        r = client.chat.completions.create(model="m", messages=msgs, tools=[ADD])
        [tc] = r.choices[0].message.tool_calls
        assert json.loads(tc.function.arguments) == {"a": 3, "b": 4}  # integers, as the schema says
        msgs += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": tc.id, "content": "7"}]
        client.chat.completions.create(model="m", messages=msgs, tools=[ADD])
        rec = gw.close_episode(c)
        assert [s.calls for s in stitch(rec.calls)] == [[0, 1]] and rec.calls[1].reused_call == 0


class SlowOrFailingEngine(ScriptedEngine):
    """Sleeps ``delay`` seconds per batch; a prompt holding the text "FAIL" makes the batch raise."""

    delay = 0.0
    generating = threading.Event()  # set when a batch starts

    def continue_ids(self, prefixes, sampling, **kw):
        self.generating.set()
        time.sleep(self.delay)
        if any("FAIL" in self.tokenizer.decode(p) for p in prefixes):
            raise RuntimeError("CUDA out of memory (simulated)")
        return super().continue_ids(prefixes, sampling, **kw)


def test_engine_failures_closing_mid_call_and_the_body_cap():
    from credo.http_server import ServerLimits

    tok = chat_tokenizer(QWEN25)
    engine = SlowOrFailingEngine(tok, ["fine"], end=tok.convert_tokens_to_ids("<|im_end|>"))
    limits = GatewayLimits(batch_wait_s=0.0, server=ServerLimits(max_body_bytes=2000))
    with Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=8), limits=limits) as gw:
        c = gw.open_episode("faults")
        client = c.openai()
        with pytest.raises(openai.InternalServerError) as exc:  # the engine failed the batch: 500, not a crash
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "FAIL"}])
        assert exc.value.body["code"] == "engine_error" and "out of memory" in exc.value.body["message"]
        ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
        assert ok.choices[0].message.content == "fine"
        r = httpx.post(f"{gw.base_url}/chat/completions", headers={"Authorization": f"Bearer {c.api_key}"},
                       json={"messages": [{"role": "user", "content": "x" * 3000}]})
        assert r.status_code == 413  # credo.http_server.BodyLimit
        rec = gw.close_episode(c)
        assert len(rec.calls) == 1 and rec.refused[0].startswith("engine_error")

        engine.delay, engine.generating = 1.0, threading.Event()
        d = gw.open_episode("closed-mid-call")
        answers = []
        t = threading.Thread(target=lambda: answers.append(d.openai().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "slow"}])))
        t.start()
        assert engine.generating.wait(10)
        rec = gw.close_episode(d)  # while the engine generates its call
        t.join(10)
        assert answers and answers[0].choices[0].message.content == "fine"  # answered ...
        assert rec.calls == [] and "still generating" in rec.refused[0]  # ... not recorded
