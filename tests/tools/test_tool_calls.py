"""Structured tool calling (docs/tools.md): schemas from typed functions, the Hermes and Qwen3-Coder parsers
against real chat templates, the append-only episode ids and masks through the agent loop, the re-render check,
the tool_calls and env_failures guards, the oracle demonstrations, and a short CLI run of agent_tools."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal, Optional

import pytest

from credo.collect.agent import AgentOptions, collect_agent_rollouts, make_client, oracle_trajectory, tool_mode
from credo.collect.config import AgentCollectorConfig
from credo.envs import EnvError, LocalEnvClient
from credo.envs.builtin import safe_eval
from credo.envs.tooled import CalcToolsEnv
from credo.guards import GuardError, Guards, GuardsConfig
from credo.rollout.agent_loop import AgentLoop, to_trajectory
from credo.rollout.tool_episode import ToolMode, tool_metrics
from credo.tools.parsers import ToolCall, get_parser
from credo.tools.render import ToolRenderer
from credo.tools.schema import ToolSet, check_arguments, function_schema, tool_from_schema
from credo.types import Example, SamplingParams
from tests.tools.tool_templates import QWEN3_CODER, QWEN25, THINK_STRIPPING, chat_tokenizer


def _examples(env: str, ids: list[int]) -> list[Example]:
    return [Example(prompt=f"{env}:{i}", answer="", uid=f"{env}/{i}", meta={"env": env, "task_id": i}) for i in ids]


class Scripted:
    """An engine whose k-th continuation of every prefix is ``turns(k, prefix)`` and the end-of-turn token."""

    model_config = type("Cfg", (), {"max_position_embeddings": None})()
    policy_version, generator, kv_sessions = 0, None, False

    def __init__(self, tok, eot: int, turns):
        self.tok, self.eot, self.turns, self.calls = tok, eot, turns, 0

    def continue_ids(self, prefixes, sp, stop_ids=(), top_logprobs=0, stop_sequences=()):
        from credo.rollout.hf import Continuation

        self.calls += 1
        out = []
        for prefix in prefixes:
            ids = list(self.tok(self.turns(self.calls, prefix), add_special_tokens=False)["input_ids"]) + [self.eot]
            out.append(Continuation(ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop"))
        return out


# ----------------------------------------------------------------------------- schemas


def test_function_schema_from_a_typed_function():
    def lookup(city: str, days: int, unit: Literal["C", "F"] = "C", scale: float = 1.0, raw: bool = False,
               tags: list[str] | None = None, limit: Optional[int] = None) -> str:
        """Weather forecast of a city.

        Longer text that is not the description.

        Args:
            city: the city's name
            days (int): how many days ahead
            unit: temperature unit

        Returns:
            the forecast
        """
        return f"{city}:{days}{unit}"

    fn = function_schema(lookup)["function"]
    assert fn["name"] == "lookup" and fn["description"] == "Weather forecast of a city."
    assert fn["parameters"] == {"type": "object", "required": ["city", "days"], "properties": {
        "city": {"type": "string", "description": "the city's name"},
        "days": {"type": "integer", "description": "how many days ahead"},
        "unit": {"type": "string", "enum": ["C", "F"], "description": "temperature unit"},
        "scale": {"type": "number"}, "raw": {"type": "boolean"},
        "tags": {"type": ["array", "null"], "items": {"type": "string"}}, "limit": {"type": ["integer", "null"]}}}
    params = fn["parameters"]
    assert check_arguments(params, {"city": "Oslo", "days": 2}) == ""
    assert check_arguments(params, {"city": "Oslo"}) == "missing argument(s) days"
    assert "must be integer" in check_arguments(params, {"city": "Oslo", "days": True})  # a bool is no integer
    assert "one of" in check_arguments(params, {"city": "Oslo", "days": 1, "unit": "K"})
    assert check_arguments(params, {"city": "Oslo", "days": 1, "limit": None}) == ""
    assert "unknown argument" in check_arguments(params, {"city": "Oslo", "days": 1, "zip": 1})
    tools = ToolSet.of(lookup)
    assert tools.call("lookup", {"city": "Oslo", "days": 3, "unit": "F"}) == ("Oslo:3F", True)
    text, ok = tools.call("lookup", {"city": "Oslo"})
    assert not ok and text.startswith("error: lookup: missing")
    with pytest.raises(TypeError, match="no type annotation"):
        function_schema(lambda x: x)


def test_tools_declared_as_json_schemas():
    declared = {"type": "function", "function": {"name": "echo", "description": "Echo a word.", "parameters": {
        "type": "object", "properties": {"word": {"type": "string"}, "times": {"type": "integer"}},
        "required": ["word"]}}}
    tool = tool_from_schema(declared, lambda word, times=1: " ".join([word] * times))
    assert tool.schema() == declared and tool_from_schema(declared["function"]).schema() == declared
    tools = ToolSet([tool])
    assert tools.call("echo", {"word": "hi", "times": 2}) == ("hi hi", True)
    assert tools.call("echo", {"times": 2}) == ("error: echo: missing argument(s) word", False)
    assert tools.call("say", {})[0].startswith("error: unknown tool 'say'")
    with pytest.raises(ValueError, match="needs a function name"):
        tool_from_schema({"type": "function", "function": {"description": "no name"}})
    with pytest.raises(ValueError, match="type object"):
        tool_from_schema({"name": "f", "parameters": {"type": "array"}})


# ----------------------------------------------------------------------------- parsers on real templates

CALL = ToolCall("calc", {"expr": "12+3"})


def _assistant_text(tok, calls: list[ToolCall]) -> str:
    """What the template writes for an assistant message with ``tool_calls`` (after its prefix, before im_end)."""
    msgs = [{"role": "user", "content": "x"}]
    tc = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    base = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "", "tool_calls": tc}], tokenize=False)
    return full[len(base):].removesuffix("<|im_end|>\n")


@pytest.mark.parametrize("name, template", [("hermes", QWEN25), ("qwen3_coder", QWEN3_CODER)],
                         ids=["hermes-qwen2.5", "qwen3_coder"])
def test_parser_reads_and_writes_the_templates_own_call_format(name, template):
    tok = chat_tokenizer(template)
    parser = get_parser(name)
    calls = [CALL, ToolCall("scale", {"value": 7, "by": "x2"})]
    text = _assistant_text(tok, calls)
    params = {"scale": {"properties": {"value": {"type": "integer"}, "by": {"type": "string"}}}}
    turn = parser.parse(text, params)
    assert turn.calls == calls and turn.errors == [] and turn.attempted == 2 and turn.content == ""
    assert parser.format(calls) in text  # the oracle's demonstrations are written exactly as the template does
    assert parser.parse("The answer is 15.").attempted == 0


@pytest.mark.parametrize("name, text, why", [
    ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"</tool_call>', "not valid JSON"),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', "needs"),
    ("hermes", '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ("hermes", 'ok <tool_call>{"name": "calculator", "argu', "not closed"),
    ("qwen3_coder", "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+2\n</function>\n</tool_call>",
     "outside <parameter"),
    ("qwen3_coder", "<tool_call>calculator(1+2)</tool_call>", "<function=NAME>"),
])
def test_malformed_calls_are_parse_failures_never_exceptions(name, text, why):
    turn = get_parser(name).parse(text)
    assert turn.calls == [] and len(turn.errors) == 1 and why in turn.errors[0] and turn.attempted == 1


# ----------------------------------------------------------------------------- the loop: append-only ids and masks


def _calc_loop(tok, parser: str, turns, max_turns: int = 3):
    mode = ToolMode(ToolRenderer(tok), get_parser(parser))
    engine = Scripted(tok, mode.renderer.end_of_turn, turns)
    return mode, AgentLoop(engine, tok, mode.template(), max_turns=max_turns, max_tokens_per_turn=400,
                           max_response_tokens=4000, threads=1, tools=mode)


def test_hermes_episode_is_append_only_with_exact_masks_and_counts():
    tok = chat_tokenizer(QWEN25)
    expr = LocalEnvClient("calc_tools").reset(7)
    value = str(safe_eval(expr))
    call = get_parser("hermes").format([ToolCall("calc", {"expr": expr})])
    mode, loop = _calc_loop(tok, "hermes", lambda k, _: call if k == 1 else value)
    (ep,) = loop.run(_examples("calc_tools", [7]), [LocalEnvClient("calc_tools")], [0], SamplingParams())
    traj, result = to_trajectory(ep, tok)
    assert result.correct and result.score == 1.0 and len(traj.turns) == 2
    # the whole episode equals the template's own rendering of the conversation (minus its final "\n")
    msgs = [{"role": "system", "content": LocalEnvClient("calc_tools").instruction}, {"role": "user", "content": expr},
            {"role": "assistant", "content": call}, {"role": "tool", "name": "calc", "content": value},
            {"role": "assistant", "content": value}]
    full = tok.apply_chat_template(msgs, tools=ep.tools.schemas, tokenize=False)
    ids = traj.prompt_ids + traj.response_ids
    assert tok.decode(ids) + "\n" == full and traj.info["render_mismatch"] is False
    dec = lambda m: tok.decode([i for i, k in zip(traj.response_ids, traj.response_mask) if k == m])  # noqa: E731
    assert dec(1) == call + "<|im_end|>" + value + "<|im_end|>"  # the model's tokens, end-of-turn included
    assert dec(0) == ("<|im_start|>assistant\n" + "\n<|im_start|>user\n<tool_response>\n" + value
                      + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert all(lp == -0.25 for lp, k in zip(traj.rollout_logprobs, traj.response_mask) if k == 1)
    assert all(lp == 0.0 for lp, k in zip(traj.rollout_logprobs, traj.response_mask) if k == 0)
    assert (traj.info["tool_attempted"], traj.info["tool_parsed"], traj.info["tool_failed"]) == (1, 1, 0)


def test_qwen3_coder_episode_and_failed_calls_are_answered_and_counted():
    tok = chat_tokenizer(QWEN3_CODER)
    xml = get_parser("qwen3_coder").format
    turns = {1: xml([ToolCall("calc", {"expr": "2**8"})]),  # refused by the tool: execution failure
             2: "<tool_call>\n<function=calc>\noops</function>\n</tool_call>",  # malformed: parse failure
             3: xml([ToolCall("calc", {"expr": "2*3"}), ToolCall("nope", {})]),  # one ok, one unknown
             4: "6"}  # the final answer (wrong for task 1: reward 0)
    mode, loop = _calc_loop(tok, "qwen3_coder", lambda k, _: turns[k], max_turns=4)
    (ep,) = loop.run(_examples("calc_tools", [1]), [LocalEnvClient("calc_tools")], [0], SamplingParams())
    traj, _ = to_trajectory(ep, tok)
    # attempted 1 + 1 + 2 = 4; parsed 1 + 0 + 2 = 3; failed: 2**8 refused, the malformed one, unknown 'nope' = 3
    assert (traj.info["tool_attempted"], traj.info["tool_parsed"], traj.info["tool_failed"]) == (4, 3, 3)
    tool_msgs = [m["content"] for m in ep.tools.messages if m["role"] == "tool"]
    assert tool_msgs[0].startswith("error: calc failed")
    assert tool_msgs[1].startswith("error: calc: text outside <parameter")
    assert tool_msgs[2] == "6" and tool_msgs[3].startswith("error: unknown tool 'nope'")
    assert ep.done and not ep.cut and not ep.success and traj.info["render_mismatch"] is False
    m = tool_metrics([traj.info, traj.info])
    assert m["tools/calls_attempted"] == 8 and m["tools/calls_failed_mean"] == 3 and m["tools/render_mismatch"] == 0


def test_a_template_that_strips_think_from_history_is_detected_and_ids_stay_append_only(caplog, monkeypatch):
    tok = chat_tokenizer(THINK_STRIPPING)
    assert THINK_STRIPPING != QWEN25
    expr = LocalEnvClient("calc_tools").reset(3)
    call = "<think>add them</think>" + get_parser("hermes").format([ToolCall("calc", {"expr": expr})])
    mode, loop = _calc_loop(tok, "hermes", lambda k, _: call if k == 1 else str(safe_eval(expr)))
    monkeypatch.setattr("credo.rollout.tool_episode._WARNED", [])
    with caplog.at_level(logging.WARNING):
        eps = loop.run(_examples("calc_tools", [3, 3]), [LocalEnvClient("calc_tools") for _ in range(2)], [0, 0],
                       SamplingParams())
    trajs = [to_trajectory(ep, tok)[0] for ep in eps]
    assert all(t.info["render_mismatch"] for t in trajs)
    assert sum("re-renders this episode's history" in r.message for r in caplog.records) == 1  # warned once
    assert "<think>add them</think>" in tok.decode(trajs[0].response_ids)  # the model's own tokens are kept
    assert tool_metrics([t.info for t in trajs])["tools/render_mismatch"] == 2


# ----------------------------------------------------------------------------- guards through the collector


def _collect(turns, guards: Guards, ids: tuple[int, ...] = (1, 2, 3, 4)):
    from credo.data import PromptSampler
    from credo.tracking.timer import Timer

    env = "calc_tools"
    a = AgentCollectorConfig(envs=[env], max_turns=2, max_tokens_per_turn=200, max_response_tokens=1000, threads=1)
    tok = chat_tokenizer(QWEN25)
    opts = AgentOptions(collector=a, group_size=2, prompts_per_step=2, eval_k=1, eval_temperature=1.0, task_seed=0,
                        train_size=4, eval_size=2)
    engine = Scripted(tok, tool_mode(a, tok).renderer.end_of_turn, turns)
    return collect_agent_rollouts(opts, engine, tok, PromptSampler(_examples(env, list(ids)), seed=0), step=0,
                                  sampling=SamplingParams(), timer=Timer(), guards=guards)


def test_tool_calls_guard_fires_when_a_step_has_no_call_attempt(caplog):
    guards = Guards(GuardsConfig(tool_calls="warn"))
    out = _collect(lambda k, _: "42", guards)  # answers without ever calling the calc tool
    assert out.metrics["tools/calls_attempted"] == 0 and guards.trips["tool_calls"] == 1
    assert any("no tool call attempted in 4 episodes" in r.message for r in caplog.records)
    with pytest.raises(GuardError, match="guard tool_calls"):
        _collect(lambda k, _: "42", Guards(GuardsConfig(tool_calls="error")))
    ok = Guards(GuardsConfig(tool_calls="error"))
    call = get_parser("hermes").format([ToolCall("calc", {"expr": "1+1"})])
    out = _collect(lambda k, _: call if k == 1 else "2", ok)
    assert out.metrics["tools/calls_attempted"] == 4 and ok.trips["tool_calls"] == 0 and ok.checks["tool_calls"] == 1


def test_env_failures_guard_fires_and_failed_episodes_never_reach_the_update(monkeypatch):
    broken = LocalEnvClient("calc_tools").reset(2)
    orig = CalcToolsEnv.step

    def flaky(self, action):  # task 2's environment breaks on its first step: an env failure, not the model's
        if self.expr == broken:
            raise OSError("tool server went away")
        return orig(self, action)

    monkeypatch.setattr(CalcToolsEnv, "step", flaky)
    guards = Guards(GuardsConfig(env_failures="warn"))
    out = _collect(lambda k, _: "7", guards, ids=(2, 3))  # 2 prompts x 2 episodes: task 2's group fails
    # 2 of 4 episodes failed (share 0.5, not above max_env_failure_share=0.5): their group is dropped, 2 rows left
    assert out.metrics["env/failed_episodes"] == 2 and out.metrics["env/dropped_episodes"] == 2
    assert guards.trips["env_failures"] == 1 and len(out.trajs) == 2 and not any(r.failed for r in out.results)
    assert all(t.example.meta["task_id"] == 3 for t in out.trajs)
    with pytest.raises(GuardError, match="guard env_failures"):
        _collect(lambda k, _: "7", Guards(GuardsConfig(env_failures="error")), ids=(2, 3))


# ----------------------------------------------------------------------------- oracle demonstrations and envs


@pytest.mark.parametrize("env, parser", [("calc_tools", "hermes"), ("toolgraph_tools", "qwen3_coder")])
def test_oracle_demonstrations_use_the_run_format_and_solve_the_task(env, parser):
    tok = chat_tokenizer(QWEN25 if parser == "hermes" else QWEN3_CODER)
    a = AgentCollectorConfig(envs=[env], max_turns=6)  # tier 4 takes 4 calls and the answer
    a.tools.parser = parser
    mode = tool_mode(a, tok)
    for tid in (1_000_000, 1_000_001, 1_000_003):
        ex = _examples(env, [tid])[0]
        traj = oracle_trajectory(a, tok, mode.template(), ex)
        text = tok.decode(traj.response_ids)
        assert text.count("<tool_call>") >= 1 and "error" not in text
        # replay the demonstration's assistant turns through a fresh client: the oracle solves the task
        client = make_client(a, env)
        client.reset(tid)
        result = None
        for s, e in traj.turns:
            turn = tok.decode(traj.response_ids[s:e - 1])
            parsed = get_parser(parser).parse(turn, {t["function"]["name"]: t["function"]["parameters"]
                                                     for t in client.tool_schemas()})
            for c in parsed.calls:
                result = client.step("<call>" + json.dumps({"name": c.name, "arguments": c.arguments}) + "</call>")
            if not parsed.attempted:
                result = client.step(f"<answer>{parsed.content}</answer>")
        assert result is not None and result.done and result.reward == 1.0


def test_toolgraph_tools_lists_the_tasks_tools_as_schemas():
    client = LocalEnvClient("toolgraph_tools")
    obs = client.reset(1_000_001)
    schemas = client.tool_schemas()
    assert obs.startswith("goal: find ") and "tools:" not in obs
    assert [s["function"]["name"] for s in schemas] == list(client.env.task.listed)
    assert all(s["function"]["parameters"]["required"][0] == "a1" for s in schemas)
    bad = client.step('<call>{"name": "%s", "arguments": {"zz": "x1"}}</call>' % schemas[0]["function"]["name"])
    assert bad.info["tool_error"] and "error:" in bad.observation
    with pytest.raises(EnvError, match="not a structured-tools environment"):
        LocalEnvClient("calc").tool_schemas()


# ----------------------------------------------------------------------------- the CLI


def test_agent_tools_preset_runs_and_writes_the_call_metrics(tmp_path: Path):
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics
    from tests.conftest import TINY_RUN

    run = tmp_path / "run"
    code = main(["-q", "train", "--config", "agent_tools", "--run-dir", str(run), *TINY_RUN, "train.steps=2",
                 "eval.every=0", "task.eval_size=2", "eval.k=1", "log.report=false", "log.tensorboard=false",
                 "log.progress=false", "warm_start.steps=2", "agent.max_turns=2", "agent.max_tokens_per_turn=24",
                 "checkpoint.save_final=false"])
    assert code == 0
    rows = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 2
    for r in rows:
        assert {"tools/calls_attempted", "tools/calls_parsed", "tools/calls_failed", "tools/render_mismatch",
                "tools/calls_attempted_mean", "guard/tool_calls_trips"} <= set(r)
        assert r["tools/calls_parsed"] <= r["tools/calls_attempted"]
