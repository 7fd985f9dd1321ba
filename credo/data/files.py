"""User datasets from local JSON-lines and Parquet files, Hugging Face ``datasets`` directories and Arrow files.

::

    ds = load_dataset_file("data/train.jsonl", prompt_field="question", answer_field="solution")
    ds.examples      # list[Example]
    ds.bad_rows      # list[BadRow(path, line, reason)]
    train, eval_ = split_examples(ds.examples, eval_fraction=0.1, seed=0)

Each row needs a non-empty prompt and a string answer (numbers are accepted and converted with ``str``). A
prompt is a string or a list of chat messages (``[{"role": "user", "content": "..."}]``, TRL's conversational
layout and verl's parquet layout): the messages go into ``Example.meta["prompt_messages"]`` (rendered with the
tokenizer's chat template by :func:`credo.data.source.format_prompts`) and ``Example.prompt`` holds credo's plain
rendering of them (:func:`plain_chat`). A field is named by a dotted path into nested objects
(``reward_model.ground_truth``); a key that itself contains the dots wins. Every other top-level field of the row
goes into ``Example.meta``, so columns such as Countdown's ``numbers`` and ``target`` reach the verifier. Bad
rows are either fatal (``on_bad_row="error"``) or skipped, recorded and reported in one warning (``on_bad_row="skip"``);
they are never dropped silently. Line numbers are 1-based physical lines for JSONL and 1-based row
indices for Parquet.

A row longer than ``max_row_bytes`` (default 1 MiB; a JSONL line without its line break, a Parquet row as its
JSON text) is a bad row too. A JSONL line is read at most ``max_row_bytes + 1`` bytes at a time, so an oversized
line is never held, decoded or parsed whole.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Literal, Sequence

from credo.types import Example

__all__ = [
    "BadRow",
    "BadRowsWarning",
    "DEFAULT_MAX_ROW_BYTES",
    "DatasetError",
    "FileDataset",
    "JSONL_SUFFIXES",
    "PARQUET_SUFFIXES",
    "bad_row_summary",
    "iter_lines",
    "load_dataset_file",
    "row_too_long",
    "split_examples",
]

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow",)  # an Arrow file written by Hugging Face datasets (read with the datasets library)
_WARN_FIRST = 5  # bad-row locations quoted in the skip warning
DEFAULT_MAX_ROW_BYTES = 1 << 20  # 1 MiB: a row longer than this is a bad row (task.max_row_bytes)
_SKIP_CHUNK = 1 << 20  # an oversized line is read on (and dropped) this many bytes at a time

OnBadRow = Literal["skip", "error"]


class DatasetError(ValueError):
    """A dataset file cannot be used as asked (bad row in error mode, too many bad rows, no rows)."""


class BadRowsWarning(UserWarning):
    """Rows were skipped while loading a dataset file."""


@dataclass(frozen=True)
class BadRow:
    """A skipped row: file, 1-based line (JSONL) or row index (Parquet), and why."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class FileDataset:
    """The valid examples of one file plus the rows that were skipped."""

    path: str
    examples: list[Example] = field(default_factory=list)
    bad_rows: list[BadRow] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # the line (row index) of each example, aligned with examples

    @property
    def num_bad(self) -> int:
        return len(self.bad_rows)

    def __len__(self) -> int:
        return len(self.examples)


@dataclass(frozen=True)
class _Fields:
    prompt: str
    answer: str
    uid: str | None


# --------------------------------------------------------------------------------------------------
# Raw rows: (line, row object or None, error reason)
# --------------------------------------------------------------------------------------------------

_RawRow = tuple[int, Any, str]  # reason is "" when the row parsed


def row_too_long(size: int, max_bytes: int) -> str:
    """The bad-row reason of a row of ``size`` bytes over the cap."""
    return f"row is {size:,} bytes, over max_row_bytes={max_bytes:,}"


def iter_lines(f: BinaryIO, max_bytes: int) -> Iterator[tuple[bytes | None, int]]:
    """``(line, size)`` for each physical line of a binary file, without its ``\\n``; ``line`` is None for a line
    longer than ``max_bytes``, which is read on in bounded chunks and dropped (never held whole)."""
    while True:
        raw = f.readline(max_bytes + 1)
        if not raw:
            return
        if raw.endswith(b"\n") or len(raw) <= max_bytes:  # whole line (the last one may lack its \n)
            yield raw.removesuffix(b"\n"), len(raw) - raw.endswith(b"\n")
            continue
        size = len(raw)
        while not raw.endswith(b"\n"):
            raw = f.readline(_SKIP_CHUNK)
            if not raw:
                break
            size += len(raw)
        yield None, size - raw.endswith(b"\n")


