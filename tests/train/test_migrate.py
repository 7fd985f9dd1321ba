"""Trainer states of older credo versions upgraded by the one migration (credo.train.migrate): version 0 as commit
f61edf6 wrote it and as credo wrote it before the collector seam (053b208^, pickled, no manifest), a newer version
refused, and runs checkpointed in those layouts resumed to the rows of the uninterrupted run."""
from __future__ import annotations

import copy
import dataclasses
import json
import types

import numpy as np
import pytest
import torch

from credo.config import load_config
from credo.distributed.coordinator import RolloutCoordinator
from credo.guards import Guards
from credo.recipes.stages import COLLECTOR_KEY, build_collector
from credo.train.checkpoint import (CheckpointError, LEGACY_STATE, MANIFEST, latest_checkpoint, rng_state,
                                    write_manifest)
from credo.train.data_parallel import LOCAL
from credo.config.legacy import FORMAT_VERSION as CONFIG_VERSION
from credo.train.migrate import FORMAT_VERSION, LAYOUT, migrate_trainer_state
from credo.train.state_codec import JSON_FILE, TENSOR_FILE, load_state, save_state
from credo.types import Example, RewardResult, Rollouts, SamplingParams, Trajectory


def _traj() -> Trajectory:
    return Trajectory(example=Example("p", "a"), group_id=0, prompt_ids=[1, 2], response_ids=[3, 4],
                      rollout_logprobs=[-0.5, -0.25], response_mask=[1, 1], finish_reason="eos")


