"""The extension property of a chat template, proved or refuted on seeded conversations (docs/templates.md).

An agent loop that appends token ids turn by turn (credo.rollout.agent_loop, the gateway's substitution in
credo.gateway.render) trains on exactly what the template would render only if every state it holds is a prefix of
the next one. For a conversation ``m`` whose assistant messages are at indices ``a_1 < a_2 < ...``, the states are::

    R(a_1)  render(m[:a_1])                         the prompt
    G(a_1)  render(m[:a_1], generation prompt)      the loop appended the assistant prefix
    E(a_1)  G(a_1) + encode(the assistant's turn)   the model's tokens, as it emits them
    F(a_1)  render(m[:a_1 + 1])                     the same turn, rendered by the template
    R(a_2)  render(m[:a_2])                         the loop appended the tool results / user message
    ...                                             (and R(n) when the conversation ends after tool results)

The property holds when each state's ids are a prefix of the next state's ids, for every conversation (system,
user, assistant with and without reasoning, tool calls, parallel tool results, several turns, with ``tools=``).
The assistant's turn as the model emits it is the text the template writes for that message when it is the last
one (after the generation prompt), with its reasoning put back in front (``<think>\\n...\\n</think>\\n\\n``) when
the template drops even the last turn's reasoning. The first pair that fails is reported with its first diverging
token and a cause read off the text (:data:`CAUSES`).
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from credo.tools.render import render_ids, render_text

CAUSES = {
    "reasoning_stripped": "an earlier assistant turn's reasoning (<think> / reasoning_content) is dropped when "
                          "later messages are rendered",
    "separator_at_tool_boundary": "a separator is added or dropped where a tool call or tool result meets the "
                                  "next message",
    "generation_prompt_differs": "the generation prompt is not what the assistant turn starts with once rendered",
    "tokenizer_merge": "the text is a prefix but the tokens are not: the tokenizer merges across the seam",
    "other": "the text diverges otherwise (see the diff)",
}

_WORDS = ("apple river stone cloud seven paper window garden silver orange lamp forest copper music table bridge "
          "yellow candle winter engine basket harbor violet marble").split()
_TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "first"},
                                                    "b": {"type": "integer", "description": "second"}},
                   "required": ["a", "b"]}}},
          {"type": "function", "function": {
              "name": "lookup", "description": "Look a word up.",
              "parameters": {"type": "object", "properties": {"word": {"type": "string", "description": "the word"}},
                             "required": ["word"]}}}]


@dataclass
class Divergence:
    """Where the extension property fails first (module docstring)."""

    conversation: str  # which seeded conversation
    step: str  # the pair of states, e.g. "F(3) -> R(5): tool results appended after assistant turn 3"
    message_index: int  # the assistant message (or the first appended message) at the seam
    token_index: int  # first index where the earlier state's ids and the later state's ids differ
    tokens: tuple[str, str]  # the decoded tokens at that index: (earlier state, later state); "" past the end
    cause: str  # a key of CAUSES
    detail: str  # the text around the divergence, both sides


@dataclass
class Verdict:
    """Whether a chat template (with a tokenizer) has the extension property (module docstring)."""

    holds: bool
    conversations: int  # conversations rendered
    checks: int  # pairs of states compared
    tokenizer: str  # which tokenizer tokenised the renders
    divergence: Divergence | None = None  # the first conversation's (in order) that fails
    skipped: list[str] = field(default_factory=list)  # conversations the template refused to render, and why
    results: dict[str, str] = field(default_factory=dict)  # per conversation: "holds", a cause, or "skipped"

    @property
    def cause(self) -> str | None:
        return self.divergence.cause if self.divergence else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line: holds, or the first divergence and its cause."""
        if self.holds:
            return f"holds: {self.checks} prefix checks over {self.conversations} conversations ({self.tokenizer})"
        d = self.divergence
        return (f"refuted ({d.cause}): conversation {d.conversation!r}, {d.step}, first diverging token {d.token_index}"
                f" {d.tokens[0]!r} vs {d.tokens[1]!r}; {d.detail}")


# ----------------------------------------------------------------------------- seeded conversations

def _reasoning_field(template: str) -> bool:
    """Whether the template reads reasoning from a ``reasoning_content`` field (else it is inline <think>)."""
    return "reasoning_content" in template


