"""Datasets by hub id (task.name=hf, credo.data.hub): Parquet repositories written into a hub cache on disk in
huggingface_hub's layout (tests/hub_util.py) and read offline (HF_HUB_OFFLINE=1) by the datasets library."""
from __future__ import annotations

import pytest

from credo.config import ConfigError, load_config
from credo.data.files import DatasetError
from credo.data.hub import HubDatasetNotFound
from credo.data.source import load_task_data
from credo.types import Example
from tests.hub_util import add_dataset

GSM_ROWS = [{"question": f"Tom has {i} apples and buys 1. How many?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1:,}"}
            for i in range(998, 1018)]
GSM_ROWS[4] = {"question": "a row without the marker", "answer": "5"}  # a bad row for answer_transform=gsm8k
GSM_ROWS[7] = {"question": "", "answer": "#### 1"}  # an empty prompt: a bad row as in files


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """org/gsm (subset main: train, test) and org/dapo (subset default, chat-message prompts, nested answers) in a
    hub cache; offline; the datasets library's own cache in tmp_path too."""
    import datasets

    cache = tmp_path / "hub"
    gsm = add_dataset(cache, "org/gsm", {"train": GSM_ROWS, "test": GSM_ROWS[:6]})
    dapo_rows = [{"prompt": [{"role": "system", "content": "Box it."}, {"role": "user", "content": f"{i}*2?"}],
                  "reward_model": {"ground_truth": str(2 * i), "style": "rule"}, "data_source": "dapo"}
                 for i in range(10)]
    dapo_rows[3]["prompt"] = [{"role": "system", "content": "no user turn"}]
    add_dataset(cache, "org/dapo", {"train": dapo_rows}, subset="default")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    # the libraries read HF_HUB_OFFLINE when imported (a `credo` process sets it before): as if they had here
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache, gsm


def task(*overrides: str):
    return load_config(None, ["task.name=hf", *overrides]).task


def test_a_hub_dataset_loads_offline_with_bad_rows_skipped_counted_and_located(hub, caplog):
    _, commit = hub
    data = load_task_data(task("task.dataset=org/gsm", "task.subset=main", "task.prompt_field=question",
                               "task.answer_transform=gsm8k", "task.eval_split=test"), seed=0)
    assert data.name == "hf:org/gsm"
    assert data.source == {"dataset": "org/gsm", "commit": commit, "subset": "main", "split": "train",
                           "eval_split": "test", "streamed": False}
    assert len(data.train) == 18 and len(data.eval) == 5  # 20 rows - 2 bad, 6 rows - 1 bad
    assert [str(b) for b in data.bad_rows] == [
        "org/gsm[train]:4: field 'answer': answer_transform=gsm8k: no '#### <number>' line in '5'",
        "org/gsm[train]:7: field 'question' is empty",
        "org/gsm[test]:4: field 'answer': answer_transform=gsm8k: no '#### <number>' line in '5'"]
    ex = data.train[0]
    assert (ex.prompt, ex.answer, ex.uid) == (GSM_ROWS[0]["question"], "999", "org/gsm[train]:0")
    assert ex.meta["raw_answer"] == GSM_ROWS[0]["answer"]
    assert data.train[2].answer == "1001"  # "1,001": the comma dropped
    assert "org/gsm[train]: skipped 2 of 20 rows" in caplog.text
    assert data.origins[ex.uid] == ("org/gsm[train]", 0)


def test_without_eval_split_a_fraction_is_held_out_and_streaming_reads_train_size_rows(hub):
    held = load_task_data(task("task.dataset=org/gsm", "task.subset=main", "task.prompt_field=question",
                               "task.answer_transform=gsm8k", "task.eval_fraction=0.25"), seed=0)
    assert len(held.train) + len(held.eval) == 18 and len(held.eval) == 4
    assert not {e.prompt for e in held.train} & {e.prompt for e in held.eval}
    streamed = load_task_data(task("task.dataset=org/gsm", "task.subset=main", "task.prompt_field=question",
                                   "task.answer_transform=gsm8k", "task.streaming=true", "task.train_size=6",
                                   "task.eval_split=test", "task.eval_size=3"), seed=0)
    assert [e.uid for e in streamed.train] == [f"org/gsm[train]:{i}" for i in (0, 1, 2, 3, 5)]  # row 4 bad
    assert [e.uid for e in streamed.eval] == ["org/gsm[test]:0", "org/gsm[test]:1", "org/gsm[test]:2"]
    assert len(streamed.bad_rows) == 1