def _iter_jsonl(path: str, max_bytes: int) -> Iterator[_RawRow]:
    """Parse one JSON value per physical line; blank lines are skipped, not reported."""
    with open(path, "rb") as f:
        for lineno, (raw, size) in enumerate(iter_lines(f, max_bytes), start=1):
            if raw is None:
                yield lineno, None, row_too_long(size, max_bytes)
                continue
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # UTF-8 byte-order mark
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield lineno, None, f"invalid UTF-8 ({e.reason} at byte {e.start})"
                continue
            try:
                yield lineno, json.loads(text), ""
            except json.JSONDecodeError as e:
                yield lineno, None, f"invalid JSON: {e.msg} (column {e.colno})"


def _load_hf(path: str, fmt: str):
    """A Hugging Face ``datasets.Dataset`` from a ``save_to_disk`` directory or an Arrow file; a directory of
    several splits (a DatasetDict) is a DatasetError naming them (point at DIR/<split>)."""
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{path}: reading Hugging Face datasets directories and Arrow files needs the datasets "
                           f"library: pip install datasets") from None
    if fmt == "arrow":
        return datasets.Dataset.from_file(path)
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        splits = sorted(p.name for p in Path(path).iterdir() if p.is_dir())
        raise DatasetError(f"{path} holds the splits {', '.join(splits)}: point task.train_file / task.eval_file at "
                           f"one of them, e.g. {os.path.join(path, splits[0] if splits else 'train')}")
    if not os.path.isfile(os.path.join(path, "state.json")):
        raise DatasetError(f"{path} is a directory but not a Hugging Face datasets directory (no state.json)")
    return datasets.load_from_disk(path)


def _iter_hf(path: str, fields: _Fields, max_bytes: int, fmt: str) -> Iterator[_RawRow]:
    """Rows of a Hugging Face dataset (1-based row numbers), measured like Parquet rows; a missing prompt / answer
    / uid column is fatal."""
    ds = _load_hf(path, fmt)
    _check_columns(path, list(ds.column_names), fields)
    for lineno, row in enumerate(ds, start=1):
        size = len(json.dumps(row, ensure_ascii=False, default=str).encode())
        yield (lineno, None, row_too_long(size, max_bytes)) if size > max_bytes else (lineno, row, "")


def _check_columns(path: str, columns: list[str], fields: _Fields) -> None:
    for role, name in (("prompt", fields.prompt), ("answer", fields.answer), ("uid", fields.uid)):
        if name is not None and name not in columns and name.split(".")[0] not in columns:
            raise DatasetError(
                f"{path}: no {role} column {name!r}; available columns: {', '.join(columns) or 'none'}"
            )


def _iter_parquet(path: str, fields: _Fields, max_bytes: int) -> Iterator[_RawRow]:
    """Rows of a Parquet file as dicts; a missing prompt/answer/uid column is fatal. A row is measured as its
    JSON text (after pyarrow decoded it: the cap bounds what is tokenised, not what pyarrow reads)."""
    import pyarrow.parquet as pq  # imported lazily: only Parquet users pay for it

    pf = pq.ParquetFile(path)
    _check_columns(path, pf.schema_arrow.names, fields)
    lineno = 0
    for batch in pf.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            lineno += 1
            size = len(json.dumps(row, ensure_ascii=False, default=str).encode())
            yield (lineno, None, row_too_long(size, max_bytes)) if size > max_bytes else (lineno, row, "")


# --------------------------------------------------------------------------------------------------
# Row validation
# --------------------------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return type(value).__name__


_MISSING = object()
CHAT_ROLES = ("system", "user", "assistant", "tool")


def _lookup(row: dict[str, Any], name: str) -> Any:
    """``row[name]``, else the dotted path ``a.b.c`` through nested objects; ``_MISSING`` when absent."""
    if name in row:
        return row[name]
    node: Any = row
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _get_text(row: dict[str, Any], name: str, *, numbers_ok: bool) -> tuple[str | None, str]:
    """The field as a string, or ``(None, reason)``."""
    value = _lookup(row, name)
    if value is _MISSING:
        return None, f"missing field {name!r}"
    if value is None:
        return None, f"field {name!r} is null"
    if isinstance(value, str):
        return value, ""
    if numbers_ok and isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return None, f"field {name!r} is {value}"
        return str(value), ""
    kind = "a string or number" if numbers_ok else "a string"
    return None, f"field {name!r} must be {kind}, got {_type_name(value)}"


