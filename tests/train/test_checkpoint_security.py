"""Issue 17 items 3, 9, 10, 11: trainer state that cannot run code, verified checkpoints with fallback, run
directories that never mix two runs, bit-exact resume with rollout correction."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from credo.cli.main import main
from credo.train import checkpoint as ck
from credo.train.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from credo.tracking.metrics import read_metrics
from credo.types import Rollouts
from tests.conftest import TINY_RUN

REPO = Path(__file__).resolve().parents[2]
RUN = [*TINY_RUN, "train.steps=2", "checkpoint.every=1", "checkpoint.keep=3", "eval.every=0", "log.report=false",
       "log.tensorboard=false"]
VOLATILE = ("timing_s/", "perf/tokens_per_s", "perf/gen_tokens_per_s")


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


class _CreatesFile:
    """Unpickling this calls ``open(path, "w")``: the file appearing means the pickle ran code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _run(tmp_path: Path, name: str = "run", *extra: str) -> Path:
    run = tmp_path / name
    assert main(["-q", "train", "--run-dir", str(run), *RUN, *extra]) == 0
    return run


def _as_legacy(ckpt: Path, state) -> None:
    """Turn a checkpoint into one written before this change: a pickled trainer_state.pt, no manifest."""
    for name in ("trainer_state.json", "trainer_state.safetensors", "MANIFEST.json"):
        (ckpt / name).unlink(missing_ok=True)  # (the old code wrote none of them)
    torch.save(state, ckpt / "trainer_state.pt")


# ---------------------------------------------------------------- item 3: no code execution on --resume

def test_resume_refuses_a_pickle_that_runs_code(tmp_path: Path, capsys):
    run = _run(tmp_path)
    ckpt = run / "checkpoints" / "step_000002"
    marker = tmp_path / "pwned"
    _as_legacy(ckpt, {"run": _CreatesFile(marker)})
    try:
        load_trainer_state(ckpt)
        refusal = None
    except ValueError as exc:  # ck.CheckpointError
        refusal = str(exc)
    assert not marker.exists(), "unpickling the trainer state executed code"
    assert refusal is not None and "refused" in refusal
    assert main(["-q", "train", "--resume", str(run)]) == 1
    err = capsys.readouterr().err
    assert "refused" in err and "python -m credo.train.checkpoint convert" in err
    assert not marker.exists(), "unpickling the trainer state executed code"


def test_trainer_state_is_json_and_safetensors_without_pickle(tmp_path: Path):
    run = _run(tmp_path)
    ckpt = run / "checkpoints" / "step_000002"
    assert not (ckpt / "trainer_state.pt").exists()
    doc = json.loads((ckpt / "trainer_state.json").read_text())
    assert doc["format"] == "credo-trainer-state/1" and doc["state"]["run"]["step"] == 2
    state = load_trainer_state(ckpt)
    assert state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)  # a tuple again
    assert isinstance(next(iter(state["optimizer"]["state"])), int)  # parameter indices stay ints
    assert state["rng"]["torch"].dtype == torch.uint8


def test_unknown_dataclass_in_state_json_is_refused(tmp_path: Path):
    run = _run(tmp_path)
    ckpt = run / "checkpoints" / "step_000002"
    path = ckpt / "trainer_state.json"
    doc = json.loads(path.read_text())
    doc["state"]["run"] = {"$type": "dataclass", "name": "Popen", "fields": {"args": ["touch", "x"]}}
    path.write_text(json.dumps(doc))
    with pytest.raises(ck.CheckpointError, match="not allowed"):
        load_trainer_state(ckpt)


def test_legacy_pickled_checkpoint_with_pending_rollouts_still_resumes(tmp_path: Path):
    # a one-step-off run saves the batch in flight (credo dataclasses) and numpy's RNG key (an ndarray): the
    # allow-list of weights_only loading covers both, so a run written before this change resumes to the same rows
    import shutil

    full = _run(tmp_path, "full", "rollout.one_step_off=true", "train.steps=3")
    run = tmp_path / "legacy"
    shutil.copytree(full, run)
    shutil.rmtree(run / "checkpoints" / "step_000003")
    (run / "checkpoints" / "latest").write_text("step_000002")
    ckpt = run / "checkpoints" / "step_000002"
    state = load_trainer_state(ckpt)
    assert state["pending_rollouts"] is not None  # step 3's batch, generated while step 2 trained
    # such a file names the rollouts' class where it was then defined, credo.collect.group (now credo.types)
    import credo.collect.group as old_home

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Rollouts, "__module__", "credo.collect.group")
        mp.setattr(old_home, "Rollouts", Rollouts, raising=False)
        _as_legacy(ckpt, state)
    assert b"credo.collect.group" in (ckpt / "trainer_state.pt").read_bytes()
    assert load_trainer_state(ckpt)["pending_rollouts"] == state["pending_rollouts"]
    assert main(["-q", "train", "--resume", str(run)]) == 0
    assert _stable(read_metrics(run / "metrics.jsonl")) == _stable(read_metrics(full / "metrics.jsonl"))