def _assistant(rng: random.Random, reasoning: bool, field_style: bool, calls: list[dict] | None = None) -> dict:
    content = "" if calls else " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5))) + "."
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        thought = "I think " + " ".join(rng.choice(_WORDS) for _ in range(4))
        if field_style:
            msg["reasoning_content"] = thought
        else:
            msg["content"] = f"<think>\n{thought}\n</think>\n\n{content}"
    if calls:
        msg["tool_calls"] = calls
    return msg


def _call(rng: random.Random, n: int) -> dict:
    call_id = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(9))  # Mistral wants 9
    if n % 2:
        name, args = "lookup", {"word": rng.choice(_WORDS)}
    else:
        name, args = "add", {"a": rng.randint(1, 99), "b": rng.randint(1, 99)}
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _result(call: dict, rng: random.Random) -> dict:
    return {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
            "content": str(rng.randint(2, 198)) if call["function"]["name"] == "add" else rng.choice(_WORDS)}


def _user(rng: random.Random) -> dict:
    return {"role": "user", "content": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 6))) + "?"}


def conversations(seed: int = 0, field_style: bool = False) -> list[tuple[str, list[dict], list[dict] | None]]:
    """The seeded conversations: (name, messages, tools). ``field_style``: reasoning as ``reasoning_content``."""
    out = []
    for reasoning in (False, True):
        rng = random.Random(f"{seed}-{reasoning}")
        tag = "+reasoning" if reasoning else ""
        system = {"role": "system", "content": "You are a careful assistant."}
        chat = [system]
        for _ in range(3):
            chat += [_user(rng), _assistant(rng, reasoning, field_style)]
        out.append((f"chat{tag}", chat, None))
        out.append((f"chat-no-system{tag}", [m for m in chat[1:5]], None))
        c1, c2, c3, c4 = (_call(rng, i) for i in range(4))
        tools = [system, _user(rng),
                 _assistant(rng, reasoning, field_style, [c1]), _result(c1, rng),
                 _assistant(rng, reasoning, field_style, [c2]), _result(c2, rng),
                 _assistant(rng, reasoning, field_style), _user(rng),
                 _assistant(rng, reasoning, field_style, [c3]), _result(c3, rng)]
        out.append((f"tools{tag}", tools, _TOOLS))
        parallel = [system, _user(rng), _assistant(rng, reasoning, field_style, [c1, c4]), _result(c1, rng),
                    _result(c4, rng), _assistant(rng, reasoning, field_style), _user(rng),
                    _assistant(rng, reasoning, field_style)]
        out.append((f"parallel-tools{tag}", parallel, _TOOLS))
    return out


# ----------------------------------------------------------------------------- the check

@dataclass
class _State:
    name: str
    text: str
    ids: list[int]
    index: int  # the message at the seam that leads to this state
    seam: int = 0  # where in ``text`` this state's appended part begins


class _Render:
    def __init__(self, tokenizer, template: str | None, tools, template_kwargs: dict):
        self.tokenizer, self.template, self.tools, self.kw = tokenizer, template, tools, template_kwargs

    def __call__(self, msgs: list[dict], gen: bool) -> tuple[str, list[int]]:
        text = render_text(self.tokenizer, msgs, self.tools, gen, self.template, **self.kw)
        return text, render_ids(self.tokenizer, msgs, self.tools, gen, self.template, **self.kw)


def _reasoning(msg: dict) -> str:
    if msg.get("reasoning_content"):
        return msg["reasoning_content"]
    m = re.search(r"<think>\n?(.*?)\n?</think>", msg.get("content") or "", re.S)
    return m.group(1) if m else ""


