"""Atomic, verified checkpoints that really resume.

Layout of ``RUN_DIR/checkpoints/``::

    step_000040/                    complete checkpoint
        model/                      Hugging Face directory (config.json, model.safetensors, tokenizer files)
        critic/                     value model (backbone + value_head.safetensors), when a critic is trained
        trainer_state.json          step, optimizer, scheduler, RNG states, data position, engine RNG, counters
        trainer_state.safetensors   ... their tensors (credo.train.state_codec: no pickle, nothing executable)
        dcp/                        distributed.strategy=fsdp2, rank 0's checkpoint: every rank's shards of the
                                    weights and optimizer state (credo.train.dcp_checkpoint)
        MANIFEST.json               size and sha256 of every file above
        COMPLETE                    marker written last
    latest                          text file naming the newest complete checkpoint (``step_NNNNNN``)

A checkpoint is written into ``.tmp-step_...`` and renamed into place only when complete, and the
``latest`` pointer is replaced atomically afterwards, so a kill at any moment leaves the previous
checkpoint usable. :func:`latest_checkpoint` returns the newest *intact* checkpoint: it ignores incomplete
directories, skips (with a warning naming the file) one whose files do not match its manifest, and never
follows a ``latest`` pointer or step directory that leads outside ``RUN_DIR/checkpoints``.

Checkpoints written before manifests and the pickle-free format (``trainer_state.pt``, no ``MANIFEST.json``)
are accepted with a warning; their trainer state is loaded with ``torch.load(weights_only=True)`` and an
allow-list of the types they hold (:func:`legacy_globals`), anything else is refused.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors import safe_open

from credo.models import save_model
from credo.faults import kill_point
from credo.tracking.atomic import atomic_write_text
from credo.tracking.rundir import open_nofollow
from credo.types import Rollouts
from credo.train.state_codec import JSON_FILE, STATE_TYPES, StateFormatError, load_state, save_state

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoints"
MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "credo-checkpoint-manifest/1"
COMPLETE = "COMPLETE"
LEGACY_STATE = "trainer_state.pt"
STEP_NAME = re.compile(r"step_[0-9]{6,}")
STALE_NAME = re.compile(r"\.(tmp|old)-step_[0-9]{6,}-[0-9]+")  # save_checkpoint's partial folders
# what a pre-manifest trainer_state.pt holds besides tensors and plain containers: numpy's RNG key array and the
# one-step-off mode's pending rollouts (the same dataclasses the current format allows)
_NP_CORE = getattr(np, "_core", None) or np.core  # numpy 2 renamed numpy.core
# state dataclasses that moved since such files were written, under the path the pickle names them by
MOVED_STATE_TYPES = [(Rollouts, "credo.collect.group.Rollouts")]


def legacy_globals() -> list[Any]:
    """The globals a pre-manifest ``trainer_state.pt`` may name: numpy's array pieces and the trainer-state
    dataclasses (:data:`credo.train.state_codec.STATE_TYPES`, built-ins included)."""
    return [np.ndarray, np.dtype, _NP_CORE.multiarray._reconstruct, *(cls for _, cls in STATE_TYPES.items()),
            *MOVED_STATE_TYPES, *([np.dtypes.UInt32DType] if hasattr(np, "dtypes") else [])]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used safely (refused trainer state, path outside the run)."""


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]  # a tuple (version, tuple of ints, gauss) as random.setstate wants
    random.setstate((python[0], tuple(python[1]), python[2]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: Path, step: int, *, model, tokenizer, trainer_state: dict[str, Any], keep: int,
                    critic=None, sharded: Callable[[Path], None] | None = None) -> Path:
    """Write checkpoint ``step`` atomically (module docstring). A write that fails (a full disk included) leaves
    no partial folder behind and the previous checkpoint untouched; a full disk is one line
    (:class:`CheckpointSpaceError`) naming the folder, the space needed and the space free. ``sharded``: called
    with the partial folder before the manifest is written (FSDP2: every rank's shards into rank 0's,
    :func:`credo.train.dcp_checkpoint.sharded_writer`; a collective)."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    _remove(tmp)
    try:
        save_model(model, tokenizer, tmp / "model")
        kill_point("checkpoint", step)  # part of the checkpoint written (credo/faults.py)
        if critic is not None:
            critic.save(tmp / "critic")
        save_state(trainer_state, tmp)
        if sharded is not None:
            sharded(tmp)
        write_manifest(tmp)
        _write_synced(tmp / COMPLETE, name)
    except BaseException as exc:
        written = _tree_bytes(tmp)
        _remove(tmp)
        if isinstance(exc, Exception):
            needed = max(written, _tree_bytes(_newest_complete(root)), _tensor_bytes(model, trainer_state))
            if _disk_full(exc, root, needed):
                raise CheckpointSpaceError(_space_message(run_dir, root, name, needed)) from exc
        raise
    final = root / name
    if final.exists():  # re-saving the same step (e.g. after a resume): move the old one aside first
        old = root / f".old-{name}-{os.getpid()}"
        final.rename(old)
        shutil.rmtree(old)
    tmp.rename(final)
    _fsync_dir(root)
    kill_point("latest", step)  # in place, `latest` not yet moved (credo/faults.py)
    _write_atomic(root / "latest", name)
    _prune(root, keep)
    return final


class CheckpointSpaceError(OSError):
    """A checkpoint did not fit on its disk; nothing of it was left behind."""


def _space_message(run_dir: Path, root: Path, name: str, needed: int) -> str:
    free = shutil.disk_usage(root).free
    previous = _newest_complete(root)
    kept = f"the previous checkpoint {previous.name} is untouched" if previous else "no earlier checkpoint exists"
    return (f"checkpoint {name}: no space left on the device of {root}: a checkpoint needs about "
            f"{_mb(needed)}, {_mb(free)} is free; nothing of {name} was left behind and {kept}; free space, then "
            f"continue with: credo train --resume {run_dir}")


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
NO_SPACE_TEXT = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122", "File too large")


def _disk_full(exc: Exception, root: Path, needed: int) -> bool:
    """Whether a failed write ran out of space: an OSError with ENOSPC / EDQUOT / EFBIG, another library's error
    saying so (safetensors raises its own type: "No space left on device (os error 28)"), or less free space
    left than the checkpoint needs."""
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return True
        if e is not None and any(t in str(e) for t in NO_SPACE_TEXT):
            return True
    try:
        return shutil.disk_usage(root).free < needed
    except OSError:
        return False


def _tensor_bytes(model, trainer_state: Any) -> int:
    """Bytes of the tensors a checkpoint stores (weights and trainer state): a lower bound of its size."""
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values() if torch.is_tensor(t))
    stack = [trainer_state]
    while stack:
        item = stack.pop()
        if torch.is_tensor(item):
            total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            stack += list(item.values())
        elif isinstance(item, (list, tuple)):
            stack += list(item)
    return total


def _newest_complete(root: Path) -> Path | None:
    """The newest checkpoint with its COMPLETE marker (not verified: a size estimate and a name for messages)."""
    return next((c for c in _candidates(root) if (c / COMPLETE).is_file()), None)


def _tree_bytes(path: Path | None) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist); links are not followed."""
    if path is None:
        return 0
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for f in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def _remove(path: Path) -> None:
    """Remove a folder credo writes (a link in its place is removed, never followed)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_temps(run_dir: Path, *, keep_pid: int | None = None) -> list[str]:
    """Remove the partial folders (``.tmp-step_N-PID``, ``.old-step_N-PID``) killed or failed saves of this run
    left in ``RUN_DIR/checkpoints``, except process ``keep_pid``'s; returns their names. Called at resume and
    after every save (:func:`_prune`)."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    stale = sorted(p for p in root.iterdir() if STALE_NAME.fullmatch(p.name)
                   and (keep_pid is None or not p.name.endswith(f"-{keep_pid}")))
    for path in stale:
        _remove(path)
    if stale:
        log.info("removed %d partial checkpoint folder(s) of earlier saves: %s", len(stale),
                 ", ".join(p.name for p in stale))
    return [p.name for p in stale]


