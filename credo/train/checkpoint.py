"""Atomic checkpoints that really resume.

Layout of ``RUN_DIR/checkpoints/``::

    step_000040/            complete checkpoint
        model/              Hugging Face directory (config.json, model.safetensors, tokenizer files)
        critic/             value model (backbone + value_head.safetensors), when a critic is trained
        trainer_state.pt    step, optimizer, scheduler, RNG states, data position, engine RNG, counters
        COMPLETE            marker written last
    latest                  text file naming the newest complete checkpoint

A checkpoint is written into ``.tmp-step_...`` and renamed into place only when complete, and the
``latest`` pointer is replaced atomically afterwards, so a kill at any moment leaves the previous
checkpoint usable. :func:`latest_checkpoint` ignores incomplete directories.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from credo.models import save_model

CKPT_DIR = "checkpoints"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: Path, step: int, *, model, tokenizer, trainer_state: dict[str, Any], keep: int,
                    critic=None) -> Path:
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    save_model(model, tokenizer, tmp / "model")
    if critic is not None:
        critic.save(tmp / "critic")
    torch.save(trainer_state, tmp / "trainer_state.pt")
    _write_synced(tmp / "COMPLETE", name)
    final = root / name
    if final.exists():  # re-saving the same step (e.g. after a resume): move the old one aside first
        old = root / f".old-{name}-{os.getpid()}"
        final.rename(old)
        shutil.rmtree(old)
    tmp.rename(final)
    _fsync_dir(root)
    _write_atomic(root / "latest", name)
    _prune(root, keep)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """Newest complete checkpoint of a run, or None."""
    root = Path(run_dir) / CKPT_DIR
    pointer = root / "latest"
    if pointer.is_file():
        cand = root / pointer.read_text().strip()
        if (cand / "COMPLETE").is_file():
            return cand
    complete = sorted(p for p in root.glob("step_*") if (p / "COMPLETE").is_file()) if root.is_dir() else []
    return complete[-1] if complete else None


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(Path(ckpt) / "trainer_state.pt", weights_only=False)


def _prune(root: Path, keep: int) -> None:
    complete = sorted(p for p in root.glob("step_*") if (p / "COMPLETE").is_file())
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    _write_synced(tmp, text)
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
