"""What credo trusts in a run directory: its marker, the entries it writes, and no links that lead out.

A run directory is credo's when it holds the marker :data:`MARKER` (``.credo-run``), which
:func:`write_marker` writes when a command takes the directory and no other tool writes. ``--overwrite``
(:func:`clear_run_dir`) acts only on such a directory and deletes only the entries credo writes
(:func:`is_credo_entry`): anything else in it is kept and named in a warning. A folder without the marker (a
project that happens to hold a ``config.yaml``, a run written before the marker existed) is refused in one line
and never touched.

A run directory handed over by someone else may hold symlinks planted where credo writes (``summary.json`` ->
``~/.bashrc``) or reads (``final/model.safetensors`` -> ``~/.ssh/id_rsa``). :func:`check_run_dir` refuses, in
one line naming the link, a directory holding any symlink, except links inside a tracker's own folder
(``wandb/``, whose ``latest-run`` links are W&B's) that stay inside the run directory; ``--resume``,
``credo export`` and ``credo eval RUN`` call it first. Files credo opens in a run directory while it runs are
opened with ``O_NOFOLLOW`` (:func:`open_nofollow`), and temporary files get unpredictable names created with
``O_EXCL`` (:func:`credo.tracking.atomic.atomic_write_text`), so a link planted during the run is refused too.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = ".credo-run"
MARKER_FORMAT = "credo-run/1"
# the top-level entries credo writes into a run directory (commands, loggers, trackers, methods)
CREDO_FILES = frozenset({
    MARKER, "config.yaml", "config.tmp", "summary.json", "report.html", "trackers.json", "mlflow.db",
    "vllm_server.log", "replay_pool.jsonl.summary.json",
})
CREDO_DIRS = frozenset({
    "checkpoints", "final", "eval_samples", "tb", "plots", "inspect", "reference", "teacher", "base",
    "reward_model", "birm", "mlartifacts", "wandb",
})
RANK_DIR = re.compile(r"rank[0-9]+")  # data-parallel ranks' own run directories
JSONL = re.compile(r"[A-Za-z0-9_.-]+\.jsonl")  # metrics.jsonl and the other logs of credo.tracking.metrics
TEMP = re.compile(r"\.[A-Za-z0-9_.-]+\.tmp")  # atomic writers' leftovers (.NAME.RANDOM.tmp)
TRACKER_DIRS = frozenset({"wandb"})  # folders whose internal links belong to a tracker


class UnsafeRunDir(ValueError):
    """A run directory credo will not read, write or delete as asked (one line naming the path)."""


# ---------------------------------------------------------------------------- marker and --overwrite

def write_marker(run_dir: Path, command: str) -> None:
    """Mark ``run_dir`` as credo's (kept when present: a resumed run keeps its first marker)."""
    path = Path(run_dir) / MARKER
    if path.is_file() and not path.is_symlink():
        return
    text = json.dumps({"format": MARKER_FORMAT, "command": command, "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    with open_nofollow(path, "w") as f:
        f.write(text + "\n")


def is_credo_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds credo's marker (a regular file, not a link, naming credo's format)."""
    path = Path(run_dir) / MARKER
    if path.is_symlink() or not path.is_file():
        return False
    try:
        return json.loads(path.read_text(errors="replace")).get("format") == MARKER_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def is_credo_entry(entry: Path) -> bool:
    """Whether a top-level entry of a run directory is one credo writes (by name and kind)."""
    name = entry.name
    if entry.is_symlink():
        return False
    if entry.is_dir():
        return name in CREDO_DIRS or bool(RANK_DIR.fullmatch(name))
    return name in CREDO_FILES or bool(JSONL.fullmatch(name)) or bool(TEMP.fullmatch(name))


def clear_run_dir(run_dir: Path) -> list[str]:
    """``--overwrite``: delete what credo wrote in the credo run directory ``run_dir``; returns the names kept.
    Refuses (:class:`UnsafeRunDir`, nothing deleted) a folder without credo's marker and one that is or contains
    the working directory. Links are never followed: a link is not credo's and is kept."""
    run_dir = Path(run_dir)
    if not is_credo_run(run_dir):
        raise UnsafeRunDir(f"--overwrite refuses {run_dir}: it has no {MARKER} marker, so it is not a credo run "
                           f"directory (or one written before credo marked its runs): nothing was deleted; "
                           f"remove it yourself or choose another run directory")
    here, target = Path.cwd().resolve(), run_dir.resolve()
    if here == target or target in here.parents:
        raise UnsafeRunDir(f"--overwrite refuses {run_dir}: it contains the working directory")
    log.warning("--overwrite: deleting the previous run in %s", run_dir)
    kept = []
    for entry in sorted(run_dir.iterdir()):
        if entry.name == MARKER:
            continue
        if not is_credo_entry(entry):
            kept.append(entry.name)
        elif entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if kept:
        log.warning("--overwrite kept %d entr%s credo did not write in %s: %s", len(kept),
                    "y" if len(kept) == 1 else "ies", run_dir, ", ".join(kept[:10]))
    return kept


# ---------------------------------------------------------------------------- links

def unsafe_links(run_dir: Path) -> list[Path]:
    """The symlinks under ``run_dir`` credo refuses (module docstring), in walk order."""
    root = Path(run_dir).resolve()
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):  # followlinks=False: a linked folder is listed, not entered
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink() and not _tracker_link(root, path):
                bad.append(path)
    return bad


def _tracker_link(root: Path, link: Path) -> bool:
    rel = link.relative_to(root)
    if rel.parts[0] not in TRACKER_DIRS or len(rel.parts) < 2:
        return False
    target = link.resolve()
    return target == root or root in target.parents


def check_run_dir(run_dir: Path, purpose: str) -> None:
    """Refuse (:class:`UnsafeRunDir`) a run directory that is a file or holds a link credo would follow."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UnsafeRunDir(f"{purpose}: {run_dir} is not a directory")
    bad = unsafe_links(run_dir)
    if bad:
        where = os.readlink(bad[0])
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UnsafeRunDir(f"{purpose}: {bad[0]} is a symlink (to {where}){more}: credo does not follow links in a "
                           f"run directory; remove it, or copy the run without links (cp -rL from a source you "
                           f"trust)")


def open_nofollow(path: Path, mode: str = "a"):
    """``open(path, mode)`` for text mode ``"a"`` (append, create) or ``"w"`` (truncate, create) that refuses a
    symlink at ``path`` (``OSError`` ELOOP) instead of writing where it points."""
    flags = {"a": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC}[mode]
    try:
        fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        if Path(path).is_symlink():
            raise UnsafeRunDir(f"{path} is a symlink: credo does not write through links in a run directory") \
                from None
        raise exc
    return os.fdopen(fd, mode, encoding="utf-8")