def plain_chat(messages: list[dict[str, str]]) -> str:
    """credo's rendering of chat messages for a tokenizer without a chat template: a lone user message is its
    content; otherwise one ``role: content`` line per message and an opened ``assistant:`` turn."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def _get_messages(value: Any, name: str) -> tuple[list[dict[str, str]] | None, str]:
    """A chat-message list (each ``{"role": ..., "content": str}``, some user message), or ``(None, reason)``."""
    if not value:
        return None, f"field {name!r} is an empty message list"
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in CHAT_ROLES:
            return None, (f"field {name!r}: message {i} must be {{role: {'/'.join(CHAT_ROLES)}, content: string}}, "
                          f"got {m!r:.80}")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "user" for m in out):
        return None, f"field {name!r}: no user message"
    return out, ""


def _get_prompt(row: dict[str, Any], name: str) -> tuple[str | None, list | None, str]:
    """The prompt as ``(text, messages or None, "")``, or ``(None, None, reason)``."""
    value = _lookup(row, name)
    if isinstance(value, list):
        messages, why = _get_messages(value, name)
        return (plain_chat(messages), messages, "") if messages else (None, None, why)
    text, why = _get_text(row, name, numbers_ok=False)
    return text, None, why


def _to_example(row: Any, line: int, base: str, fields: _Fields) -> tuple[Example | None, str]:
    """Validate one parsed row; returns ``(example, "")`` or ``(None, reason)``."""
    if not isinstance(row, dict):
        return None, f"row must be a JSON object, got {_type_name(row)}"
    prompt, messages, why = _get_prompt(row, fields.prompt)
    if prompt is None:
        return None, why
    if not prompt.strip():
        return None, f"field {fields.prompt!r} is empty"
    answer, why = _get_text(row, fields.answer, numbers_ok=True)
    if answer is None:
        return None, why
    uid = f"{base}:{line}"
    if fields.uid is not None:
        uid, why = _get_text(row, fields.uid, numbers_ok=True)
        if uid is None:
            return None, why
    used = {fields.prompt, fields.answer, fields.uid}
    meta = {k: v for k, v in row.items() if k not in used}
    if messages is not None:
        meta["prompt_messages"] = messages
    return Example(prompt=prompt, answer=answer, uid=uid, meta=meta), ""


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def _file_format(path: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in ARROW_SUFFIXES:
        return "arrow"
    if os.path.isdir(path):
        return "hf_dir"
    known = ", ".join(JSONL_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES)
    raise ValueError(f"{path}: unsupported dataset file extension {suffix or '(none)'!r}; expected one of {known}, "
                     f"or a Hugging Face datasets directory (save_to_disk)")


def bad_row_summary(bad: Sequence[BadRow]) -> str:
    """The first few bad rows as ``path:line: reason; ...`` and how many more there are."""
    first = "; ".join(str(b) for b in bad[:_WARN_FIRST])
    more = f"; ... and {len(bad) - _WARN_FIRST} more" if len(bad) > _WARN_FIRST else ""
    return f"{first}{more}"


def load_dataset_file(
    path: str | os.PathLike[str],
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    uid_field: str | None = None,
    on_bad_row: OnBadRow = "skip",
    max_bad_rows: int | None = None,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    answer_transform: str | None = None,
) -> FileDataset:
    """Load a JSONL (``.jsonl``/``.json``/``.ndjson``) or Parquet (``.parquet``/``.pq``) file, or with the ``datasets``
    library a Hugging Face datasets directory (``Dataset.save_to_disk``; one split of a DatasetDict) or Arrow file.

    Raises ValueError for an unknown extension, FileNotFoundError for a missing file, and
    :class:`DatasetError` (a ValueError) for a Parquet file without the prompt/answer/uid column, a
    bad row in ``"error"`` mode, more than ``max_bad_rows`` bad rows, or a file with no valid row. In ``"skip"`` mode one
    :class:`BadRowsWarning` summarises the skipped rows. A row over ``max_row_bytes`` is a bad row.
    ``answer_transform`` (:data:`ANSWER_TRANSFORMS`: gsm8k, boxed) rewrites each answer; a row it cannot rewrite is
    a bad row (the original answer is kept in ``meta["raw_answer"]``).
    """
    if answer_transform is not None and answer_transform not in ANSWER_TRANSFORMS:
        raise ValueError(f"answer_transform must be one of {', '.join(ANSWER_TRANSFORMS)}, got {answer_transform!r}")
    if on_bad_row not in ("skip", "error"):
        raise ValueError(f"on_bad_row must be 'skip' or 'error', got {on_bad_row!r}")
    if max_bad_rows is not None and (isinstance(max_bad_rows, bool) or not isinstance(max_bad_rows, int)
                                     or max_bad_rows < 0):
        raise ValueError(f"max_bad_rows must be a non-negative int or None, got {max_bad_rows!r}")
    if isinstance(max_row_bytes, bool) or not isinstance(max_row_bytes, int) or max_row_bytes < 1:
        raise ValueError(f"max_row_bytes must be a positive int, got {max_row_bytes!r}")
    path = os.fspath(path)
    fmt = _file_format(path)
    if not (os.path.isdir(path) if fmt == "hf_dir" else os.path.isfile(path)):
        raise FileNotFoundError(f"dataset file not found: {path}")
    fields = _Fields(prompt_field, answer_field, uid_field)
    rows = _iter_jsonl(path, max_row_bytes) if fmt == "jsonl" else _iter_parquet(path, fields, max_row_bytes) \
        if fmt == "parquet" else _iter_hf(path, fields, max_row_bytes, fmt)
    return rows_to_dataset(rows, path, os.path.basename(path), fields, on_bad_row=on_bad_row,
                           max_bad_rows=max_bad_rows, answer_transform=answer_transform)


def rows_to_dataset(rows: Iterator[_RawRow], path: str, base: str, fields: _Fields, *, on_bad_row: OnBadRow,
                    max_bad_rows: int | None, answer_transform: str | None = None) -> FileDataset:
    """The examples of ``(line, row, reason)`` rows (a file's, or a hub split's: credo.data.hub) and their bad rows,
    located as ``path:line``; uids are ``base:line``. The bad-row rules of :func:`load_dataset_file`."""
    ds = FileDataset(path=path)
    for line, row, reason in rows:
        example = None
        if not reason:
            example, reason = _to_example(row, line, base, fields)
        if example is not None and answer_transform is not None:
            example, reason = transform_answer(example, answer_transform, fields.answer)
        if example is not None:
            ds.examples.append(example)
            ds.lines.append(line)
            continue
        bad = BadRow(path, line, reason)
        if on_bad_row == "error":
            raise DatasetError(str(bad))
        ds.bad_rows.append(bad)
        if max_bad_rows is not None and ds.num_bad > max_bad_rows:
            summary = bad_row_summary(ds.bad_rows)
            raise DatasetError(f"{path}: more than max_bad_rows={max_bad_rows} bad rows; {summary}")

    if not ds.examples:
        detail = f" ({ds.num_bad} bad: {bad_row_summary(ds.bad_rows)})" if ds.bad_rows else ""
        raise DatasetError(f"{path}: no valid rows{detail}")
    if ds.bad_rows:
        total = ds.num_bad + len(ds.examples)
        warnings.warn(
            f"{path}: skipped {ds.num_bad} of {total} rows: {bad_row_summary(ds.bad_rows)}",
            BadRowsWarning,
            stacklevel=3,
        )
    return ds


# --------------------------------------------------------------------------------------------------
# Answer transforms (task.answer_transform)
# --------------------------------------------------------------------------------------------------

_GSM8K_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def _gsm8k_answer(text: str) -> str | None:
    """GSM8K's reference: the number after the last ``####`` (``1,000`` -> ``1000``)."""
    if "####" not in text:
        return None
    found = _GSM8K_NUMBER.search(text.rsplit("####", 1)[1])
    return found.group(0).replace(",", "") if found else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