def write_manifest(ckpt: Path) -> dict[str, Any]:
    """Write ``ckpt/MANIFEST.json`` (atomically): size and sha256 of every file of the checkpoint so far."""
    files = {rel: {"size": (ckpt / rel).stat().st_size, "sha256": _sha256(ckpt / rel)} for rel in _files(ckpt)}
    manifest = {"format": MANIFEST_FORMAT, "files": files}
    _write_atomic(ckpt / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` cannot be resumed (the first damaged file), or None when it is intact."""
    ckpt = Path(ckpt)
    if not (ckpt / COMPLETE).is_file():
        return f"{ckpt} is incomplete (no {COMPLETE} marker)"
    if not (ckpt / MANIFEST).is_file():
        return _legacy_problem(ckpt)
    return manifest_problem(ckpt)


def manifest_problem(folder: Path) -> str | None:
    """Why the files of ``folder`` do not match its ``MANIFEST.json`` (the first damaged, missing, unlisted or
    linked file), or None. A checkpoint's manifest and the final model's (``RUN_DIR/final``) are checked alike."""
    folder = Path(folder)
    if folder.is_symlink():
        return f"{folder} is a symlink"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        assert manifest["format"] == MANIFEST_FORMAT and isinstance(files, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return f"{folder / MANIFEST} is damaged"
    present = set(_files(folder))
    for rel, entry in sorted(files.items()):
        path = folder / rel
        if rel not in present:
            return f"{path} is missing"
        if path.is_symlink():
            return f"{path} is a symlink (a checkpoint holds regular files only)"
        if not isinstance(entry, dict) or path.stat().st_size != entry.get("size"):
            return f"{path} has the wrong size (truncated or replaced)"
        if _sha256(path) != entry.get("sha256"):
            return f"{path} does not match its checksum (damaged)"
    extra = sorted(present - set(files))
    return f"{folder / extra[0]} is not in {MANIFEST}" if extra else None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """Newest intact checkpoint of a run, or None; damaged ones are skipped with a warning naming the file."""
    for cand in _candidates(Path(run_dir) / CKPT_DIR):
        problem = checkpoint_problem(cand)
        if problem is None:
            return cand
        if (cand / COMPLETE).is_file():
            log.warning("skipping checkpoint %s: %s", cand.name, problem)
    return None


def resume_checkpoint(run_dir: Path) -> Path | None:
    """:func:`latest_checkpoint` for a resume: the damaged checkpoints newer than it are renamed
    ``damaged-step_N`` (kept for inspection, out of pruning, never resumed from); partial folders of earlier
    saves are removed first (:func:`remove_stale_temps`)."""
    remove_stale_temps(run_dir)
    ckpt = latest_checkpoint(run_dir)
    root = Path(run_dir) / CKPT_DIR
    for newer in _candidates(root):  # an intact newer one (a kill before the pointer moved) stays where it is
        if (ckpt is None or _step(newer) > _step(ckpt)) and (newer / COMPLETE).is_file() \
                and checkpoint_problem(newer) is not None:
            aside = root / f"damaged-{newer.name}"
            if not aside.exists():
                newer.rename(aside)
                log.warning("moved the damaged checkpoint %s aside to %s", newer, aside)
    return ckpt


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """The trainer state of ``ckpt`` as stored (JSON + safetensors, or a pre-manifest pickle); a resume upgrades
    its layout with :func:`credo.train.migrate.migrate_trainer_state`. :class:`CheckpointError` for one that
    cannot be read without running code."""
    ckpt = Path(ckpt)
    if (ckpt / JSON_FILE).is_file():
        try:
            return load_state(ckpt)
        except StateFormatError as exc:
            raise CheckpointError(f"{ckpt}: refused trainer state: {exc}") from exc
    return _load_legacy(ckpt / LEGACY_STATE)


def convert_legacy(ckpt: Path) -> None:
    """Rewrite a trusted pre-manifest checkpoint in the current format: its ``trainer_state.pt`` is unpickled
    *without* restrictions (it can run code: only for files you wrote yourself), stored as JSON + safetensors,
    and a manifest is written. ``python -m credo.train.checkpoint convert CKPT``."""
    ckpt = Path(ckpt)
    state = torch.load(ckpt / LEGACY_STATE, weights_only=False)
    save_state(state, ckpt)
    (ckpt / LEGACY_STATE).unlink()
    (ckpt / COMPLETE).unlink(missing_ok=True)
    write_manifest(ckpt)
    _write_synced(ckpt / COMPLETE, ckpt.name)


def _load_legacy(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has no trainer state ({JSON_FILE} or {LEGACY_STATE})")
    try:
        with torch.serialization.safe_globals(legacy_globals()):
            return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"{path}: refused: a pickled trainer state may only hold tensors, plain containers and credo's "
            f"rollout types ({reason}); if you wrote this checkpoint yourself and trust it, convert it with "
            f"'python -m credo.train.checkpoint convert {path.parent}'") from exc


def _legacy_problem(ckpt: Path) -> str | None:
    """A pre-manifest checkpoint (accepted with a warning) is checked as far as its formats allow: the model
    config parses, the safetensors headers match the file sizes, the trainer state zip's CRCs hold."""
    for rel in ("model/config.json", LEGACY_STATE):
        if not (ckpt / rel).is_file() or (ckpt / rel).stat().st_size == 0:
            return f"{ckpt / rel} is missing or empty"
    try:
        json.loads((ckpt / "model" / "config.json").read_text())
    except (OSError, ValueError):
        return f"{ckpt / 'model' / 'config.json'} is damaged"
    try:
        with zipfile.ZipFile(ckpt / LEGACY_STATE) as archive:
            if archive.testzip() is not None:
                return f"{ckpt / LEGACY_STATE} is damaged (CRC mismatch)"
    except (OSError, zipfile.BadZipFile, EOFError):
        return f"{ckpt / LEGACY_STATE} is damaged (not a complete zip archive)"
    for weights in sorted((ckpt / "model").glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt") as f:
                f.keys()
        except Exception:  # safetensors' own error type: a damaged header or a truncated file
            return f"{weights} is damaged (truncated or bad header)"
    log.warning("checkpoint %s has no %s (written by an older credo): its weights are not checksummed", ckpt,
                MANIFEST)
    return None


def _candidates(root: Path) -> list[Path]:
    """Checkpoint directories of ``root`` to try, best first: the ``latest`` pointer's, then newest first.
    Symlinks and names that are not ``step_NNNNNN`` directly under ``root`` are refused."""
    if not root.is_dir():
        return []
    out = []
    pointer = root / "latest"
    if pointer.is_symlink():
        log.warning("ignoring %s: a symlink, not a checkpoint pointer written by credo", pointer)
    elif pointer.is_file():
        name = pointer.read_text(errors="replace").strip()
        if STEP_NAME.fullmatch(name):
            out.append(root / name)
        else:
            log.warning("ignoring %s: it names %r, not a checkpoint directory of this run", pointer, name[:200])
    out += sorted((p for p in root.glob("step_*") if STEP_NAME.fullmatch(p.name)), key=_step, reverse=True)
    seen, safe = set(), []
    for cand in out:
        if cand.name in seen:
            continue
        seen.add(cand.name)
        if cand.is_symlink() or not cand.is_dir():
            if cand.is_symlink():
                log.warning("ignoring checkpoint %s: a symlink (it may lead outside the run directory)", cand)
            continue
        safe.append(cand)
    return safe


def _step(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[-1])


def _files(ckpt: Path) -> list[str]:
    """Relative POSIX paths of the regular files under ``ckpt`` (not the manifest and marker); symlinks count as
    files so that verification flags them (their checksum is never taken through the link)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(ckpt):
        rel_dir = Path(dirpath).relative_to(ckpt)
        out += [(rel_dir / d).as_posix() for d in dirnames if (Path(dirpath) / d).is_symlink()]
        out += [(rel_dir / f).as_posix() for f in filenames]
    return sorted(p for p in out if p not in (MANIFEST, COMPLETE))


def _sha256(path: Path) -> str:
    if path.is_symlink():
        return "symlink"
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _prune(root: Path, keep: int) -> None:
    complete = sorted(p for p in root.glob("step_*") if (p / COMPLETE).is_file() and not p.is_symlink())
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    remove_stale_temps(root.parent, keep_pid=os.getpid())


def _write_synced(path: Path, text: str) -> None:
    """Write and fsync ``path``, refusing a link in its place (credo.tracking.rundir.open_nofollow)."""
    with open_nofollow(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` through a temporary file of an unpredictable name (no link can be planted there)."""
    atomic_write_text(path, text)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


if __name__ == "__main__":  # python -m credo.train.checkpoint convert CKPT [CKPT ...]
    if len(sys.argv) < 3 or sys.argv[1] != "convert":
        sys.exit("usage: python -m credo.train.checkpoint convert RUN_DIR/checkpoints/step_N [...]")
    for arg in sys.argv[2:]:
        convert_legacy(Path(arg))
        print(f"converted {arg}")
