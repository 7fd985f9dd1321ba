"""Conversations with tools through a chat template: the prompt rendered with ``tools=``, later messages as token
deltas appended to the episode (never re-tokenising the history), and the re-render check.

Append-only layout of a structured-tools episode (one list of ids that only grows)::

    prompt   = render([system: instruction, user: observation], tools=schemas)                         mask -
    turn k   = [assistant prefix] [model tokens ... end-of-turn]                                        0 | 1
    after it = [template tail after end-of-turn] [tool messages (or a user message)] (delta of renders)    0

The delta of a message list is ``render(probe + msgs)[len(render(probe)):]`` for a fixed probe conversation
ending in an assistant turn, so it is exactly what the template writes for those messages after a turn.
:meth:`ToolRenderer.matches` re-renders the whole conversation and compares it with the appended ids: a template
that rewrites history (Qwen3's drops past ``<think>`` blocks) or a tokenizer that merges across the seams gives
different ids, which the loop reports (``tools/render_mismatch``) while training on the appended ids.
"""
from __future__ import annotations

from typing import Any

# credo's character models have no chat template: this compact one (Hermes-style calls, one line per tool) is
# used for them (``rollout.collector.tools.chat_template=auto``); the end of a turn is the tokenizer's EOS.
CHAR_TOOL_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}"
    "({{ t.function.parameters.properties | join(',') }}){% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' or m.role == 'user' %}{{ m.content }}\n"
    "{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'tool' %}-> {{ m.content }}\n"
    "{% endif %}"
    "{% endfor %}"
)



def render_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None, generation_prompt: bool = False,
               chat_template: str | None = None, **template_kwargs: Any) -> list[int]:
    """The token ids of ``messages`` rendered through ``chat_template`` (None: the tokenizer's own)."""
    kwargs: dict[str, Any] = {"chat_template": chat_template} if chat_template else {}
    ids = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True,
                                        add_generation_prompt=generation_prompt, **kwargs, **template_kwargs)
    # transformers >= 5 answers a BatchEncoding (a mapping: list() of it would be its keys), 4.x a list of ids
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def render_text(tokenizer, messages: list[dict], tools: list[dict] | None = None, generation_prompt: bool = False,
                chat_template: str | None = None, **template_kwargs: Any) -> str:
    """The text of the same render (what :func:`render_ids` tokenises)."""
    kwargs: dict[str, Any] = {"chat_template": chat_template} if chat_template else {}
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt, **kwargs, **template_kwargs)


_PROBE = [{"role": "user", "content": "x"}]
_PROBE_TURN = _PROBE + [{"role": "assistant", "content": "y"}]


class ToolRenderer:
    """Renders through ``chat_template`` (None: the tokenizer's own) and reads the template's seams off it once:
    the assistant prefix, the end-of-turn token and the tail the template writes after it."""

    def __init__(self, tokenizer, chat_template: str | None = None) -> None:
        self.tokenizer, self.chat_template = tokenizer, chat_template
        base = self.render(_PROBE)
        self.assistant_prefix = self.render(_PROBE, generation_prompt=True)[len(base):]
        vocab = tokenizer.get_vocab()
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in vocab \
            else tokenizer.eos_token_id
        self._turn_ids = self.render(_PROBE_TURN)
        if self.end_of_turn not in self._turn_ids[len(base):]:
            raise ValueError("the chat template does not end an assistant turn with the end-of-turn token "
                             f"{tokenizer.convert_ids_to_tokens(self.end_of_turn)!r}")
        last = len(self._turn_ids) - 1 - self._turn_ids[::-1].index(self.end_of_turn)
        self.after_turn = self._turn_ids[last + 1:]  # e.g. Qwen's "\n" after <|im_end|> (mask 0)

    def render(self, messages: list[dict], tools: list[dict] | None = None, generation_prompt: bool = False
               ) -> list[int]:
        return render_ids(self.tokenizer, messages, tools, generation_prompt, self.chat_template)

    def prompt(self, instruction: str, observation: str, tools: list[dict]) -> tuple[list[dict], list[int]]:
        """(messages, ids) of the conversation's start: system = instruction, user = first observation."""
        msgs = ([{"role": "system", "content": instruction}] if instruction else []) + \
            [{"role": "user", "content": observation}]
        return msgs, self.render(msgs, tools)

    def after_turn_ids(self, messages: list[dict]) -> list[int]:
        """Ids appended after an assistant turn's end-of-turn token for ``messages`` (tool or user messages)."""
        full = self.render(_PROBE_TURN + messages)
        if full[:len(self._turn_ids)] != self._turn_ids:
            raise ValueError("the chat template renders an assistant turn differently when messages follow it; "
                             "its tool messages cannot be appended as a delta")
        return self.after_turn + full[len(self._turn_ids):]

    def matches(self, messages: list[dict], tools: list[dict], ids: list[int]) -> bool:
        """Whether rendering ``messages`` from scratch starts with ``ids`` (the episode's appended prompt and
        response ids)."""
        return self.render(messages, tools)[:len(ids)] == ids
