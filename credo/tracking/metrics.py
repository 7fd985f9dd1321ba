"""Per-step metrics logging: crash-safe JSONL files plus (optionally) TensorBoard scalars.

Layout inside a run directory::

    run_dir/metrics.jsonl        one JSON object per line: {"step": 12, "reward/mean": 0.41, ...}
    run_dir/<name>.jsonl         other logs written through ``log(..., file="<name>.jsonl")``
    run_dir/tb/                  TensorBoard events of metrics.jsonl (tags = metric keys, unchanged)
    run_dir/tb/<name>/           TensorBoard events of <name>.jsonl (tags prefixed "<name>/")

JSONL is the source of truth (the report in ``credo.report`` reads it); TensorBoard is a convenience.
Each line is flushed and fsync'ed as soon as it is written, so a killed run loses at most the line
being written; :func:`read_metrics` skips such a truncated last line.

Value conversion: numpy / torch scalars are converted with ``float()`` (integers and bools stay
integers).  NaN and +-inf are not valid JSON, so they are written as ``null`` in the JSONL file
(TensorBoard still receives the non-finite float).  Readers must treat ``None`` as "no value".

Resuming: ``MetricsLogger(run_dir, resume_step=s)`` keeps only the rows with ``step <= s`` in every
``*.jsonl`` file of ``run_dir`` whose rows carry a ``"step"`` field (rows logged after the last
checkpoint by the killed run are dropped, so the resumed run continues the same log without
duplicates), and opens TensorBoard with ``purge_step=s + 1`` so TensorBoard hides the same rows.
Files named in ``keep_on_resume`` (default: ``warm_start.jsonl``) are left whole: they log a phase
that ran once before the RL loop, is not repeated on resume, and counts its own steps (SFT step
40 was logged before RL step 20, not after it).  That is also why every file has its own
TensorBoard directory: a purge in one run directory hides all of its tags.

Experiment trackers (W&B, MLflow, trackio; :mod:`credo.tracking.trackers`) passed as ``trackers=`` get
every ``log()`` row with the TensorBoard tags and the file's step axis (``step``, ``warm_start/step``), and
are finished by :meth:`MetricsLogger.close` (as failed when the ``with`` block ends with an exception).

This module imports neither torch nor tensorboard at import time; the SummaryWriter is imported
lazily when the logger is created.  A logger is meant to be used from one process and thread.
"""
from __future__ import annotations

import json
import logging
import math
import numbers
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from credo.tracking.atomic import atomic_write_text
from credo.tracking.rundir import UnsafeRunDir, open_nofollow

if TYPE_CHECKING:
    from credo.tracking.trackers import TrackerSet

__all__ = ["MetricsLogger", "read_metrics", "DEFAULT_FILE", "KEEP_ON_RESUME"]

DEFAULT_FILE = "metrics.jsonl"
KEEP_ON_RESUME = ("warm_start.jsonl",)  # logs of a pre-RL phase, indexed by their own steps
TB_DIRNAME = "tb"

_log = logging.getLogger(__name__)
_tb_import_warned = False  # the "TensorBoard unavailable" warning is emitted once per process


# --------------------------------------------------------------------------------------- reading


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL metrics file into a list of dicts, in file order.

    Blank lines are ignored.  A last line that is not valid JSON (the process was killed while
    writing it) is skipped.  An invalid line anywhere else means real corruption and raises
    ``ValueError`` naming the line.  A missing file raises ``FileNotFoundError``.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()  # a cut may split a char
    while lines and not lines[-1].strip():
        lines.pop()
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):  # truncated by a crash mid-write: drop it
                _log.warning("%s: skipping truncated last line %d", path, lineno)
                break
            raise ValueError(f"{path}:{lineno}: invalid JSON line ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------- helpers


def _to_number(key: str, value: Any) -> int | float:
    """Convert one metric value (Python, numpy or torch scalar) to a plain ``int`` or ``float``."""
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalars and 0-d arrays
        try:
            value = value.item()
        except (ValueError, RuntimeError) as exc:  # a tensor / array with more than one element
            raise TypeError(f"metric {key!r}: expected a scalar, got {type(value).__name__}") from exc
    if isinstance(value, numbers.Integral):  # bool, int, numpy integers
        return int(value)
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__}") from exc