def test_convert_rewrites_a_trusted_legacy_checkpoint(tmp_path: Path):
    run = _run(tmp_path)
    ckpt = run / "checkpoints" / "step_000002"
    state = load_trainer_state(ckpt)
    _as_legacy(ckpt, state)
    out = subprocess.run([sys.executable, "-m", "credo.train.checkpoint", "convert", str(ckpt)], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not (ckpt / "trainer_state.pt").exists() and ck.checkpoint_problem(ckpt) is None
    assert load_trainer_state(ckpt)["run"] == state["run"]


# ---------------------------------------------------------------- item 9: damaged checkpoints, the latest pointer

def _damage(ckpt: Path, kind: str) -> str:
    """Damage ``ckpt`` one way; returns the file the warning must name."""
    weights, state = ckpt / "model" / "model.safetensors", ckpt / "trainer_state.json"
    if kind == "weights_deleted":
        weights.unlink()
        return str(weights)
    if kind == "weights_truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return str(weights)
    if kind == "weights_bit_flip":  # same size, one byte of a tensor changed
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0x01
        weights.write_bytes(bytes(data))
        return str(weights)
    if kind == "state_truncated":
        state.write_text(state.read_text()[: state.stat().st_size // 2])
        return str(state)
    if kind == "config_corrupt":
        (ckpt / "model" / "config.json").write_text("{not json")
        return str(ckpt / "model" / "config.json")
    if kind == "tokenizer_missing":
        (ckpt / "model" / "tokenizer.json").unlink()
        return str(ckpt / "model" / "tokenizer.json")
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["weights_deleted", "weights_truncated", "weights_bit_flip", "state_truncated",
                                  "config_corrupt", "tokenizer_missing"])
def test_damaged_latest_checkpoint_falls_back_to_the_newest_intact(tmp_path: Path, tiny_model, caplog, kind):
    model, tok = tiny_model
    run = tmp_path / "run"
    good = save_checkpoint(run, 1, model=model, tokenizer=tok, keep=3, trainer_state={"step": 1})
    bad = save_checkpoint(run, 2, model=model, tokenizer=tok, keep=3, trainer_state={"step": 2})
    assert latest_checkpoint(run) == bad
    named = _damage(bad, kind)
    with caplog.at_level(logging.WARNING, logger="credo.train.checkpoint"):
        assert latest_checkpoint(run) == good
    assert named in caplog.text and "skipping checkpoint step_000002" in caplog.text
    assert ck.resume_checkpoint(run) == good
    assert (run / "checkpoints" / "damaged-step_000002").is_dir() and not bad.exists()  # set aside, not pruned


def test_an_intact_checkpoint_newer_than_the_pointer_is_not_set_aside(tmp_path: Path, tiny_model):
    """A kill after step 2's directory was renamed into place but before ``latest`` moved: step 2 is intact, so
    a resume must not rename it ``damaged-step_000002`` (it did: every complete newer one was moved aside)."""
    model, tok = tiny_model
    run = tmp_path / "run"
    save_checkpoint(run, 1, model=model, tokenizer=tok, keep=3, trainer_state={"step": 1})
    newer = save_checkpoint(run, 2, model=model, tokenizer=tok, keep=3, trainer_state={"step": 2})
    (run / "checkpoints" / "latest").write_text("step_000001")  # the pointer still names the older one
    ck.resume_checkpoint(run)
    assert newer.is_dir() and not (run / "checkpoints" / "damaged-step_000002").exists()
    assert ck.checkpoint_problem(newer) is None


def test_resume_skips_a_damaged_checkpoint_and_matches_the_uninterrupted_run(tmp_path: Path, caplog):
    full = _run(tmp_path, "full", "train.steps=3")
    run = tmp_path / "cut"
    assert main(["-q", "train", "--run-dir", str(run), *RUN, "train.steps=2"]) == 0
    _damage(run / "checkpoints" / "step_000002", "tokenizer_missing")
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "train", "--resume", str(run), "train.steps=3"]) == 0
    assert "tokenizer.json is missing" in caplog.text
    # resumed from step 1: rows 2 and 3 are written again, as the uninterrupted run wrote them
    assert _stable(read_metrics(run / "metrics.jsonl")) == _stable(read_metrics(full / "metrics.jsonl"))


@pytest.mark.parametrize("target", ["../../etc", "/etc", "step_000001/../../..", "symlink"])
def test_latest_pointer_never_leads_outside_the_run(tmp_path: Path, tiny_model, caplog, target):
    model, tok = tiny_model
    run = tmp_path / "a" / "run"
    good = save_checkpoint(run, 1, model=model, tokenizer=tok, keep=3, trainer_state={"step": 1})
    outside = save_checkpoint(tmp_path / "other", 7, model=model, tokenizer=tok, keep=3, trainer_state={"step": 7})
    pointer = run / "checkpoints" / "latest"
    pointer.unlink()
    if target == "symlink":
        pointer.symlink_to(outside)
    else:
        pointer.write_text(target)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "COMPLETE").write_text("x")  # what "../../etc" names: made to look complete
    with caplog.at_level(logging.WARNING, logger="credo.train.checkpoint"):
        assert latest_checkpoint(run) == good
    assert "ignoring" in caplog.text