def test_a_split_the_card_says_is_large_is_streamed(hub):
    cache, _ = hub
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(10)]
    add_dataset(cache, "org/big", {"train": rows}, num_bytes={"train": 5 << 30})  # the card: 5 GiB
    streamed = load_task_data(task("task.dataset=org/big", "task.train_size=4", "task.eval_fraction=0.25"), seed=0)
    assert streamed.source["streamed"] is True and len(streamed.train) + len(streamed.eval) == 4
    # a card without split sizes (org/gsm's) is not streamed unless asked: test_a_hub_dataset_loads_offline_...


def test_chat_message_prompts_dotted_answers_and_the_other_columns_as_files_do(hub):
    data = load_task_data(task("task.dataset=org/dapo", "task.prompt_field=prompt", "task.eval_fraction=0",
                               "task.answer_field=reward_model.ground_truth"), seed=0)
    assert len(data.train) == 9 and [str(b) for b in data.bad_rows] == ["org/dapo[train]:3: field 'prompt': no "
                                                                       "user message"]
    ex = data.train[1]
    assert ex.answer == "2" and ex.meta["prompt_messages"][1] == {"role": "user", "content": "1*2?"}
    assert ex.meta["data_source"] == "dapo" and ex.prompt == "system: Box it.\nuser: 1*2?\nassistant: "


def test_bad_row_limits_and_error_mode(hub):
    base = ("task.dataset=org/gsm", "task.subset=main", "task.prompt_field=question", "task.answer_transform=gsm8k")
    with pytest.raises(DatasetError, match=r"^org/gsm\[train\]:4: field 'answer': answer_transform=gsm8k"):
        load_task_data(task(*base, "task.on_bad_row=error"), seed=0)
    with pytest.raises(DatasetError, match=r"org/gsm\[train\]: more than max_bad_rows=1 bad rows"):
        load_task_data(task(*base, "task.max_bad_rows=1"), seed=0)
    data = load_task_data(task(*base, "task.max_row_bytes=100"), seed=0)  # the rows from 1,000 on are longer
    assert all("over max_row_bytes=100" in b.reason for b in data.bad_rows if b.line not in (4, 7))


def test_missing_dataset_subset_split_and_column_say_what_and_where(hub):
    cache, _ = hub
    with pytest.raises(HubDatasetNotFound) as info:
        load_task_data(task("task.dataset=org/absent"), seed=0)
    msg = str(info.value)
    assert msg.startswith(f"task.dataset=org/absent: not in the hub cache {cache} (revision main)")
    assert "HF_HUB_OFFLINE=1" in msg and "`hf download --repo-type dataset org/absent`" in msg
    with pytest.raises(DatasetError, match=r"task.subset: BuilderConfig 'nope' not found. Available: \['main'\]"):
        load_task_data(task("task.dataset=org/gsm", "task.subset=nope"), seed=0)
    with pytest.raises(DatasetError, match=r"task.split: Unknown split \"dev\""):
        load_task_data(task("task.dataset=org/gsm", "task.subset=main", "task.split=dev"), seed=0)
    with pytest.raises(DatasetError, match=r"org/gsm\[train\]: no prompt column 'prompt'; available columns: "
                                           "question, answer"):
        load_task_data(task("task.dataset=org/gsm", "task.subset=main"), seed=0)


@pytest.mark.parametrize("overrides, message", [
    (["task.name=hf"], "task.dataset: required when task.name=hf"),
    (["task.name=hf", "task.dataset=data/train/x.jsonl"], "task.dataset: 'data/train/x.jsonl' is not a hub"),
    (["task.name=hf", "task.dataset=org/x", "task.eval_split=train"], "task.eval_split: the same split"),
    (["task.dataset=org/x"], "only used with task.name=hf (task.name is 'reversal')"),
    (["task.answer_transform=gsm8k"], "task.answer_transform: only used with task.name=file or hf"),
    (["task.name=hf", "task.dataset=org/x", "task.answer_transform=latex"], "task.answer_transform: 'latex' is not"),
])
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_gsm8k_answers_after_the_transform_are_what_the_math_verifier_scores():
    from credo.data.files import ANSWER_TRANSFORMS, last_boxed
    from credo.rewards.verifiers import math_verifier

    gsm8k, _ = ANSWER_TRANSFORMS["gsm8k"]
    gold = gsm8k("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72")
    assert gold == "72"
    ex = Example(prompt="q", answer=gold)
    assert math_verifier("so the answer is \\boxed{72}.", ex).correct
    assert not math_verifier("so the answer is \\boxed{71}.", ex).correct
    assert last_boxed(r"first \boxed{1}, then \boxed{\frac{3}{4}} done") == r"\frac{3}{4}"
    assert math_verifier(r"\boxed{0.75}", Example(prompt="q", answer=r"\frac{3}{4}")).correct
    assert last_boxed("no box") is None and last_boxed(r"\boxed{open") is None
