"""Datasets in the layouts peers use (issue 20, item 4, first part): chat-message prompts (TRL's conversational
layout, verl's parquet layout) and fields by dotted path (verl's ``reward_model.ground_truth``)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from credo.data.files import load_dataset_file, plain_chat
from tests.conftest import TINY_RUN

WORDS = ("abc", "bca", "cab", "dab", "bad", "cad", "fed", "ged", "hag", "gah", "bed", "deb")


def _verl_rows():
    return [{"data_source": "reversal", "prompt": [{"role": "user", "content": f"rev {w}="}], "ability": "string",
             "reward_model": {"style": "rule", "ground_truth": w[::-1]}, "extra_info": {"split": "train", "index": i}}
            for i, w in enumerate(WORDS)]


def test_chat_message_prompts_and_dotted_fields(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = _verl_rows()[:2] + [
        {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "rev xy="}],
         "reward_model": {"ground_truth": "yx"}},
        {"prompt": [], "reward_model": {"ground_truth": "a"}},                        # empty message list
        {"prompt": [{"role": "robot", "content": "hi"}], "reward_model": {"ground_truth": "a"}},  # unknown role
        {"prompt": [{"role": "system", "content": "x"}], "reward_model": {"ground_truth": "a"}},  # no user message
        {"prompt": "rev q=", "reward_model": {"style": "rule"}},                       # no ground truth
        {"prompt": "rev q=", "reward_model.ground_truth": "q"},                        # a literal dotted key wins
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.warns(UserWarning, match="skipped 4 of 8 rows"):
        ds = load_dataset_file(path, answer_field="reward_model.ground_truth")
    ex = ds.examples
    assert [e.prompt for e in ex] == ["rev abc=", "rev bca=", "system: be brief\nuser: rev xy=\nassistant: ", "rev q="]
    assert [e.answer for e in ex] == ["cba", "acb", "yx", "q"]
    assert ex[0].meta["prompt_messages"] == [{"role": "user", "content": "rev abc="}]
    assert ex[0].meta["data_source"] == "reversal" and "prompt_messages" not in ex[3].meta
    reasons = [b.reason for b in ds.bad_rows]
    assert reasons == ["field 'prompt' is an empty message list",
                       "field 'prompt': message 0 must be {role: system/user/assistant/tool, content: string}, "
                       "got {'role': 'robot', 'content': 'hi'}",
                       "field 'prompt': no user message", "missing field 'reward_model.ground_truth'"]


def test_messages_use_the_tokenizers_chat_template_when_it_has_one():
    from credo.data.source import TaskData, format_prompts
    from credo.types import Example

    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    msgs = [{"role": "user", "content": "hi"}]
    data = TaskData(name="file", train=[Example(plain_chat(msgs), "a", "u", {"prompt_messages": msgs}),
                                        Example("plain", "b")], eval=[], default_reward=None, demonstration=None)
    out = format_prompts(data, Tok())
    assert [e.prompt for e in out.train] == ["<user>hi<assistant>", "plain"]
    # no template: credo's plain rendering stays, and a prompt_template applies to string prompts only
    class Plain:
        chat_template = None

    out = format_prompts(data, Plain(), template="Q: {prompt}")
    assert [e.prompt for e in out.train] == ["hi", "Q: plain"]


def test_a_verl_parquet_file_trains_through_the_cli_with_no_bad_rows(tmp_path: Path):
    from credo.cli.main import main

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_verl_rows()), path)
    run = tmp_path / "run"
    assert main(["-q", "train", "-c", "verl_parquet", "--run-dir", str(run), *TINY_RUN, f"task.train_file={path}",
                 "task.eval_fraction=0.25", "train.steps=2", "log.report=false", "log.tensorboard=false"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["data/bad_rows"] == 0 and summary["steps"] == 2
