"""Structured tool calling in the agent loop (``rollout.collector.tools``): what one assistant turn does in an
environment whose actions are tool calls (``EnvSpec.tools``), and the oracle's demonstrations in the same format.

One turn: the model's text is parsed in its native format (:mod:`credo.tools.parsers`); each well-formed call goes
to the environment as the action ``<call>{"name": ..., "arguments": {...}}</call>`` and its answer becomes a
``{"role": "tool"}`` message; each malformed call becomes an ``error: ...`` tool message without reaching the
environment (counted, never a crash). A turn without any call attempt is the final answer: the environment
receives ``<answer>content</answer>``. The tool messages' ids are the template's delta (:mod:`credo.tools.render`),
appended with mask 0. Counters per episode: calls attempted, parsed, failed (parse or execution failure).
"""
from __future__ import annotations

import json
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

from credo.envs import StepResult
from credo.tools.parsers import ToolCall, ToolParser
from credo.tools.render import ToolRenderer

log = logging.getLogger(__name__)
_WARNED: list[str] = []  # the episode the re-render mismatch warning named (logged once per process)


@dataclass
class ToolState:
    """An episode's conversation as messages (for the re-render check) and its call counters."""

    schemas: list[dict] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    attempted: int = 0
    parsed: int = 0
    failed: int = 0
    render_mismatch: bool = False
    append_only: bool = True  # the episode's ids were appended turn by turn (ToolMode.append_only)
    extension_holds: bool | None = None  # the template's verdict (None: not checked)

    def info(self) -> dict[str, Any]:
        return {"tool_attempted": self.attempted, "tool_parsed": self.parsed, "tool_failed": self.failed,
                "render_mismatch": self.render_mismatch, "append_only": self.append_only,
                "extension_holds": self.extension_holds}


def call_action(call: ToolCall) -> str:
    """The action text a tools environment's parser reads (``call:{json}`` after parsing)."""
    return "<call>" + json.dumps({"name": call.name, "arguments": call.arguments}) + "</call>"


def choose_render(renderer: ToolRenderer, render: str = "auto") -> tuple[bool, Any]:
    """(append-only ids?, the template's verdict or None) for ``rollout.collector.tools.render`` (docs/templates.md):
    ``append`` appends ids turn by turn; ``rerender`` renders the conversation afresh before each turn (where the
    render does not extend the ids held, they become a closed training row and the episode continues from the
    render: credo.rollout.agent_loop.Episode.rerender); ``auto`` checks the template's extension property
    (credo.tools.template_check) once per process, appends when it holds and re-renders when it is refuted. The
    choice is logged, written to the run directory's template_check.json and reported as ``render/append_only``."""
    from credo.tools.template_check import check

    if render == "append":
        return True, None
    if render == "rerender":
        log.info("chat template: render=rerender: the agent loop re-renders the conversation before each turn")
        return False, None
    seen = _VERDICTS.setdefault(renderer.tokenizer, {})
    verdict = seen.get(renderer.chat_template)
    if verdict is None:
        try:
            verdict = check(renderer.tokenizer, renderer.chat_template)
        except ValueError as exc:  # the template renders none of the seeded conversations
            log.warning("chat template: the extension property could not be checked (%s); the agent loop appends "
                        "ids turn by turn", exc)
            return True, None
        seen[renderer.chat_template] = verdict
        if verdict.holds:
            log.info("chat template: the extension property holds (%s); the agent loop appends ids turn by turn",
                     verdict.summary())
        else:
            log.warning("chat template: the extension property is refuted: %s. The agent loop re-renders the "
                        "conversation before each turn (render/append_only 0; rollout.collector.tools.render=append "
                        "keeps append-only ids)", verdict.summary())
    return verdict.holds, verdict