def _states(render: _Render, msgs: list[dict], encode) -> list[_State]:
    """The loop's states for one conversation (module docstring)."""
    assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    states: list[_State] = []
    for n, k in enumerate(assistants):
        before = "the prompt" if n == 0 else "the messages after the previous assistant turn appended"
        r_text, r_ids = render(msgs[:k], False)
        states.append(_State(f"R({k}): {before}", r_text, r_ids, k, len(states[-1].text) if states else 0))
        g_text, g_ids = render(msgs[:k], True)
        states.append(_State(f"G({k}): generation prompt appended", g_text, g_ids, k, len(r_text)))
        f_text, f_ids = render(msgs[:k + 1], False)
        if f_text.startswith(g_text):
            body = f_text[len(g_text):]
            thought = _reasoning(msgs[k])
            if thought and thought not in body:  # the template drops even the last turn's reasoning
                body = f"<think>\n{thought}\n</think>\n\n" + body
            states.append(_State(f"E({k}): assistant turn {k} as the model emits it", g_text + body,
                                 g_ids + encode(body), k, len(g_text)))
        states.append(_State(f"F({k}): assistant turn {k} rendered by the template", f_text, f_ids, k, len(g_text)))
    if assistants and assistants[-1] + 1 < len(msgs):
        states.append(_State(f"R({len(msgs)}): the messages after the last assistant turn appended",
                             *render(msgs, False), assistants[-1] + 1, len(states[-1].text)))
    return states


_SEPARATOR = re.compile(r"(?:\s|<[^<>\s]{1,40}>|\[/?[A-Z_]{2,30}\]|<｜[^｜]{1,40}｜>)+")


def _changed_piece(a: str, b: str, c: int, span: int = 48) -> tuple[str, str] | None:
    """("added" | "dropped", piece) when ``b`` is ``a`` with one short piece inserted or removed at ``c``."""
    rest_a, rest_b = a[c:], b[c:]
    for d in range(1, min(span, len(rest_b)) + 1):
        if rest_b[d:].startswith(rest_a):
            return "added", rest_b[:d]
    for e in range(1, min(span, len(rest_a)) + 1):
        if rest_b.startswith(rest_a[e:]) and rest_a[e:]:
            return "dropped", rest_a[:e]
    return None


def _classify(a: _State, b: _State, msgs: list[dict]) -> tuple[str, str]:
    """(cause, detail) of a failing pair (docs/templates.md#causes)."""
    if b.text.startswith(a.text):
        return "tokenizer_merge", f"text is a prefix, tokens differ at the seam {a.text[-30:]!r} | " \
                                  f"{b.text[len(a.text):len(a.text) + 30]!r}"
    c = next((i for i, (x, y) in enumerate(zip(a.text, b.text)) if x != y), min(len(a.text), len(b.text)))
    detail = f"earlier: ...{a.text[max(0, c - 40):c + 40]!r}; later: ...{b.text[max(0, c - 40):c + 40]!r}"
    changed = _changed_piece(a.text, b.text, c)
    if changed:
        detail = f"{changed[0]} {changed[1]!r}; " + detail
    seam = msgs[max(0, a.index - 1):b.index + 1]
    at_tools = any(m["role"] == "tool" or m.get("tool_calls") for m in seam)
    separator = bool(changed and _SEPARATOR.fullmatch(changed[1]))
    rest_a, rest_b = re.sub(r"\s+", "", a.text[c:]), re.sub(r"\s+", "", b.text[c:])
    if not separator and rest_b.startswith(rest_a):  # only whitespace differs (e.g. a template's layout leaking)
        separator, changed = True, ("changed", f"{a.text[c:c + 16]!r} -> {b.text[c:c + 16]!r}")
        detail = f"whitespace {changed[1]}; " + detail
    if separator and at_tools:
        detail = f"separator {changed[1]!r} {changed[0]} at a tool boundary; " + detail
    in_appended = c >= a.seam  # the divergence is in what ``a`` appended last, not in the history before it
    if b.name.startswith(("G(", "F(")) and not a.name.startswith("E(") and in_appended:
        if at_tools and separator and (a.name.startswith("R(") or c == a.seam):  # between the history and it
            return "separator_at_tool_boundary", detail
        return "generation_prompt_differs", detail
    thoughts = [_reasoning(m) for m in msgs[:a.index + 1] if m["role"] == "assistant"]
    if any(t and a.text.count(t) > b.text.count(t) for t in thoughts) \
            or (changed and changed[0] == "dropped" and "</think>" in changed[1]):
        return "reasoning_stripped", detail
    if separator and at_tools:
        return "separator_at_tool_boundary", detail
    return "other", detail


