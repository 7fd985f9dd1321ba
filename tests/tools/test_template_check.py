"""The extension-property check of chat templates (credo.tools.template_check, docs/templates.md): hand-built
templates with known properties (one that holds, one per cause), the family corpus of
tests/fixtures/chat_templates with each template's verdict, and ``credo template check``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.tools.render import CHAR_TOOL_TEMPLATE
from credo.tools.template_check import CAUSES, byte_tokenizer, check, conversations
from tests.tools.tool_templates import QWEN25, THINK_STRIPPING

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"

# Qwen2.5 with a newline after the tool results only when another message follows (verl #6719's lost separator)
SEPARATOR = QWEN25.replace(
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}",
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>' }}"
    "{%- if not loop.last %}{{- '\\n' }}{%- endif %}{%- endif %}")
# Qwen2.5 whose tool results end with a blank line when last and with " \n" when a message follows (whitespace only)
WHITESPACE = QWEN25.replace(
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}",
    "{%- if loop.last %}{{- '<|im_end|>\\n\\n' }}{%- elif messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|> \\n' }}{%- endif %}")
# Qwen2.5 whose generation prompt opens an empty reasoning block the rendered turn does not have
GENERATION_PROMPT = QWEN25.replace("{{- '<|im_start|>assistant\\n' }}{%- endif %}",
                                   "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{%- endif %}")
# no special tokens: "assistant:" then the turn; a byte-pair merge of ": " crosses the generation prompt's seam
PLAIN = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}")
# the system prompt written before the last user message (Mistral's placement)
MOVING_SYSTEM = ("{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}"
                 "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
                 "{% for m in messages %}{% if m.role == 'user' %}[INST] {% if loop.index0 == ns.last %}"
                 "{{ messages[0].content }} {% endif %}{{ m.content }}[/INST]{% elif m.role == 'assistant' %}"
                 "{{ m.content }}</s>{% endif %}{% endfor %}")

# the family corpus (credo-written models of each family's format, SOURCES.md): holds, or the first cause
EXPECTED = {
    "qwen2.5.jinja": None,
    "qwen3.jinja": "reasoning_stripped",  # reasoning kept only after the last user query (an empty block too)
    "hermes.jinja": None,
    "llama3.1-json.jinja": "reasoning_stripped",  # a tool-call turn's text (its reasoning) is not written
    "mistral-v3-tools.jinja": "other",  # the system prompt and tools move to the last user message
    "mistral-v7-tools.jinja": "other",  # [AVAILABLE_TOOLS] moves to the last user message
    "gemma3.jinja": None,  # holds where it renders: no tool role (roles must alternate)
    "deepseek-v3.jinja": None,
    "deepseek-r1.jinja": "generation_prompt_differs",  # "<think>\n" opens the prompt; turns render without it
    "glm4.jinja": "reasoning_stripped",  # a tool-call turn is the name and arguments only
    "phi3.jinja": "generation_prompt_differs",  # the end-of-text token closes a render without generation prompt
}


def _tok(template: str, **kw):
    return byte_tokenizer(template, specials=True, **kw)


def test_a_template_that_appends_only_holds():
    v = check(_tok(QWEN25))
    assert v.holds and v.divergence is None and v.conversations == 8 and v.checks > 60
    assert set(v.results.values()) == {"holds"} and not v.skipped


@pytest.mark.parametrize("template, cause, conv", [
    (THINK_STRIPPING, "reasoning_stripped", "chat+reasoning"),
    (SEPARATOR, "separator_at_tool_boundary", "tools"),
    (WHITESPACE, "separator_at_tool_boundary", "tools"),
    (GENERATION_PROMPT, "generation_prompt_differs", "chat"),
    (MOVING_SYSTEM, "other", "chat"),
], ids=["think", "separator", "whitespace", "generation-prompt", "moving-system"])
def test_each_cause_is_found_at_its_first_divergence(template, cause, conv):
    v = check(_tok(template))
    assert not v.holds and v.cause == cause and v.divergence.conversation == conv, v.summary()
    d = v.divergence
    assert d.tokens[0] != d.tokens[1] and d.token_index > 0 and d.detail
    assert cause in CAUSES and cause in v.summary()


def test_the_separator_cause_names_the_separator():
    d = check(_tok(SEPARATOR)).divergence
    assert "'\\n'" in d.detail and "tool boundary" in d.detail and d.step.startswith("G(")
    assert WHITESPACE != QWEN25 and "whitespace" in check(_tok(WHITESPACE)).divergence.detail


def test_a_merge_across_the_seam_is_a_tokenizer_merge():
    plain = check(byte_tokenizer(PLAIN))
    assert plain.holds  # bytes: no merges, the text-level property holds
    merged = check(byte_tokenizer(PLAIN, merges=[(":", "Ġ")]))  # ": " is one token ("Ġ" is the byte-level space)
    assert not merged.holds and merged.cause == "tokenizer_merge"
    assert merged.divergence.step.startswith("E(") and merged.divergence.tokens == (":", ": ")


def test_reasoning_is_given_as_the_template_reads_it():
    inline = [m for _, msgs, _ in conversations(0, False) for m in msgs if "<think>" in (m.get("content") or "")]
    field = [m for _, msgs, _ in conversations(0, True) for m in msgs if m.get("reasoning_content")]
    assert inline and field and len(inline) == len(field)
    assert conversations(3) == conversations(3) and conversations(3) != conversations(4)  # seeded


def test_credo_character_template_holds():
    assert check(_tok(CHAR_TOOL_TEMPLATE)).holds


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_verdicts(name):
    v = check(_tok((CORPUS / name).read_text()))
    assert v.cause == EXPECTED[name], v.summary()
    assert v.holds is (EXPECTED[name] is None)


def test_the_corpus_and_its_sources_list_the_same_templates():
    files = {p.name for p in CORPUS.glob("*.jinja")}
    sources = (CORPUS / "SOURCES.md").read_text()
    assert files == set(EXPECTED)
    assert all(f"`{name}`" in sources for name in files)


def test_per_conversation_results_localise_the_failure():
    v = check(_tok((CORPUS / "llama3.1-json.jinja").read_text()))
    assert v.results["chat"] == v.results["tools"] == "holds"  # without reasoning it appends cleanly
    assert v.results["tools+reasoning"] == "reasoning_stripped" and v.results["parallel-tools"] == "skipped"
    assert any("single tool-calls" in s for s in v.skipped)


# ----------------------------------------------------------------------------- the command


def test_cli_on_a_template_file(tmp_path, capsys):
    good, bad = tmp_path / "good.jinja", tmp_path / "bad.jinja"
    good.write_text(QWEN25)
    bad.write_text(THINK_STRIPPING)
    assert main(["template", "check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "byte-level fallback" in out and "holds" in out
    assert main(["template", "check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "refuted (reasoning_stripped)" in out and "first diverging token" in out
    assert main(["template", "check", str(bad), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["holds"] is False and data["divergence"]["cause"] == "reasoning_stripped"


def test_cli_on_a_tokenizer_directory_and_bad_input(tmp_path, capsys):
    model = tmp_path / "tok"
    _tok(THINK_STRIPPING).save_pretrained(model)
    assert main(["template", "check", str(model), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["divergence"]["cause"] == "reasoning_stripped"
    tpl = tmp_path / "q.jinja"
    tpl.write_text(QWEN25)
    assert main(["template", "check", str(tpl), "--tokenizer", str(model)]) == 0  # the directory's tokens
    assert "tokenizer: " + str(model) in capsys.readouterr().out
    assert main(["template", "check", str(tmp_path / "missing.jinja")]) == 2
    assert main(["template", "check", "nobody-here/no-such-model"]) == 2  # not in the (offline) hub cache
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["template", "check", str(empty)]) == 2
    assert "no such template file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the agent loop and the gateway


def test_the_agent_collector_records_the_verdict(tmp_path, caplog):
    import logging

    from credo.collect.agent import tool_mode
    from credo.collect.config import AgentCollectorConfig, ToolsConfig
    from credo.rollout.tool_episode import ToolState, tool_metrics
    from tests.tools.tool_templates import chat_tokenizer

    a = AgentCollectorConfig(envs=["calc_tools"])
    holds = tool_mode(a, chat_tokenizer(QWEN25))
    assert holds.append_only and holds.verdict.holds
    with caplog.at_level(logging.WARNING):
        refuted = tool_mode(a, chat_tokenizer(THINK_STRIPPING))
    assert not refuted.append_only and refuted.verdict.cause == "reasoning_stripped"  # auto: re-render
    assert any("extension property is refuted" in r.message and "re-renders" in r.message for r in caplog.records)
    refuted.record(tmp_path)
    saved = json.loads((tmp_path / "template_check.json").read_text())
    assert saved["append_only"] is False and saved["verdict"]["divergence"]["cause"] == "reasoning_stripped"
    state, _ = refuted.start(_Client(), "instr", "obs")
    assert state.info()["extension_holds"] is False and state.info()["append_only"] is False
    m = tool_metrics([state.info(), ToolState(extension_holds=True).info()])
    assert m["render/append_only"] == 0.5 and m["render/extension_holds"] == 0.0

    def mode(render, template):
        return tool_mode(AgentCollectorConfig(envs=["calc_tools"], tools=ToolsConfig(render=render)),
                         chat_tokenizer(template))

    assert mode("append", THINK_STRIPPING).append_only and mode("append", THINK_STRIPPING).verdict is None
    assert not mode("rerender", QWEN25).append_only and mode("rerender", QWEN25).verdict is None


def _tool_loop(template: str, append_only: bool):
    from credo.envs import LocalEnvClient
    from credo.envs.builtin import safe_eval
    from credo.rollout.agent_loop import AgentLoop
    from credo.rollout.tool_episode import ToolMode
    from credo.tools.parsers import ToolCall, get_parser
    from credo.tools.render import ToolRenderer
    from tests.tools.test_tool_calls import Scripted
    from tests.tools.tool_templates import chat_tokenizer

    tok = chat_tokenizer(template)
    expr = LocalEnvClient("calc_tools").reset(3)
    call = "<think>add them</think>" + get_parser("hermes").format([ToolCall("calc", {"expr": expr})])
    mode = ToolMode(ToolRenderer(tok), get_parser("hermes"), append_only=append_only)
    engine = Scripted(tok, mode.renderer.end_of_turn, lambda k, _: call if k == 1 else str(safe_eval(expr)))
    loop = AgentLoop(engine, tok, mode.template(), max_turns=3, max_tokens_per_turn=400, max_response_tokens=4000,
                     threads=1, tools=mode)
    return tok, mode, loop, LocalEnvClient("calc_tools")


def test_rerender_splits_an_episode_where_the_template_rewrites_its_history():
    """A think-stripping template re-rendered before turn 2: the ids held (turn 1 with its <think> block) become a
    closed row, and turn 2 is generated from, and trained after, the fresh render (no <think>)."""
    from credo.rollout.agent_loop import segment_trajectories, to_trajectory
    from tests.tools.test_tool_calls import _examples
    from credo.types import SamplingParams

    tok, mode, loop, client = _tool_loop(THINK_STRIPPING, append_only=False)
    (ep,) = loop.run(_examples("calc_tools", [3]), [client], [0], SamplingParams())
    final, result = to_trajectory(ep, tok)
    [(seg, seg_result)] = segment_trajectories(ep, tok)
    assert result.correct and seg_result.correct and seg.info["closed_segment"] == 0
    assert final.info["num_turns"] == 2 and len(final.turns) == 1 and len(seg.turns) == 1
    assert "<think>add them</think>" in tok.decode(seg.response_ids)  # the model's own tokens, trained on
    rendered = mode.renderer.render(ep.tools.messages[:4], ep.tools.schemas)  # up to the tool result
    assert final.prompt_ids == rendered and "<think>" not in tok.decode(final.prompt_ids)
    assert final.prompt_ids[:len(seg.prompt_ids)] == seg.prompt_ids  # the same start, another history
    assert not final.info["render_mismatch"] and final.info["append_only"] is False
    # the same episode append-only: one row that keeps <think> in its history (the re-render check counts it)
    tok, _, loop, client = _tool_loop(THINK_STRIPPING, append_only=True)
    (ep,) = loop.run(_examples("calc_tools", [3]), [client], [0], SamplingParams())
    assert not ep.segments and to_trajectory(ep, tok)[0].info["render_mismatch"]
    # a template that extends: re-rendering changes nothing
    tok, _, loop, client = _tool_loop(QWEN25, append_only=False)
    (ep,) = loop.run(_examples("calc_tools", [3]), [client], [0], SamplingParams())
    assert not ep.segments and len(ep.turns) == 2


def test_the_collector_trains_on_every_segment_and_reports_the_choice():
    from credo.collect.agent import AgentOptions, collect_agent_rollouts, tool_mode
    from credo.collect.config import AgentCollectorConfig
    from credo.data import PromptSampler
    from credo.envs import LocalEnvClient
    from credo.envs.builtin import safe_eval
    from credo.tools.parsers import ToolCall, get_parser
    from credo.tracking.timer import Timer
    from credo.types import SamplingParams
    from tests.tools.test_tool_calls import Scripted, _examples
    from tests.tools.tool_templates import chat_tokenizer

    a = AgentCollectorConfig(envs=["calc_tools"], max_turns=3, max_tokens_per_turn=400, max_response_tokens=4000,
                             threads=1)
    opts = AgentOptions(collector=a, group_size=2, prompts_per_step=1, eval_k=1, eval_temperature=1.0, task_seed=0,
                        train_size=4, eval_size=2)
    expr = LocalEnvClient("calc_tools").reset(3)
    call = "<think>add them</think>" + get_parser("hermes").format([ToolCall("calc", {"expr": expr})])
    out = {}
    for name, template in (("holds", QWEN25), ("refuted", THINK_STRIPPING)):
        tok = chat_tokenizer(template)
        engine = Scripted(tok, tool_mode(a, tok).renderer.end_of_turn,
                          lambda k, _: call if k == 1 else str(safe_eval(expr)))
        out[name] = collect_agent_rollouts(opts, engine, tok, PromptSampler(_examples("calc_tools", [3]), seed=0),
                                           step=0, sampling=SamplingParams(), timer=Timer())
    holds, refuted = out["holds"], out["refuted"]
    assert len(holds.trajs) == 2 and holds.metrics["render/append_only"] == 1.0
    assert holds.metrics["render/extension_holds"] == 1.0 and holds.metrics["render/rows_per_episode"] == 1.0
    assert len(refuted.trajs) == 4 and refuted.metrics["render/append_only"] == 0.0  # 2 rows per episode
    assert refuted.metrics["render/extension_holds"] == 0.0 and refuted.metrics["render/rows_per_episode"] == 2.0
    assert refuted.metrics["agent/success_rate"] == 1.0 and all(r.correct for r in refuted.results)


class _Client:
    name = "calc_tools"

    def tool_schemas(self):
        return []


@pytest.mark.parametrize("render, template, append_only", [
    ("auto", QWEN25, True), ("auto", THINK_STRIPPING, False), ("append", THINK_STRIPPING, True),
    ("rerender", QWEN25, False)], ids=["auto-holds", "auto-refuted", "append", "rerender"])
def test_the_gateway_follows_the_verdict(render, template, append_only):
    """auto substitutes the sampled ids when the property holds and renders each request whole when refuted: a
    think-stripping template's two calls are then two rows (their prompts do not extend each other)."""
    from credo.gateway.server import Gateway, GatewayLimits, stitch
    from credo.types import SamplingParams
    from tests.gateway.gateway_fakes import ScriptedEngine
    from tests.tools.tool_templates import chat_tokenizer

    tok = chat_tokenizer(template)
    engine = ScriptedEngine(tok, ["<think>greet back</think>Hi!", "Bye."], end=tok.convert_tokens_to_ids("<|im_end|>"))
    with Gateway(engine, tok, sampling=SamplingParams(max_new_tokens=100), limits=GatewayLimits(batch_wait_s=0.0),
                 render=render) as gw:
        assert gw.append_only is append_only and (gw.verdict is not None) is (render == "auto")
        c = gw.open_episode("e")
        client = c.openai()
        msgs = [{"role": "user", "content": "Hello"}]
        r = client.chat.completions.create(model="m", messages=msgs)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "ok"}]
        client.chat.completions.create(model="m", messages=msgs)
        rec = gw.close_episode(c)
    segments = stitch(rec.calls)
    stripped = template == THINK_STRIPPING
    assert rec.calls[1].reused_call == (0 if append_only else None)
    assert len(segments) == (2 if stripped and not append_only else 1)


