"""User datasets from local JSON-lines and Parquet files.

::

    ds = load_dataset_file("data/train.jsonl", prompt_field="question", answer_field="solution")
    ds.examples      # list[Example]
    ds.bad_rows      # list[BadRow(path, line, reason)]
    train, eval_ = split_examples(ds.examples, eval_fraction=0.1, seed=0)

Each row needs a non-empty string prompt and a string answer (numbers are accepted and converted
with ``str``). Every other field of the row goes into ``Example.meta``, so columns such as
Countdown's ``numbers`` and ``target`` reach the verifier. Bad rows are either fatal
(``on_bad_row="error"``) or skipped, recorded and reported in one warning (``on_bad_row="skip"``);
they are never dropped silently. Line numbers are 1-based physical lines for JSONL and 1-based row
indices for Parquet.
"""
from __future__ import annotations

import json
import math
import os
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

from credo.types import Example

__all__ = [
    "BadRow",
    "BadRowsWarning",
    "DatasetError",
    "FileDataset",
    "JSONL_SUFFIXES",
    "PARQUET_SUFFIXES",
    "load_dataset_file",
    "split_examples",
]

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
_WARN_FIRST = 5  # bad-row locations quoted in the skip warning

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


def _iter_jsonl(path: str) -> Iterator[_RawRow]:
    """Parse one JSON value per physical line; blank lines are skipped, not reported."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
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


def _iter_parquet(path: str, fields: _Fields) -> Iterator[_RawRow]:
    """Rows of a Parquet file as dicts; a missing prompt/answer/uid column is fatal."""
    import pyarrow.parquet as pq  # imported lazily: only Parquet users pay for it

    pf = pq.ParquetFile(path)
    columns = pf.schema_arrow.names
    for role, name in (("prompt", fields.prompt), ("answer", fields.answer), ("uid", fields.uid)):
        if name is not None and name not in columns:
            raise DatasetError(
                f"{path}: no {role} column {name!r}; available columns: {', '.join(columns) or 'none'}"
            )
    lineno = 0
    for batch in pf.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            lineno += 1
            yield lineno, row, ""


# --------------------------------------------------------------------------------------------------
# Row validation
# --------------------------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return type(value).__name__


def _get_text(row: dict[str, Any], name: str, *, numbers_ok: bool) -> tuple[str | None, str]:
    """The field as a string, or ``(None, reason)``."""
    if name not in row:
        return None, f"missing field {name!r}"
    value = row[name]
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


def _to_example(row: Any, line: int, base: str, fields: _Fields) -> tuple[Example | None, str]:
    """Validate one parsed row; returns ``(example, "")`` or ``(None, reason)``."""
    if not isinstance(row, dict):
        return None, f"row must be a JSON object, got {_type_name(row)}"
    prompt, why = _get_text(row, fields.prompt, numbers_ok=False)
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
    known = ", ".join(JSONL_SUFFIXES + PARQUET_SUFFIXES)
    raise ValueError(f"{path}: unsupported dataset file extension {suffix or '(none)'!r}; expected one of {known}")


def _summary(bad: list[BadRow]) -> str:
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
) -> FileDataset:
    """Load a JSONL (``.jsonl``/``.json``/``.ndjson``) or Parquet (``.parquet``/``.pq``) file.

    Raises ValueError for an unknown extension, FileNotFoundError for a missing file, and
    :class:`DatasetError` (a ValueError) for a Parquet file without the prompt/answer/uid column, a
    bad row in ``"error"`` mode, more than ``max_bad_rows`` bad rows, or a file with no valid row. In ``"skip"`` mode one
    :class:`BadRowsWarning` summarises the skipped rows.
    """
    if on_bad_row not in ("skip", "error"):
        raise ValueError(f"on_bad_row must be 'skip' or 'error', got {on_bad_row!r}")
    if max_bad_rows is not None and (isinstance(max_bad_rows, bool) or not isinstance(max_bad_rows, int)
                                     or max_bad_rows < 0):
        raise ValueError(f"max_bad_rows must be a non-negative int or None, got {max_bad_rows!r}")
    path = os.fspath(path)
    fmt = _file_format(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file not found: {path}")
    fields = _Fields(prompt_field, answer_field, uid_field)
    rows = _iter_jsonl(path) if fmt == "jsonl" else _iter_parquet(path, fields)

    ds = FileDataset(path=path)
    base = os.path.basename(path)
    for line, row, reason in rows:
        example = None
        if not reason:
            example, reason = _to_example(row, line, base, fields)
        if example is not None:
            ds.examples.append(example)
            continue
        bad = BadRow(path, line, reason)
        if on_bad_row == "error":
            raise DatasetError(str(bad))
        ds.bad_rows.append(bad)
        if max_bad_rows is not None and ds.num_bad > max_bad_rows:
            raise DatasetError(f"{path}: more than max_bad_rows={max_bad_rows} bad rows; {_summary(ds.bad_rows)}")

    if not ds.examples:
        detail = f" ({ds.num_bad} bad: {_summary(ds.bad_rows)})" if ds.bad_rows else ""
        raise DatasetError(f"{path}: no valid rows{detail}")
    if ds.bad_rows:
        total = ds.num_bad + len(ds.examples)
        warnings.warn(
            f"{path}: skipped {ds.num_bad} of {total} rows: {_summary(ds.bad_rows)}",
            BadRowsWarning,
            stacklevel=2,
        )
    return ds


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