# tokenizer -> {template: verdict}: each checked once per process (a loop is built per step)
_VERDICTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class ToolMode:
    """The renderer and parser of a structured-tools run (``AgentLoop.tools``); ``append_only`` and ``verdict``:
    :func:`choose_render`'s answer."""

    renderer: ToolRenderer
    parser: ToolParser
    append_only: bool = True
    verdict: Any = None  # credo.tools.template_check.Verdict, None when not checked (render=append)

    def rerender_prompt(self, state: ToolState) -> list[int]:
        """The conversation so far rendered afresh, without the generation prompt (the loop appends the assistant
        prefix); NotImplementedError for a template whose generation prompt is not that prefix appended."""
        r = self.renderer
        ids = r.render(state.messages, state.schemas)
        if r.render(state.messages, state.schemas, generation_prompt=True) != ids + r.assistant_prefix:
            raise NotImplementedError("re-rendering a chat template whose generation prompt is not its assistant "
                                      "prefix appended to the render is not implemented (docs/templates.md)")
        return ids

    def record(self, run_dir) -> None:
        """Write the render choice and the template's verdict to ``run_dir/template_check.json``."""
        import json
        from pathlib import Path

        body = {"append_only": self.append_only, "verdict": self.verdict.to_dict() if self.verdict else None}
        (Path(run_dir) / "template_check.json").write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n")

    def template(self):
        """The loop's turn template: the chat template's assistant prefix and end-of-turn (also closing a turn cut
        by the token budget, mask 0); its prompt and observations are rendered without tools (an episode whose
        reset failed, an environment's non-tool answer)."""
        from credo.rollout.agent_loop import AgentTemplate

        r = self.renderer
        return AgentTemplate(prompt=lambda instruction, obs: r.prompt(instruction, obs, [])[1],
                             observation=lambda text: r.after_turn_ids([{"role": "user", "content": text}]),
                             assistant_prefix=r.assistant_prefix, end_of_turn=r.end_of_turn, close_turn=[r.end_of_turn])

    def start(self, client, instruction: str, observation: str) -> tuple[ToolState, list[int]]:
        """A new episode's state and prompt ids."""
        state = ToolState(append_only=self.append_only,
                          extension_holds=self.verdict.holds if self.verdict is not None else None)
        return state, self.prompt(state, client, instruction, observation)

    def prompt(self, state: ToolState, client, instruction: str, observation: str) -> list[int]:
        """The prompt ids, the tools the client serves rendered through the template's ``tools=``."""
        schemas = getattr(client, "tool_schemas", None)
        if schemas is None:
            raise NotImplementedError(f"environment client {client.name!r} serves no tool schemas (structured tools "
                                      "run on in-process environments: LocalEnvClient)")
        state.schemas = schemas()
        state.messages, ids = self.renderer.prompt(instruction, observation, state.schemas)
        return ids

    def step(self, state: ToolState, client, text: str) -> tuple[StepResult, list[dict]]:
        """Run the turn's calls (or its final answer) on ``client``: (the last environment result, the messages
        to append when the episode goes on: tool messages, or the environment's answer as a user message)."""
        params = {s["function"]["name"]: s["function"].get("parameters", {}) for s in state.schemas}
        turn = self.parser.parse(text, params)
        state.messages.append({"role": "assistant", "content": text})
        state.attempted += turn.attempted
        state.parsed += len(turn.calls)
        state.failed += len(turn.errors)
        if not turn.attempted:
            result = client.step(f"<answer>{turn.content}</answer>")
            return result, [{"role": "user", "content": result.observation}]
        msgs, result = [], StepResult("")
        for call in turn.calls:
            result = client.step(call_action(call))
            state.failed += bool(result.info.get("tool_error"))
            msgs.append({"role": "tool", "name": call.name, "content": result.observation})
            if result.done:
                break
        msgs += [{"role": "tool", "name": "error", "content": f"error: {e}"} for e in turn.errors]
        info = {**result.info, "tool_call": bool(turn.calls), "invalid_action": not turn.calls}
        return StepResult(result.observation, result.reward, result.done, info), msgs

    def observation(self, state: ToolState, msgs: list[dict]) -> list[int]:
        state.messages += msgs
        return self.renderer.after_turn_ids(msgs)

    def finish(self, state: ToolState, ids: list[int], uid: str) -> None:
        """At the episode's end: compare a fresh render of the conversation with the appended ``ids``."""
        if not state.messages or self.renderer.matches(state.messages, state.schemas, ids):
            return
        state.render_mismatch = True
        if not _WARNED:  # once per process: a loop is built per step
            _WARNED.append(uid)
            log.warning("the chat template re-renders this episode's history (%s) with other token ids than the ones "
                        "appended turn by turn (e.g. it strips past <think> blocks); training keeps the appended ids "
                        "(metric tools/render_mismatch)", uid)


def tool_metrics(infos: list[dict], prefix: str = "tools") -> dict[str, float]:
    """Per step: ``tools/calls_attempted`` / ``calls_parsed`` / ``calls_failed`` (sums over the episodes), their
    per-episode means (``..._mean``), ``tools/render_mismatch`` (episodes whose re-render differs),
    ``render/append_only`` (share of episodes built append-only) and ``render/extension_holds`` (1.0 when the
    template's extension property holds, 0.0 refuted; absent when not checked)."""
    n = max(len(infos), 1)
    out: dict[str, float] = {}
    for key in ("attempted", "parsed", "failed"):
        total = sum(i.get(f"tool_{key}", 0) for i in infos)
        out[f"{prefix}/calls_{key}"] = total
        out[f"{prefix}/calls_{key}_mean"] = total / n
    out[f"{prefix}/render_mismatch"] = sum(bool(i.get("render_mismatch")) for i in infos)
    if infos:  # how the episodes' ids were built (docs/templates.md): 1.0 append-only, 0.0 re-rendered
        out["render/append_only"] = sum(bool(i.get("append_only", True)) for i in infos) / len(infos)
        checked = [i["extension_holds"] for i in infos if i.get("extension_holds") is not None]
        if checked:
            out["render/extension_holds"] = float(all(checked))
    return out


def oracle_episode(mode: ToolMode, tokenizer, client, oracle, example, horizon: int):
    """A Trajectory of the environment's oracle on ``example`` in the run's call format (the parser's
    :meth:`format`), through the same :meth:`ToolMode.step` and template deltas as the model's episodes: assistant
    turns mask 1 (ending with the end-of-turn token), everything else mask 0."""
    from credo.types import Trajectory

    state = ToolState()
    obs = client.reset(int(example.meta["task_id"]))
    prompt = mode.prompt(state, client, client.instruction, obs)
    r = mode.renderer
    ids: list[int] = []
    mask: list[int] = []
    turns = []
    for _ in range(horizon):
        want = oracle(client.env, obs)
        text = mode.parser.format([want]) if isinstance(want, ToolCall) else str(want)
        own = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [r.end_of_turn]
        ids, mask = ids + r.assistant_prefix, mask + [0] * len(r.assistant_prefix)
        turns.append((len(ids), len(ids) + len(own)))
        ids, mask = ids + own, mask + [1] * len(own)
        result, msgs = mode.step(state, client, text)
        if result.done:
            break
        obs = result.observation
        more = mode.observation(state, msgs)
        ids, mask = ids + more, mask + [0] * len(more)
    return Trajectory(example=example, group_id=0, prompt_ids=prompt, response_ids=ids,
                      rollout_logprobs=[0.0] * len(ids), response_mask=mask, finish_reason="eos", turns=turns)