def _plain(value):
    """``value`` with tensors and numpy arrays as lists (comparable with ==)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if torch.is_tensor(value) or isinstance(value, np.ndarray):
        return ("array", value.tolist())
    return value


def _common() -> dict:
    """The parts every layout shares: optimizer, scheduler, RNG, engine."""
    return {"optimizer": {"state": {0: {"step": torch.tensor(2.0), "exp_avg": torch.ones(3)}},
                          "param_groups": [{"lr": 1e-3, "params": [0]}]},
            "scheduler": {"last_epoch": 2, "_step_count": 3}, "rng": rng_state(),
            "engine": {"generator": torch.arange(4, dtype=torch.uint8)}}


def _f61edf6_state() -> dict:
    """A trainer state as f61edf6's credo.recipes.rlvr.trainer_state wrote it (the coordinator's state first)."""
    return {"engine": _common()["engine"], "pending_rollouts": None, "async_pipeline": None,
            "run": {"step": 2, "start_eval": {"eval/greedy_acc": 0.25}, "last_eval": {"eval/greedy_acc": 0.5},
                    "wall_s": 25.2, "bad_rows": 1, "entropy_history": [0.7, 0.6]},
            **{k: v for k, v in _common().items() if k != "engine"},
            COLLECTOR_KEY: {"sampler": {"drawn": 8}}, "guards": {"trips": {"first_ratio": 1}, "checks": {}}}


def _pre_seam_state() -> dict:
    """A one-step-off AttnRL run's trainer state as credo wrote it before the collector seam (053b208^: samplers,
    replay and AttnRL's run-state field at the old places, the batch in flight without its sampling, no guards,
    no async pipeline)."""
    return {"run": {"step": 2, "start_eval": {}, "last_eval": {}, "wall_s": 3.0, "bad_rows": 0,
                    "entropy_history": [0.5], "attnrl": {"batch_size": 3}},
            **_common(), "sampler": {"drawn": 8}, "stage_samplers": [],
            "pending_rollouts": Rollouts([_traj()], [RewardResult(1.0)], {"x": 1.0}), "replay": None}


def test_a_version_0_state_as_f61edf6_wrote_it_gains_only_its_version():
    saved = _f61edf6_state()
    before = copy.deepcopy(saved)
    state = migrate_trainer_state(saved)
    assert _plain(state) == _plain(before | {"format_version": FORMAT_VERSION})
    assert _plain(saved) == _plain(before)  # the input is not modified
    assert set(state) == set(LAYOUT)
    assert _plain(migrate_trainer_state(state)) == _plain(state)  # the current version passes unchanged


def test_a_state_from_before_the_collector_seam_is_upgraded_step_by_step(tmp_path):
    run_sampling = SamplingParams(temperature=0.9, max_new_tokens=8)
    state = migrate_trainer_state(_pre_seam_state(), sampling=run_sampling)
    assert set(state) == set(LAYOUT) and state["format_version"] == FORMAT_VERSION
    assert state["run"] == {"step": 2, "start_eval": {}, "last_eval": {}, "wall_s": 3.0, "bad_rows": 0,
                            "entropy_history": [0.5]}  # AttnRL's field moved out: credo.recipes.rlvr.RunState
    assert state[COLLECTOR_KEY] == {"sampler": {"drawn": 8}, "stage_samplers": [], "replay": None,
                                    "attnrl": {"batch_size": 3}}
    assert (state["guards"], state["async_pipeline"]) == ({}, None)
    assert state["pending_rollouts"] == Rollouts([_traj()], [RewardResult(1.0)], {"x": 1.0}, sampling=run_sampling)
    assert state["optimizer"]["state"][0]["exp_avg"].tolist() == [1.0, 1.0, 1.0]
    # the readers of the current layout take it as it is: the AttnRL collector, the coordinator, the guards
    sampler = types.SimpleNamespace(drawn=0, state_dict=lambda: {"drawn": sampler.drawn},
                                    load_state_dict=lambda s: setattr(sampler, "drawn", s["drawn"]))
    tree = build_collector(load_config("attnrl"), engine=None, runner=None, model=None, tokenizer=None,
                           data=types.SimpleNamespace(stage_train=[], train=[]), sampler=sampler, run_dir=tmp_path)
    tree.load_state_dict(state[COLLECTOR_KEY])
    assert sampler.drawn == 8 and tree.state == {"batch_size": 3}
    coord = RolloutCoordinator(LOCAL, one_step_off=True, steps=3)
    coord.load_state_dict(state)
    assert coord.pending.wait().sampling == run_sampling
    Guards().load_state_dict(state["guards"])
    # the oldest layouts (before the run state counted bad rows, before stage samplers and the one-step-off mode)
    oldest = {"run": {"step": 1, "start_eval": {}, "last_eval": {}, "wall_s": 1.0}, **_common(), "sampler": {}}
    state = migrate_trainer_state(oldest)
    assert state["run"]["bad_rows"] == 0 and state["run"]["entropy_history"] == []
    assert state["pending_rollouts"] is None and state[COLLECTOR_KEY]["stage_samplers"] == []


def test_a_batch_in_flight_without_sampling_needs_the_runs():
    with pytest.raises(CheckpointError, match="needs the run's sampling"):
        migrate_trainer_state(_pre_seam_state())


@pytest.mark.parametrize("version, message", [
    (FORMAT_VERSION + 1, f"the trainer state has format_version {FORMAT_VERSION + 1}, newer than this credo's "
                         f"{FORMAT_VERSION}: resume it with the credo that wrote it (or a newer one)"),
    ("1", "the trainer state's format_version is '1', not a version number"),
    (-1, "the trainer state's format_version is -1, not a version number"),
])
def test_a_newer_or_malformed_version_is_refused_in_one_line(version, message):
    with pytest.raises(CheckpointError) as info:
        migrate_trainer_state(_f61edf6_state() | {"format_version": version})
    assert str(info.value) == message


def test_a_state_missing_a_part_of_the_layout_is_refused():
    broken = {k: v for k, v in _f61edf6_state().items() if k != "rng"}
    with pytest.raises(CheckpointError, match="lacks rng"):
        migrate_trainer_state(broken)
    with pytest.raises(CheckpointError, match="no run state"):
        migrate_trainer_state({"step": 4})


# ----------------------------------------------------------------------------- whole runs

ARGS = ["train.steps=3", "checkpoint.every=1", "eval.every=0", "log.progress=false", "log.tensorboard=false",
        "log.report=false", "rollout.one_step_off=true"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A one-step-off run uninterrupted (``full``) and interrupted at the start of its third step (``cut``: its
    latest checkpoint, step 2, holds the batch in flight)."""
    import credo.recipes.rlvr as rlvr
    from credo.cli.main import main
    from tests.conftest import TINY_RUN

    root = tmp_path_factory.mktemp("migrate")
    args = [*TINY_RUN, *ARGS]
    assert main(["-q", "train", "--run-dir", str(root / "full"), *args]) == 0
    real = rlvr.rl_step

    def interrupted(cfg, parts, state, *, step):
        if step == 2:
            raise KeyboardInterrupt
        return real(cfg, parts, state, step=step)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rlvr, "rl_step", interrupted)
        assert main(["-q", "train", "--run-dir", str(root / "cut"), *args]) != 0
    return root / "full", root / "cut"