def test_cli_on_a_hub_id_in_the_local_cache(tmp_path, monkeypatch, capsys):
    """A hub id resolves through credo's hub resolution to the offline cache (credo.models.hub)."""
    from tests.hub_util import add_snapshot

    saved = tmp_path / "tok"
    _tok(THINK_STRIPPING).save_pretrained(saved)
    cache = tmp_path / "hub"
    add_snapshot(cache, "acme/think-chat", {p.name: p for p in saved.iterdir() if p.is_file()})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["template", "check", "acme/think-chat"]) == 1
    out = capsys.readouterr().out
    assert "tokenizer: acme/think-chat" in out and "refuted (reasoning_stripped)" in out
    assert main(["template", "check", "acme/not-cached"]) == 2
    assert "not in the hub cache" in capsys.readouterr().err


def test_a_gateway_run_records_its_render_choice(tmp_path):
    """``credo train`` with the gateway collector: template_check.json in the run directory, render/append_only in
    metrics.jsonl (credo's character template extends its renders: append)."""
    from credo.tracking.metrics import read_metrics
    from tests.collect.test_gateway import train

    code, run = train(tmp_path, "render", "rollout.collector.agent=tests.collect.gateway_agents:openai_tools")
    assert code == 0
    saved = json.loads((run / "template_check.json").read_text())
    assert saved["append_only"] is True and saved["verdict"]["holds"] is True
    assert [row["render/append_only"] for row in read_metrics(run / "metrics.jsonl") if "render/append_only" in row] \
        == [1.0]