def _first_diff(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def check(tokenizer, chat_template: str | None = None, *, seed: int = 0, conversations_=None,
          template_kwargs: dict | None = None) -> Verdict:
    """Prove or refute the extension property of ``chat_template`` (None: the tokenizer's own) with
    ``tokenizer`` over the seeded conversations (module docstring)."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ValueError("the tokenizer has no chat template and none was given")
    convs = conversations_ if conversations_ is not None else conversations(seed, _reasoning_field(template))

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def token(ids: list[int], i: int) -> str:
        return tokenizer.decode([ids[i]]) if i < len(ids) else ""

    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    done = checks = 0
    skipped, results, first = [], {}, None
    for conv, msgs, tools in convs:
        render = _Render(tokenizer, chat_template, tools, template_kwargs or {})
        try:
            states = _states(render, msgs, encode)
        except Exception as exc:  # noqa: BLE001 - a template's raise_exception (roles, ids, system messages)
            skipped.append(f"{conv}: {type(exc).__name__}: {str(exc)[:160]}")
            results[conv] = "skipped"
            continue
        done += 1
        results[conv] = "holds"
        for a, b in zip(states, states[1:]):
            checks += 1
            if b.ids[:len(a.ids)] == a.ids:
                continue
            i = _first_diff(a.ids, b.ids)
            cause, detail = _classify(a, b, msgs)
            results[conv] = cause
            if first is None:
                first = Divergence(conv, f"{a.name} -> {b.name}", b.index, i, (token(a.ids, i), token(b.ids, i)),
                                   cause, detail)
            break
    if not done:
        raise ValueError("the chat template rendered none of the seeded conversations: " + "; ".join(skipped))
    return Verdict(first is None, done, checks, name, first, skipped, results)


# ----------------------------------------------------------------------------- tokenizers for a bare template

# (a marker the template writes, its bos, its eos): the special tokens a family's template reads as variables
_FAMILIES = (("<|im_start|>", "", "<|im_end|>"), ("<|eot_id|>", "<|begin_of_text|>", "<|eot_id|>"),
             ("<start_of_turn>", "<bos>", "<eos>"), ("<｜Assistant｜>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
             ("[gMASK]", "", "<|endoftext|>"), ("<|assistant|>", "<s>", "<|endoftext|>"), ("[INST]", "<s>", "</s>"))
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]{1,32}\|>|<｜[^｜\s'\"]{1,32}｜>|<(?:start|end)_of_turn>|\[/?[A-Z_]{3,30}\]"
                      r"|\[gMASK\]|<sop>|</?(?:tool_call|tool_response|think)>")


def template_special_tokens(template: str) -> tuple[str, str, list[str]]:
    """(bos, eos, special token strings) a template writes: its family's bos / eos (:data:`_FAMILIES`; else
    ``<s>`` / ``</s>``) and the ``<|...|>`` / ``<｜...｜>`` / ``[UPPER]`` markers in its source."""
    bos, eos = "<s>", "</s>"
    for marker, b, e in _FAMILIES:
        if marker in template:
            bos, eos = b or bos, e
            break
    found = sorted(set(_SPECIAL.findall(template)) - {"[INST]"} | ({"[INST]", "[/INST]"} & set(
        _SPECIAL.findall(template))))
    return bos, eos, found


def byte_tokenizer(template: str | None = None, *, specials: bool = False, merges: list[tuple[str, str]] = ()):
    """A transformers tokenizer where each UTF-8 byte is one token (so token-level equals text-level), with
    ``template`` as its chat template and the bos / eos the template's family uses (one token each). ``specials``:
    also make every marker the template writes one token (:func:`template_special_tokens`), as a model's tokenizer
    does. ``merges``: byte-pair merges (in the byte-level alphabet), for tests of merges across a seam."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    bos, eos, found = template_special_tokens(template or "")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos or None, eos_token=eos,
                                   name_or_path="byte-level fallback" + (" + template specials" if specials else ""))
    if specials and found:
        fast.add_special_tokens({"additional_special_tokens": [t for t in found if t not in (bos, eos)]})
    if template:
        fast.chat_template = template
    return fast


def verdict_json(v: Verdict) -> str:
    return json.dumps(v.to_dict(), ensure_ascii=False, indent=2)