def _json_safe(number: int | float) -> int | float | None:
    """NaN / inf are not JSON: they become ``None`` (``null``)."""
    return number if isinstance(number, int) or math.isfinite(number) else None


def _check_file_name(file: str) -> None:
    if Path(file).name != file or not file.endswith(".jsonl") or file == ".jsonl":
        raise ValueError(f"file must be a plain '<name>.jsonl' file name inside run_dir, got {file!r}")


def _repair_tail(path: Path) -> None:
    """Make ``path`` end with a newline so appends start on a fresh line.

    A last line without newline is completed if it is valid JSON, and cut off otherwise (a crash
    mid-write left it truncated).
    """
    if path.is_symlink():
        raise UnsafeRunDir(f"{path} is a symlink: credo does not write through links in a run directory")
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1  # 0 when the file is a single line
        try:
            json.loads(data[start:])
            f.write(b"\n")
        except ValueError:
            f.truncate(start)
        f.flush()
        os.fsync(f.fileno())


def _truncate_for_resume(path: Path, resume_step: int) -> None:
    """Keep rows with ``step <= resume_step`` (rows without a step are kept); no-op for step-less files."""
    rows = read_metrics(path)
    if not any("step" in row for row in rows):
        return
    kept = [row for row in rows if not _after(row, resume_step)]
    if len(kept) < len(rows):
        _log.info("%s: dropping %d row(s) logged after step %d", path, len(rows) - len(kept), resume_step)
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in kept))


def _tag_prefix(file: str) -> str:
    """The TensorBoard / tracker prefix of ``file``'s keys: none for metrics.jsonl, ``"<stem>/"`` otherwise."""
    return "" if file == DEFAULT_FILE else f"{Path(file).stem}/"


def _after(row: Mapping[str, Any], step: int) -> bool:
    """Whether ``row`` was logged at a step later than ``step`` (rows without a numeric step: no)."""
    row_step = row.get("step")
    return isinstance(row_step, (int, float)) and row_step > step


