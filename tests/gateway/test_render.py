"""Rendering chat requests and substituting an episode's sampled ids (credo.gateway.render)."""
from __future__ import annotations

from credo.gateway.protocol import parse_messages
from credo.gateway.render import ChatRenderer, Turn, TurnMemory, canonical, canonical_tools
from credo.models.tokenizer import build_char_tokenizer
from credo.tools.parsers import get_parser
from tests.tools.tool_templates import QWEN25, chat_tokenizer

ADD = [{"type": "function", "function": {"name": "add", "description": "",
                                         "parameters": {"type": "object", "properties": {"a": {}, "b": {}}}}}]


def test_canonical_form_ignores_spacing_ids_and_the_developer_role():
    a = parse_messages([{"role": "developer", "content": [{"type": "text", "text": "be"}, {"type": "text",
                                                                                          "text": " brief"}]},
                        {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "call_1", "type": "function",
                             "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}])
    b = parse_messages([{"role": "system", "content": "be brief"},
                        {"role": "assistant", "content": "  ", "tool_calls": [
                            {"id": "other", "type": "function",
                             "function": {"name": "add", "arguments": '{"b":2,"a":1}'}}]}])
    assert [canonical(m) for m in a] == [canonical(m) for m in b]
    c = parse_messages([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 3}'}}]}])
    assert canonical(c[0]) != canonical(a[1])


def test_a_tool_message_takes_its_name_from_the_call_it_answers():
    msgs = parse_messages([{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"}])
    assert msgs[1]["name"] == "add" and msgs[1]["content"] == "3"


def test_delta_is_what_the_template_writes_after_a_turn_through_the_generation_prompt():
    tok = chat_tokenizer(QWEN25)
    r = ChatRenderer(tok, get_parser("hermes"))
    assert r.renders_tool_calls and r.end_of_turn == tok.convert_tokens_to_ids("<|im_end|>")
    delta = r.delta(parse_messages([{"role": "tool", "tool_call_id": "c", "content": "7"}]), ADD)
    # Qwen2.5: the newline after <|im_end|>, the tool response in a user turn, then the assistant prefix
    assert tok.decode(delta) == ("\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
                                 "<|im_start|>assistant\n")


def test_a_template_without_tool_calls_gets_them_in_the_content():
    tok = build_char_tokenizer()  # no chat template: credo.tools.render.CHAR_TOOL_TEMPLATE
    r = ChatRenderer(tok, get_parser("hermes"))
    assert not r.renders_tool_calls
    [t] = r.template_messages(parse_messages([{"role": "assistant", "content": "ok", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}]))
    assert t["content"] == 'ok\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    ids = r.render(parse_messages([{"role": "user", "content": "hi"}]), ADD)
    assert tok.decode(ids, skip_special_tokens=True) == "tools: add(a,b)\nhi\n"


def test_substitution_uses_the_sampled_ids_of_the_longest_matching_turn():
    tok = chat_tokenizer(QWEN25)
    r = ChatRenderer(tok, get_parser("hermes"))
    user = parse_messages([{"role": "user", "content": "hi"}])
    said = {"role": "assistant", "content": "yo", "tool_calls": []}
    prompt = r.render(user, [])
    sampled = list(tok("yo  ", add_special_tokens=False)["input_ids"]) + [r.end_of_turn]  # not what a render gives
    memory = TurnMemory([r.turn(user, [], said, prompt, sampled, 0)])
    follow = parse_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                             {"role": "user", "content": "more"}])
    ids, reused = r.prompt(follow, [], memory)
    assert reused == 0 and ids[:len(prompt) + len(sampled)] == prompt + sampled
    assert ids[len(prompt) + len(sampled):] == r.delta(follow[2:], [])
    plain, none = r.prompt(follow, [], None)
    assert none is None and plain[:len(prompt) + len(sampled)] != prompt + sampled  # why substitution exists
    # other tools, or a conversation that does not continue the turn: no substitution
    assert r.prompt(follow, ADD, memory)[1] is None
    other = parse_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no"},
                            {"role": "user", "content": "more"}])
    assert r.prompt(other, [], memory)[1] is None


def test_turn_memory_prefers_the_longest_turn():
    short = Turn(("a",), canonical_tools([]), [1], 0)
    long = Turn(("a", "b", "c"), canonical_tools([]), [1, 2, 3], 1)
    mem = TurnMemory([short, long])
    assert mem.match(("a", "b", "c", "d"), canonical_tools([])) is long
    assert mem.match(("a", "b"), canonical_tools([])) is short
    assert mem.match(("a", "b", "c"), canonical_tools([])) is short  # the longest turn needs a message after it
    assert mem.match(("a", "x"), canonical_tools(ADD)) is None