def test_symlinked_step_directory_is_refused(tmp_path: Path, tiny_model):
    model, tok = tiny_model
    run = tmp_path / "run"
    outside = save_checkpoint(tmp_path / "other", 7, model=model, tokenizer=tok, keep=3, trainer_state={"step": 7})
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_000007").symlink_to(outside)
    assert latest_checkpoint(run) is None


def test_manifest_lists_every_file_with_its_checksum(tmp_path: Path, tiny_model):
    import hashlib

    model, tok = tiny_model
    ckpt = save_checkpoint(tmp_path, 3, model=model, tokenizer=tok, keep=3, trainer_state={"step": 3})
    files = json.loads((ckpt / "MANIFEST.json").read_text())["files"]
    on_disk = sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file())
    assert sorted(files) == [p for p in on_disk if p not in ("MANIFEST.json", "COMPLETE")]
    for rel, entry in files.items():
        assert entry["sha256"] == hashlib.sha256((ckpt / rel).read_bytes()).hexdigest()
    (ckpt / "model" / "extra.py").write_text("print('hi')\n")  # an unlisted file makes the checkpoint suspect
    assert "not in MANIFEST.json" in ck.checkpoint_problem(ckpt)


def test_legacy_checkpoint_without_manifest_is_accepted_with_a_warning(tmp_path: Path, tiny_model, caplog):
    model, tok = tiny_model
    ckpt = save_checkpoint(tmp_path, 1, model=model, tokenizer=tok, keep=3, trainer_state={"step": 1})
    _as_legacy(ckpt, {"step": 1})
    with caplog.at_level(logging.WARNING, logger="credo.train.checkpoint"):
        assert latest_checkpoint(tmp_path) == ckpt
    assert "has no MANIFEST.json" in caplog.text
    assert load_trainer_state(ckpt) == {"step": 1}
    pt = ckpt / "trainer_state.pt"
    pt.write_bytes(pt.read_bytes()[:-40])  # a truncated legacy trainer state is still caught
    assert latest_checkpoint(tmp_path) is None


# ---------------------------------------------------------------- item 10: a reused run directory

def test_new_run_refuses_a_non_empty_run_directory(tmp_path: Path, capsys, monkeypatch):
    import credo.recipes.rlvr as rlvr

    run = tmp_path / "run"
    real = rlvr.rl_step

    def crashes(cfg, parts, state, *, step):
        raise KeyboardInterrupt

    monkeypatch.setattr(rlvr, "rl_step", crashes)  # killed before the first checkpoint: step 0 and warm start logged
    assert main(["-q", "train", "--run-dir", str(run), *RUN]) == 130
    monkeypatch.setattr(rlvr, "rl_step", real)
    assert not (run / "checkpoints").exists() and len(read_metrics(run / "metrics.jsonl")) == 1
    capsys.readouterr()
    assert main(["-q", "train", "--run-dir", str(run), *RUN]) == 1
    err = capsys.readouterr().err
    assert "is not empty" in err and "--resume" in err and "--overwrite" in err
    assert main(["-q", "train", "--run-dir", str(run), *RUN, "--overwrite"]) == 0
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2]  # one run's rows only
    warm = read_metrics(run / "warm_start.jsonl")
    assert [r["step"] for r in warm] == [1, 2, 3]  # warm_start.steps=3, logged once


def test_sft_refuses_a_reused_directory_and_overwrite_replaces_it(tmp_path: Path, capsys):
    args = [*TINY_RUN, "warm_start.steps=2", "log.report=false", "log.tensorboard=false"]
    run = tmp_path / "sft"
    assert main(["-q", "sft", "--run-dir", str(run), *args]) == 0
    assert main(["-q", "sft", "--run-dir", str(run), *args]) == 1
    assert "is not empty" in capsys.readouterr().err
    assert main(["-q", "sft", "--run-dir", str(run), *args, "--overwrite"]) == 0
    assert [r["step"] for r in read_metrics(run / "warm_start.jsonl")] == [1, 2]


def test_overwrite_refuses_a_directory_that_is_not_a_credo_run(tmp_path: Path, capsys):
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    assert main(["-q", "train", "--run-dir", str(precious), *RUN, "--overwrite"]) == 1
    assert "not a credo run directory" in capsys.readouterr().err
    assert (precious / "notes.txt").read_text() == "keep me"


# ---------------------------------------------------------------- item 11: bit-exact resume with rollout correction

def test_mkl_reproducibility_mode_is_set_at_import_and_respects_the_user():
    code = "import credo, os; print(os.environ.get('MKL_CBWR'))"
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "AUTO"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO),
                         "MKL_CBWR": "AVX2"}, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "AVX2"