ANSWER_TRANSFORMS = {"gsm8k": (_gsm8k_answer, "no '#### <number>' line"),
                     "boxed": (last_boxed, "no complete \\boxed{...}")}


def transform_answer(example: Example, name: str, field_name: str) -> tuple[Example | None, str]:
    """``(example with its answer rewritten by transform name, "")`` or ``(None, bad-row reason)``."""
    fn, missing = ANSWER_TRANSFORMS[name]
    answer = fn(example.answer)
    if not answer:
        return None, f"field {field_name!r}: answer_transform={name}: {missing} in {example.answer[-80:]!r}"
    meta = {**example.meta, "raw_answer": example.answer}
    return Example(prompt=example.prompt, answer=answer, uid=example.uid, meta=meta), ""


# --------------------------------------------------------------------------------------------------
# Held-out split for a single file
# --------------------------------------------------------------------------------------------------


def split_examples(
    examples: Sequence[Example], eval_fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """Deterministically split ``examples`` into ``(train, eval)``.

    Examples are grouped by prompt, so duplicate prompts land on the same side and no eval prompt
    appears in train. About ``eval_fraction`` of the examples (at least one when the fraction is
    positive) go to eval; both lists keep the input order. Raises ValueError if train would be empty.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction!r}")
    if eval_fraction == 0.0:
        return list(examples), []
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(ex.prompt, []).append(i)
    prompts = list(groups)
    random.Random(f"credo/split/{seed}").shuffle(prompts)

    want = max(1, round(len(examples) * eval_fraction))
    eval_idx: set[int] = set()
    for prompt in prompts:
        if len(eval_idx) >= want:
            break
        eval_idx.update(groups[prompt])
    if len(eval_idx) >= len(examples):
        raise ValueError(
            f"cannot hold out eval_fraction={eval_fraction} of {len(examples)} examples "
            f"({len(groups)} distinct prompts) and keep any for training"
        )
    train = [ex for i, ex in enumerate(examples) if i not in eval_idx]
    evals = [ex for i, ex in enumerate(examples) if i in eval_idx]
    return train, evals