def _open_summary_writer(log_dir: Path, purge_step: int | None) -> Any | None:
    """Create a TensorBoard SummaryWriter, or warn once and return None if it is unavailable."""
    global _tb_import_warned
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        if not _tb_import_warned:
            _tb_import_warned = True
            warnings.warn(
                f"TensorBoard logging disabled ({exc}); metrics are still written as JSONL",
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    return SummaryWriter(str(log_dir), purge_step=purge_step)


# ---------------------------------------------------------------------------------------- logger


class MetricsLogger:
    """Append per-step metrics to ``run_dir/*.jsonl`` and mirror them to TensorBoard.

    Args:
        run_dir: run directory (created if missing).
        tensorboard: also write TensorBoard scalars under ``run_dir/tb``.  If ``False`` or if
            ``torch.utils.tensorboard`` cannot be imported (a warning is emitted once), only
            JSONL is written.
        resume_step: step of the checkpoint a resumed run starts from.  Rows with a larger step
            are removed from every step-indexed ``*.jsonl`` in ``run_dir`` (atomic rewrite), and
            TensorBoard gets ``purge_step=resume_step + 1``.
        keep_on_resume: file names exempt from that truncation and purge (see module docstring).
        trackers: experiment trackers (:func:`credo.tracking.trackers.open_trackers`) that also get every
            ``log()`` row; closed with the logger.

    Usage::

        with MetricsLogger(run_dir) as logger:
            logger.log(step, {"reward/mean": 0.4, "timing_s/gen": 3.2})
            logger.log(sft_step, {"sft/loss": 1.3}, file="warm_start.jsonl")
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        resume_step: int | None = None,
        keep_on_resume: Iterable[str] = KEEP_ON_RESUME,
        trackers: TrackerSet | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.resume_step = resume_step
        self._keep_on_resume = frozenset(keep_on_resume)
        self._files: dict[str, IO[str]] = {}
        self._writers: dict[str, Any] = {}  # file name -> SummaryWriter, created on first use
        self._closed = False
        self._trackers = trackers
        if resume_step is not None:
            for path in sorted(self.run_dir.glob("*.jsonl")):
                if path.name not in self._keep_on_resume:
                    _truncate_for_resume(path, resume_step)
        self._tensorboard = tensorboard
        if tensorboard:
            self._writer_for(DEFAULT_FILE)  # open now: writes the purge marker at once on resume
        else:
            _log.info("TensorBoard logging off; writing JSONL only to %s", self.run_dir)

    @property
    def tensorboard_enabled(self) -> bool:
        """Whether scalars are also going to TensorBoard."""
        return self._tensorboard

    def _writer_for(self, file: str) -> Any | None:
        """The SummaryWriter of ``file`` (``tb/`` for metrics.jsonl, ``tb/<stem>/`` otherwise)."""
        if not self._tensorboard:
            return None
        if file not in self._writers:
            log_dir = self.run_dir / TB_DIRNAME
            if file != DEFAULT_FILE:
                log_dir /= Path(file).stem
            resumed = self.resume_step is not None and file not in self._keep_on_resume
            writer = _open_summary_writer(log_dir, self.resume_step + 1 if resumed else None)
            if writer is None:
                self._tensorboard = False
                return None
            self._writers[file] = writer
        return self._writers[file]

    def log(self, step: int, metrics: Mapping[str, Any], *, file: str = DEFAULT_FILE) -> None:
        """Write one row ``{"step": step, **metrics}`` to ``run_dir/file`` and to TensorBoard.

        Keys are used as TensorBoard tags unchanged for ``metrics.jsonl``; rows of any other file
        get the file stem as a tag prefix (``warm_start.jsonl`` + ``sft/loss`` ->
        ``warm_start/sft/loss``).  NaN / inf values are stored as ``null`` in JSONL.
        """
        if self._closed:
            raise RuntimeError("MetricsLogger.log() called after close()")
        _check_file_name(file)
        if "step" in metrics:
            raise ValueError("metrics must not contain a 'step' key; pass the step as the first argument")
        step = int(step)
        values = {key: _to_number(key, value) for key, value in metrics.items()}
        row = {"step": step, **{key: _json_safe(value) for key, value in values.items()}}
        self._write_line(file, json.dumps(row, allow_nan=False))
        self._write_scalars(step, values, file)
        if self._trackers:
            prefix = _tag_prefix(file)
            self._trackers.log({prefix + key: value for key, value in values.items()}, step, prefix + "step")

    def log_record(self, step: int, record: Mapping[str, Any], *, file: str) -> None:
        """Write one row ``{"step": step, **record}`` of any JSON values to ``run_dir/file`` (no TensorBoard);
        truncated on resume like the metric files."""
        if self._closed:
            raise RuntimeError("MetricsLogger.log_record() called after close()")
        _check_file_name(file)
        if file == DEFAULT_FILE:
            raise ValueError(f"{DEFAULT_FILE} holds scalar metrics only; use log()")
        self._write_line(file, json.dumps({"step": int(step), **record}))

    def _write_line(self, file: str, line: str) -> None:
        handle = self._files.get(file)
        if handle is None:
            path = self.run_dir / file
            _repair_tail(path)
            handle = self._files[file] = open_nofollow(path, "a")  # a planted link is refused, not followed
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())

    def _write_scalars(self, step: int, values: Mapping[str, int | float], file: str) -> None:
        writer = self._writer_for(file)
        if writer is None:
            return
        prefix = _tag_prefix(file)
        for key, value in values.items():
            writer.add_scalar(prefix + key, value, global_step=step)
        writer.flush()

    def close(self, *, failed: bool = False) -> None:
        """Close the JSONL files, the TensorBoard writers and the tracker runs (idempotent); ``failed``: the run
        ended with an exception (MLflow marks its run FAILED, W&B finishes with exit code 1)."""
        if self._closed:
            return
        self._closed = True
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        if self._trackers is not None:
            self._trackers.close(failed=failed)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=exc_type is not None)
