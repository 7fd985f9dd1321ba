"""Loading JSONL and Parquet datasets: validation, bad-row reporting, meta, and splits."""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from credo.data import BadRowsWarning, DatasetError, load_dataset_file, split_examples
from credo.types import Example

# Physical lines of a JSONL file; the comment gives each line's fate.
JSONL_LINES = [
    '{"prompt": "1+1=", "answer": "2"}',  # 1 good
    '{"prompt": "2+2=", "answer": 4, "source": "gen", "numbers": [1, 2]}',  # 2 good, numeric answer
    "",  # 3 blank: ignored
    '{"prompt": "broken", "answer": ',  # 4 invalid JSON
    '{"answer": "x"}',  # 5 missing prompt
    '{"prompt": null, "answer": "x"}',  # 6 null prompt
    '{"prompt": "a", "answer": null}',  # 7 null answer
    '{"prompt": 5, "answer": "x"}',  # 8 prompt wrong type
    '{"prompt": "b", "answer": ["x"]}',  # 9 answer wrong type
    '["prompt", "answer"]',  # 10 not an object
    '{"prompt": "", "answer": "x"}',  # 11 empty prompt
    "   ",  # 12 blank (whitespace): ignored
    '{"prompt": "3+3=", "answer": "6"}',  # 13 good
    '{"prompt": "c", "answer": true}',  # 14 bool answer: wrong type
]
BAD_LINES = [4, 5, 6, 7, 8, 9, 10, 11, 14]


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _write_parquet(path: Path, columns: dict[str, list]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def _load_skip(path, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = load_dataset_file(path, on_bad_row="skip", **kwargs)
    return ds, [w for w in caught if issubclass(w.category, BadRowsWarning)]


# ------------------------------------------------------------------ JSONL


def test_jsonl_skip_mode_counts_and_warns_once(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", JSONL_LINES)
    ds, warned = _load_skip(path)
    assert [e.prompt for e in ds.examples] == ["1+1=", "2+2=", "3+3="]
    assert ds.num_bad == len(BAD_LINES)
    assert [b.line for b in ds.bad_rows] == BAD_LINES
    assert all(b.path == str(path) for b in ds.bad_rows)
    reasons = {b.line: b.reason for b in ds.bad_rows}
    assert "invalid JSON" in reasons[4]
    assert "missing field 'prompt'" in reasons[5]
    assert "'prompt' is null" in reasons[6]
    assert "'answer' is null" in reasons[7]
    assert "'prompt' must be a string" in reasons[8]
    assert "'answer' must be a string or number" in reasons[9]
    assert "object" in reasons[10]
    assert "'prompt' is empty" in reasons[11]
    assert "bool" in reasons[14]
    assert len(warned) == 1
    msg = str(warned[0].message)
    assert f"skipped {len(BAD_LINES)} of 12 rows" in msg and f"{path}:4:" in msg


def test_jsonl_numbers_meta_and_uid(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", JSONL_LINES)
    ds, _ = _load_skip(path)
    two = ds.examples[1]
    assert two.answer == "4"
    assert two.meta == {"source": "gen", "numbers": [1, 2]}
    assert two.uid == "data.jsonl:2"
    assert ds.examples[2].uid == "data.jsonl:13"
    assert ds.examples[0].meta == {}


def test_jsonl_error_mode_reports_path_and_line(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", JSONL_LINES)
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(path))}:4: invalid JSON") as err:
        load_dataset_file(path, on_bad_row="error")
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("line", BAD_LINES)
def test_jsonl_error_mode_each_kind(tmp_path, line):
    lines = [JSONL_LINES[0], JSONL_LINES[line - 1]]
    path = _write_jsonl(tmp_path / "one.jsonl", lines)
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(path))}:2: "):
        load_dataset_file(path, on_bad_row="error")


def test_clean_file_does_not_warn(tmp_path):
    path = _write_jsonl(tmp_path / "ok.json", [JSONL_LINES[0], JSONL_LINES[12]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = load_dataset_file(path)
    assert len(ds) == 2 and ds.num_bad == 0


def test_custom_fields_and_uid_field(tmp_path):
    rows = [
        {"question": "q1", "solution": 7, "id": "a", "level": 1},
        {"question": "q2", "solution": "x", "id": 12},
        {"question": "q3", "solution": "y"},  # no id -> bad row
    ]
    path = _write_jsonl(tmp_path / "custom.jsonl", [json.dumps(r) for r in rows])
    ds, warned = _load_skip(path, prompt_field="question", answer_field="solution", uid_field="id")
    assert [(e.prompt, e.answer, e.uid) for e in ds.examples] == [("q1", "7", "a"), ("q2", "x", "12")]
    assert ds.examples[0].meta == {"level": 1}
    assert [(b.line, b.reason) for b in ds.bad_rows] == [(3, "missing field 'id'")]
    assert len(warned) == 1
    # the default field names are now "missing"
    with pytest.raises(DatasetError, match="no valid rows"):
        _load_skip(path)


def test_all_bad_file(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", ['{"prompt": ""}', "nope"])
    with pytest.raises(DatasetError, match="no valid rows.*2 bad"):
        load_dataset_file(path)
    empty = _write_jsonl(tmp_path / "empty.jsonl", [""])
    with pytest.raises(DatasetError, match="no valid rows"):
        load_dataset_file(empty)


def test_max_bad_rows(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", JSONL_LINES)
    with pytest.raises(DatasetError, match="max_bad_rows=3"):
        load_dataset_file(path, max_bad_rows=3)
    ds, warned = _load_skip(path, max_bad_rows=len(BAD_LINES))
    assert ds.num_bad == len(BAD_LINES) and len(warned) == 1


def test_invalid_utf8_and_bom(tmp_path):
    path = tmp_path / "enc.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "p", "answer": "a"}\n{"prompt": "\xff", "answer": "a"}\n')
    ds, _ = _load_skip(path)
    assert len(ds.examples) == 1
    assert ds.bad_rows[0].line == 2 and "UTF-8" in ds.bad_rows[0].reason


def test_unknown_extension_and_missing_file(tmp_path):
    (tmp_path / "data.csv").write_text("prompt,answer\n")
    with pytest.raises(ValueError, match="extension"):
        load_dataset_file(tmp_path / "data.csv")
    with pytest.raises(FileNotFoundError):
        load_dataset_file(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="on_bad_row"):
        load_dataset_file(tmp_path / "data.csv", on_bad_row="ignore")


# ------------------------------------------------------------------ Parquet


def _parquet_rows(tmp_path: Path) -> Path:
    return _write_parquet(
        tmp_path / "data.parquet",
        {
            "prompt": ["3 5 2 to 16:", None, "", "4 4 1 to 17:", "x"],
            "answer": ["16", "1", "1", None, "y"],
            "numbers": [[3, 5, 2], [1], [1], [4, 4, 1], []],
            "target": [16, 1, 1, 17, 0],
        },
    )


def test_parquet_skip_mode(tmp_path):
    path = _parquet_rows(tmp_path)
    ds, warned = _load_skip(path)
    assert [e.prompt for e in ds.examples] == ["3 5 2 to 16:", "x"]
    assert ds.examples[0].meta == {"numbers": [3, 5, 2], "target": 16}
    assert ds.examples[0].uid == "data.parquet:1" and ds.examples[1].uid == "data.parquet:5"
    assert [(b.line, b.reason) for b in ds.bad_rows] == [
        (2, "field 'prompt' is null"),
        (3, "field 'prompt' is empty"),
        (4, "field 'answer' is null"),
    ]
    assert len(warned) == 1


def test_parquet_error_mode(tmp_path):
    path = _parquet_rows(tmp_path)
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(path))}:2: field 'prompt' is null$"):
        load_dataset_file(path, on_bad_row="error")


def test_parquet_numeric_answers_and_custom_fields(tmp_path):
    path = _write_parquet(tmp_path / "nums.pq", {"q": ["a", "b"], "a": [3, 40], "src": ["s1", "s2"]})
    ds = load_dataset_file(path, prompt_field="q", answer_field="a")
    assert [(e.prompt, e.answer, e.meta) for e in ds.examples] == [("a", "3", {"src": "s1"}), ("b", "40", {"src": "s2"})]


def test_parquet_wrong_prompt_type(tmp_path):
    path = _write_parquet(tmp_path / "ints.parquet", {"prompt": [1, 2], "answer": ["a", "b"]})
    with pytest.raises(DatasetError, match=r"ints.parquet:1: field 'prompt' must be a string, got int"):
        load_dataset_file(path, on_bad_row="error")


def test_parquet_missing_column(tmp_path):
    path = _write_parquet(tmp_path / "cols.parquet", {"question": ["a"], "answer": ["b"]})
    with pytest.raises(ValueError, match="no prompt column 'prompt'; available columns: question, answer") as err:
        load_dataset_file(path)
    assert isinstance(err.value, DatasetError)
    with pytest.raises(ValueError, match="no answer column 'solution'"):
        load_dataset_file(path, prompt_field="question", answer_field="solution")


def test_parquet_all_bad(tmp_path):
    path = _write_parquet(tmp_path / "bad.parquet", {"prompt": [None, ""], "answer": ["a", "b"]})
    with pytest.raises(DatasetError, match="no valid rows"):
        load_dataset_file(path)


# ------------------------------------------------------------------ split_examples


def _dup_examples() -> list[Example]:
    # 40 distinct prompts, each appearing twice
    return [Example(prompt=f"p{i % 40}", answer="a", uid=str(i)) for i in range(80)]


def test_split_examples_held_out_and_deterministic():
    examples = _dup_examples()
    train, evals = split_examples(examples, 0.25, seed=0)
    assert len(train) + len(evals) == 80 and len(evals) == 20
    assert not {e.prompt for e in train} & {e.prompt for e in evals}
    assert split_examples(examples, 0.25, seed=0) == (train, evals)
    assert split_examples(examples, 0.25, seed=1)[1] != evals
    assert [e.uid for e in train] == sorted((e.uid for e in train), key=int)  # input order kept


def test_split_examples_edges():
    examples = _dup_examples()
    assert split_examples(examples, 0.0, seed=0) == (examples, [])
    assert len(split_examples(examples[:3], 0.01, seed=0)[1]) == 1  # at least one when positive
    with pytest.raises(ValueError):
        split_examples(examples, 1.0, seed=0)
    with pytest.raises(ValueError, match="keep any for training"):
        split_examples([Example("same", "a"), Example("same", "b")], 0.5, seed=0)