def _rows(run):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("timing_s/", "perf/"))}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def _as_f61edf6(state: dict, ckpt) -> None:
    """f61edf6's layout: the current one without format_version."""
    save_state({k: v for k, v in state.items() if k != "format_version"}, ckpt)
    write_manifest(ckpt)


def _as_pre_seam_pickle(state: dict, ckpt) -> None:
    """The layout before the collector seam (053b208^), pickled in ``trainer_state.pt`` without a manifest as credo
    wrote it before issue 17's pickle-free format."""
    collector = state[COLLECTOR_KEY]
    old = {k: state[k] for k in ("optimizer", "scheduler", "rng", "engine")}
    old |= {"run": state["run"] | {"attnrl": {}}, "sampler": collector["sampler"], "stage_samplers": [],
            "replay": None, "pending_rollouts": dataclasses.replace(state["pending_rollouts"], sampling=None)}
    torch.save(old, ckpt / LEGACY_STATE)
    for name in (JSON_FILE, TENSOR_FILE, MANIFEST):
        (ckpt / name).unlink()


@pytest.mark.parametrize("layout", [_as_f61edf6, _as_pre_seam_pickle], ids=["f61edf6", "pre_seam_pickle"])
def test_a_run_checkpointed_in_an_old_layout_resumes_to_the_same_rows(runs, tmp_path, layout):
    """The cut run's checkpoint and config.yaml rewritten as an older credo wrote them (no format_version) resume
    to the uninterrupted run's rows; the resumed run writes the current version."""
    import shutil

    import yaml

    from credo.cli.main import main

    full, cut = runs
    run = tmp_path / "run"
    shutil.copytree(cut, run)
    ckpt = latest_checkpoint(run)
    assert ckpt.name == "step_000002"
    state = load_state(ckpt)
    assert set(state) == set(LAYOUT) and state["format_version"] == FORMAT_VERSION  # what the current code writes
    assert state["pending_rollouts"].sampling is not None  # one-step-off: the batch in flight is saved
    layout(state, ckpt)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config.pop("format_version") == CONFIG_VERSION
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["-q", "train", "--resume", str(run)]) == 0
    assert len(_rows(run)) == 4 and _rows(run) == _rows(full)
    resumed = load_state(run / "checkpoints" / "step_000003")
    assert resumed["format_version"] == FORMAT_VERSION and set(resumed) == set(LAYOUT)
    assert yaml.safe_load((run / "config.yaml").read_text())["format_version"] == CONFIG_VERSION


def test_a_checkpoint_of_a_newer_version_is_refused_at_resume(runs, tmp_path, capsys):
    import shutil

    from credo.cli.main import main

    _, cut = runs
    run = tmp_path / "run"
    shutil.copytree(cut, run)
    ckpt = latest_checkpoint(run)
    save_state(load_state(ckpt) | {"format_version": FORMAT_VERSION + 1}, ckpt)
    write_manifest(ckpt)
    capsys.readouterr()
    assert main(["-q", "train", "--resume", str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"credo: error: the trainer state has format_version {FORMAT_VERSION + 1}, newer than this "
                       f"credo's {FORMAT_VERSION}: resume it with the credo that wrote it (or a newer one)")
