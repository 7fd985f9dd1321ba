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


# ------------------------------------------------------------------------------------------ HF datasets, TRL, routing

def test_hf_datasets_directories_and_arrow_files_load_through_the_datasets_library(tmp_path: Path):
    import datasets

    rows = _verl_rows()
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict(train=datasets.Dataset.from_list(rows[:3]),
                         test=datasets.Dataset.from_list(rows[3:])).save_to_disk(str(tmp_path / "dict"))
    ds = load_dataset_file(tmp_path / "one", prompt_field="prompt", answer_field="reward_model.ground_truth")
    assert [e.answer for e in ds.examples] == [r["reward_model"]["ground_truth"] for r in rows] and not ds.bad_rows
    assert ds.examples[0].meta["prompt_messages"] == rows[0]["prompt"]
    split = load_dataset_file(tmp_path / "dict" / "test", answer_field="reward_model.ground_truth")
    assert len(split.examples) == len(rows) - 3
    arrow = next((tmp_path / "one").glob("*.arrow"))
    assert len(load_dataset_file(arrow, answer_field="reward_model.ground_truth").examples) == len(rows)
    with pytest.raises(ValueError, match="holds the splits test, train"):
        load_dataset_file(tmp_path / "dict", answer_field="reward_model.ground_truth")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a Hugging Face datasets directory"):
        load_dataset_file(tmp_path / "plain")


def test_the_trl_preset_reads_the_conversational_prompt_only_layout(tmp_path: Path):
    from credo.config import load_config
    from credo.data.source import load_task_data

    rows = [{"prompt": [{"role": "user", "content": f"rev {w}="}], "solution": w[::-1]} for w in
            ("abc", "bca", "cab", "aab", "bba", "cca", "acb", "bac")]
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config("trl_conversational", [f"task.train_file={path}"])
    data = load_task_data(cfg.task, seed=0)
    got = sorted((e.meta["prompt_messages"][0]["content"], e.answer) for e in data.train + data.eval)
    assert got == sorted((r["prompt"][0]["content"], r["solution"]) for r in rows) and not data.bad_rows


def test_data_source_picks_each_rows_verifier(tmp_path: Path):
    from credo.config import load_config
    from credo.data.source import load_task_data
    from credo.recipes.common import reward_runner

    rows = [{"data_source": "rev", "prompt": "rev ab=", "reward_model": {"ground_truth": "ba"}},
            {"data_source": "sum", "prompt": "2+3=", "reward_model": {"ground_truth": "5"}},
            {"data_source": "other", "prompt": "rev cd=", "reward_model": {"ground_truth": "dc"}}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, ["task.name=file", f"task.train_file={path}", f"task.eval_file={path}",
                             "task.answer_field=reward_model.ground_truth", "reward.name=exact_match",
                             "reward.by_data_source={sum: number}"])
    data = load_task_data(cfg.task, seed=0)
    with reward_runner(cfg, data) as runner:
        # "The answer is 5" is right for `number` (last number in the text), wrong for exact_match
        results = runner.score(["ba", "The answer is 5", "The answer is dc"], data.eval)
    assert [r.correct for r in results] == [True, True, False]


def test_bad_data_source_routes_are_config_errors():
    from credo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="reward.by_data_source.gsm8k: .*unknown reward"):
        load_config(None, ["reward.by_data_source={gsm8k: nosuchverifier}"])
    with pytest.raises(ConfigError, match="expected a verifier name"):
        load_config(None, ["reward.by_data_source={gsm8k: {name: number, kw: 1}}"])
