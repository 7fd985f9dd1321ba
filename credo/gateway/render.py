"""Chat requests as token ids: OpenAI messages through the chat template, and the sampled ids of an episode's
earlier answers substituted where the agent sends them back ("token in, token out"; docs/bring-your-own.md).

**Rendering.** Messages are normalised (:func:`credo.gateway.protocol.parse_messages`) and rendered with the
tokenizer's chat template (credo.tools.render.ToolRenderer; credo.tools.render.CHAR_TOOL_TEMPLATE for a tokenizer
without one), with the request's tools and the generation prompt. An assistant message's ``tool_calls`` are given
to the template with their arguments as objects (templates write them with ``tojson``); a template that does not
render ``tool_calls`` (the character template) gets them written into the content in the parser's format.

**Substitution.** Re-rendering an assistant message the agent sends back need not give the ids the engine
sampled (whitespace, a template that rewrites past turns, a tokenizer that merges across the seams), and then the
next call's prompt would not extend the previous call's ids: its calls could not be stitched into one trajectory.
So each answered chat call leaves a :class:`Turn`: the canonical form of its request's messages plus the answered
assistant message, its tools, and its ids (prompt + completion, plus the end-of-turn token when the completion did
not end with it). A later request of the same episode whose tools are the same and whose messages start with a
turn's messages (canonically equal, the longest such turn wins) is rendered as::

    turn.ids + delta(the messages after them)

where ``delta(ms)`` is what the template writes after an assistant turn's end-of-turn token for ``ms``, through
the generation prompt: ``render(probe + ms)`` less ``render(probe)`` for a probe conversation ending in an
assistant turn, plus the template's tail after end-of-turn (e.g. Qwen's newline). Canonical equality compares,
per message: the role (``developer`` counts as ``system``), the text content (parts joined; an assistant's
stripped, None as ""), a tool message's name, and each tool call's function name and arguments as JSON objects
(so ``{"a": 1}`` and ``{"a":1}`` match); tool-call ids, ``refusal`` and other fields are not compared. Tools are
compared as the normalised list. A request that matches no turn is rendered whole (the calls may still stitch,
when the render reproduces the sampled ids).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from credo.tools.parsers import ToolCall, ToolParser
from credo.tools.render import CHAR_TOOL_TEMPLATE, ToolRenderer

log = logging.getLogger(__name__)
_PROBE_TURN = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
_CALL_PROBE = "zq_probe_fn"  # a function name no real tool has: does the template write tool_calls?


def canonical(msg: dict) -> tuple:
    """The parts of a normalised message that substitution compares (module docstring)."""
    role = msg["role"]
    content = msg.get("content") or ""
    if role == "assistant":
        content = content.strip()
    calls = tuple((c["name"], json.dumps(c["arguments"], sort_keys=True, ensure_ascii=False))
                  for c in msg.get("tool_calls") or ())
    return role, content, (msg.get("name") or "") if role == "tool" else "", calls


def canonical_tools(tools: list[dict]) -> str:
    return json.dumps(tools, sort_keys=True, ensure_ascii=False)


@dataclass
class Turn:
    """An answered chat call as the next request may continue it (module docstring)."""

    canon: tuple  # canonical messages of the request, then the answered assistant message
    tools: str  # canonical tools of the request
    ids: list[int]  # prompt + completion (+ end-of-turn when the completion did not end with it)
    call: int  # the call's index in its episode's record


@dataclass
class TurnMemory:
    """The turns of one episode (dropped with the episode: nothing is carried across episodes)."""

    turns: list[Turn] = field(default_factory=list)

    def match(self, canon: tuple, tools: str) -> Turn | None:
        """The longest turn whose messages ``canon`` starts with (and has more after), with the same tools."""
        best = None
        for turn in self.turns:
            n = len(turn.canon)
            if turn.tools == tools and len(canon) > n and canon[:n] == turn.canon \
                    and (best is None or n > len(best.canon)):
                best = turn
        return best


class ChatRenderer:
    """Renders normalised messages for one tokenizer and chat template (module docstring)."""

    def __init__(self, tokenizer: Any, parser: ToolParser, chat_template: str | None = None):
        own = getattr(tokenizer, "chat_template", None)
        template = chat_template or (None if own else CHAR_TOOL_TEMPLATE)
        self.tokenizer, self.parser = tokenizer, parser
        self.base = ToolRenderer(tokenizer, template)
        self.end_of_turn = self.base.end_of_turn
        probe = _PROBE_TURN[:1] + [{"role": "assistant", "content": "",
                                    "tool_calls": [{"type": "function", "function": {"name": _CALL_PROBE,
                                                                                     "arguments": {}}}]}]
        try:
            text = tokenizer.decode(self.base.render(probe))
        except Exception:  # a template that cannot render tool_calls at all  # noqa: BLE001
            text = ""
        self.renders_tool_calls = _CALL_PROBE in text

    # ------------------------------------------------------------------ messages

    def template_messages(self, msgs: list[dict]) -> list[dict]:
        """Normalised messages in the form chat templates read."""
        out = []
        for m in msgs:
            t: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
            calls = m.get("tool_calls") or []
            if calls and self.renders_tool_calls:
                t["tool_calls"] = [{"id": c.get("id") or "", "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
            elif calls:
                written = self.parser.format([ToolCall(c["name"], c["arguments"] if isinstance(c["arguments"], dict)
                                                       else {"arguments": c["arguments"]}) for c in calls])
                t["content"] = (t["content"] + "\n" if t["content"] else "") + written
            if m["role"] == "tool":
                t["name"] = m.get("name") or ""
                if m.get("tool_call_id"):
                    t["tool_call_id"] = m["tool_call_id"]
            out.append(t)
        return out

    def render(self, msgs: list[dict], tools: list[dict]) -> list[int]:
        """The ids of the whole conversation with the generation prompt."""
        return self.base.render(self.template_messages(msgs), tools, generation_prompt=True)

    def delta(self, msgs: list[dict], tools: list[dict]) -> list[int]:
        """The ids the template writes after an assistant turn's end-of-turn token for ``msgs``, through the
        generation prompt (module docstring); ValueError when the template renders the turn differently once
        messages follow it."""
        base = self.base.render(_PROBE_TURN, tools)
        full = self.base.render(_PROBE_TURN + self.template_messages(msgs), tools, generation_prompt=True)
        if full[:len(base)] != base or self.end_of_turn not in base:
            raise ValueError("the chat template renders an assistant turn differently when messages follow it")
        last = len(base) - 1 - base[::-1].index(self.end_of_turn)
        return base[last + 1:] + full[len(base):]

    def prompt(self, msgs: list[dict], tools: list[dict], memory: TurnMemory | None) -> tuple[list[int], int | None]:
        """(prompt ids, the index of the call whose sampled ids were substituted, or None)."""
        if memory is not None:
            turn = memory.match(tuple(canonical(m) for m in msgs), canonical_tools(tools))
            if turn is not None:
                try:
                    return turn.ids + self.delta(msgs[len(turn.canon):], tools), turn.call
                except ValueError:
                    pass  # rendered whole below
        return self.render(msgs, tools), None

    def turn(self, msgs: list[dict], tools: list[dict], answer: dict, prompt_ids: list[int],
             completion_ids: list[int], call: int) -> Turn:
        """The :class:`Turn` an answered call leaves (``answer``: the assistant message, normalised)."""
        ids = list(prompt_ids) + list(completion_ids)
        if not completion_ids or completion_ids[-1] != self.end_of_turn:
            ids.append(self.end_of_turn)  # the template closes a turn cut by the length cap or a stop string
        canon = tuple(canonical(m) for m in msgs) + (canonical(answer),)
        return Turn(canon, canonical_tools(tools), ids, call)


def render_choice(renderer: ChatRenderer, render: str = "auto") -> tuple[bool, Any]:
    """(substitute the sampled ids?, the template's verdict or None) for the gateway's ``render`` setting
    (docs/templates.md): ``append`` substitutes, ``rerender`` renders every request whole, ``auto`` checks the
    chat template's extension property (credo.tools.template_check) and substitutes only when it holds. The choice
    is logged."""
    from credo.tools.template_check import check

    if render not in ("auto", "append", "rerender"):
        raise ValueError(f"render must be auto, append or rerender, got {render!r}")
    verdict = None
    if render == "auto":
        try:
            verdict = check(renderer.tokenizer, renderer.base.chat_template)
        except ValueError as exc:  # the template renders none of the seeded conversations
            log.warning("gateway: the chat template's extension property could not be checked (%s)", exc)
    append_only = render == "append" or (render == "auto" and (verdict is None or verdict.holds))
    log.info("gateway: %s (render=%s%s)", "append-only ids (earlier answers' sampled ids substituted)"
             if append_only else "every request re-rendered whole", render,
             f"; template: {verdict.summary()}" if verdict is not None else "")
    return append_only, verdict
