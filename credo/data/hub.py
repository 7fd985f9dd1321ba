"""Datasets by hub id: ``task.name=hf task.dataset=org/name[@revision]`` (with ``task.subset``, ``task.split``,
``task.eval_split``), read with the ``datasets`` library and turned into examples with the field mapping and the
bad-row rules of files (credo.data.files: ``prompt_field`` / ``answer_field`` as dotted paths, chat-message
prompts, ``on_bad_row``, ``max_bad_rows``, ``max_row_bytes``, ``answer_transform``). A bad row is located as
``org/name[split]:ROW`` (ROW: the 0-based row index, ``load_dataset(...)[ROW]``). docs/bring-your-own.md.

Where the rows come from:

- the hub reachable: ``datasets.load_dataset(org/name, subset, split=..., revision=..., streaming=...)``, which
  caches what it downloads (the hub cache and ``HF_DATASETS_CACHE``);
- ``HF_HUB_OFFLINE=1``: the repository's snapshot in the hub cache (``hf download --repo-type dataset
  org/name`` puts it there; ``snapshot_download(..., local_files_only=True)`` finds it), read by
  ``load_dataset(SNAPSHOT_DIR, subset, split=...)`` as a local dataset directory (its README's ``configs`` name the
  subsets); else what ``load_dataset`` prepared on an earlier online run (``HF_DATASETS_CACHE``); else a
  :class:`HubDatasetNotFound` naming the id, the caches and the command that fetches it.

A streamed split (``task.streaming=true``, or null and the dataset card's split info over
:data:`LARGE_SPLIT_BYTES`) is read row by row instead of being downloaded whole, at most ``train_size`` rows
(``eval_size`` of an ``eval_split``).
"""
from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from credo.config.hub_ref import HubId, parse_hub_id
from credo.data.files import (BadRowsWarning, DatasetError, FileDataset, _check_columns, _Fields, row_too_long,
                              rows_to_dataset)

log = logging.getLogger(__name__)
LARGE_SPLIT_BYTES = 1 << 30  # task.streaming=null streams a split whose card says it is larger (1 GiB of Arrow data)


class HubDatasetNotFound(DatasetError, FileNotFoundError):
    """A hub dataset that is neither cached (offline) nor reachable on the hub."""


@dataclass(frozen=True)
class HubSplit:
    """What was read: the dataset id, the commit of the snapshot when known, the subset, the split, whether it was
    streamed."""

    dataset: str
    commit: str | None
    subset: str | None
    split: str
    streamed: bool = False


def load_hub_split(cfg, split: str, *, stream_rows: int | None = None) -> tuple[FileDataset, HubSplit]:
    """The examples of one split of ``cfg.dataset`` (``cfg``: a :class:`credo.config.TaskConfig`) and where they
    came from; a streamed split is read up to ``stream_rows`` rows. Bad rows as in
    :func:`credo.data.files.load_dataset_file` (a :class:`BadRowsWarning` when some were skipped)."""
    ref = parse_hub_id(cfg.dataset)
    if ref is None:
        raise DatasetError(f"task.dataset: {cfg.dataset!r} is not a hub dataset id (org/name[@revision])")
    ds, source = open_split(ref, cfg.subset, split, streaming=cfg.streaming)
    limit = stream_rows if source.streamed else None
    where = f"{ref.repo_id}[{split}]"
    fields = _Fields(cfg.prompt_field, cfg.answer_field, None)
    columns = getattr(ds, "column_names", None)
    if columns:
        _check_columns(where, list(columns), fields)
    rows = _rows(ds, cfg.max_row_bytes, limit)
    data = rows_to_dataset(rows, where, where, fields, on_bad_row=cfg.on_bad_row, max_bad_rows=cfg.max_bad_rows,
                           answer_transform=cfg.answer_transform)
    return data, source


def _rows(ds, max_bytes: int, limit: int | None) -> Iterator[tuple[int, Any, str]]:
    """``(row index, row, reason)``; a row is measured as its JSON text, like a Parquet row."""
    for i, row in enumerate(ds):
        if limit is not None and i >= limit:
            return
        size = len(json.dumps(row, ensure_ascii=False, default=str).encode())
        yield (i, None, row_too_long(size, max_bytes)) if size > max_bytes else (i, row, "")


def open_split(ref: HubId, subset: str | None, split: str, *, streaming: bool | None = False):
    """``(datasets.Dataset or IterableDataset, HubSplit)`` of one split (module docstring: online, offline);
    ``streaming=None``: streamed when the card's split info says it is over :data:`LARGE_SPLIT_BYTES`."""
    try:
        import datasets
    except ImportError:
        raise DatasetError("task.name=hf reads hub datasets with the datasets library: pip install datasets") from None
    from credo.models.hub import hub_cache_dir, hub_offline

    datasets.disable_progress_bars()  # no per-split progress bars in a run's log
    if hub_offline():
        snap = _cached_snapshot(ref)
        if snap is not None:
            stream = _large(datasets, str(snap), subset, split, None) if streaming is None else streaming
            ds = _load(datasets, ref, str(snap), subset, split, streaming=stream, revision=None)
            return ds, HubSplit(ref.repo_id, snap.name, subset, split, stream)
        try:  # what load_dataset prepared online before (datasets' own cache)
            ds = _load(datasets, ref, ref.repo_id, subset, split, streaming=False, revision=ref.revision)
        except HubDatasetNotFound:
            raise HubDatasetNotFound(_offline_miss(ref, hub_cache_dir(), datasets.config.HF_DATASETS_CACHE)) from None
        return ds, HubSplit(ref.repo_id, None, subset, split)
    commit = dataset_commit(ref)
    revision = commit or ref.revision
    stream = _large(datasets, ref.repo_id, subset, split, revision) if streaming is None else streaming
    ds = _load(datasets, ref, ref.repo_id, subset, split, streaming=stream, revision=revision)
    return ds, HubSplit(ref.repo_id, commit, subset, split, stream)


def _large(datasets, path: str, subset: str | None, split: str, revision: str | None) -> bool:
    """Whether the dataset card's split info puts ``split`` over :data:`LARGE_SPLIT_BYTES` (unknown: no)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            splits = datasets.load_dataset_builder(path, subset, revision=revision).info.splits or {}
    except Exception:  # noqa: BLE001 - no builder (a bad subset, unreachable): load_dataset reports it in its words
        return False
    info = splits.get(split)
    size = getattr(info, "num_bytes", None) or 0
    if size > LARGE_SPLIT_BYTES:
        log.info("task.dataset: split %s of %s is %.1f GiB (dataset card): streamed", split, path, size / (1 << 30))
    return size > LARGE_SPLIT_BYTES


def dataset_commit(ref: HubId) -> str | None:
    """The commit ``ref``'s revision names now: the cached snapshot's offline, the hub's answer online (None when
    neither knows: the loader then reports the dataset missing)."""
    from credo.models.hub import hub_offline

    if hub_offline():
        snap = _cached_snapshot(ref)
        return snap.name if snap is not None else None
    from huggingface_hub import HfApi

    try:
        return HfApi().dataset_info(ref.repo_id, revision=ref.revision).sha
    except Exception:  # noqa: BLE001 - unreachable, missing, gated: load_dataset says which, with its own words
        return None


def _cached_snapshot(ref: HubId) -> Path | None:
    """The snapshot directory of the dataset repository in the hub cache (read only), or None."""
    from huggingface_hub import snapshot_download

    from credo.models.hub import hub_cache_dir

    try:
        return Path(snapshot_download(ref.repo_id, repo_type="dataset", revision=ref.revision,
                                      cache_dir=hub_cache_dir(), local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or an incomplete snapshot): the next source is tried
        return None


def _load(datasets, ref: HubId, path: str, subset: str | None, split: str, *, streaming: bool,
          revision: str | None):
    """``load_dataset`` with its errors as one-line DatasetErrors naming the dataset, subset and split."""
    label = f"task.dataset={ref}" + (f" task.subset={subset}" if subset else "")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return datasets.load_dataset(path, subset, split=split, streaming=streaming, revision=revision)
    except (ConnectionError, datasets.exceptions.DatasetNotFoundError) as exc:
        raise HubDatasetNotFound(f"{label}: {_one_line(exc)}") from None
    except FileNotFoundError as exc:
        raise HubDatasetNotFound(f"{label}: {_one_line(exc)}") from None
    except ValueError as exc:  # an unknown subset (BuilderConfig ... not found) or split (Unknown split)
        text = _one_line(exc)
        key = "task.split" if "split" in text.lower() and "config" not in text.lower() else "task.subset"
        raise DatasetError(f"{label}: {key}: {text}") from None


def _offline_miss(ref: HubId, hub_cache: Path, datasets_cache: str) -> str:
    rev = f" --revision {ref.revision}" if ref.revision else ""
    return (f"task.dataset={ref}: not in the hub cache {hub_cache} (revision {ref.revision or 'main'}) nor prepared "
            f"in the datasets cache {datasets_cache}, and HF_HUB_OFFLINE=1 allows no download: fetch it with "
            f"`hf download --repo-type dataset {ref.repo_id}{rev}` where the hub is reachable (the same "
            f"HF_HUB_CACHE / HF_HOME), or unset HF_HUB_OFFLINE")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = ["BadRowsWarning", "HubDatasetNotFound", "HubSplit", "load_hub_split", "open_split"]
