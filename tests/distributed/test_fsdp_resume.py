"""Resuming a ``distributed.strategy=fsdp2`` run from checkpoints holding the sharded model and optimizer state
(torch.distributed.checkpoint, credo/train/dcp_checkpoint.py): the kill-and-resume of a 2-rank torchrun run (gloo
on the CPU) logs the uninterrupted run's metrics rows on both ranks and ends with its final weights bit for bit;
resumed on 3 ranks the state is resharded and the run continues at the same global position (the same rollouts
and rewards, float rounding of the 3-way reduction aside); the DCP round trip 2 ranks -> 3 ranks restores the
weights and AdamW moments exactly; DCP's pickled metadata is read with an allow-list (docs/distributed.md,
"Resuming an FSDP2 run").

The "kill" is tests/distributed/stop_at_step.py: ``credo train`` with RL step ``CREDO_TEST_STOP_AT`` interrupted by
a KeyboardInterrupt on every rank (as tests/conftest.py's ``full_and_resumed_runs`` does in one process)."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.distributed.stop_at_step import TINY_MODEL, rows as _rows

REPO = Path(__file__).resolve().parents[2]
STOP_AT_STEP = Path(__file__).with_name("stop_at_step.py")  # credo train, interrupted at a step
# what each rank measures on its own rows (its share of the update): differs with the number of ranks
PER_RANK = ("actor/entropy", "actor/first_ratio_dev", "actor/skipped_rows_frac", "rollout/logprob_abs_diff")


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(next((run / "final").glob("*.safetensors")))


def _full_and_cut(tmp_path: Path, extra: tuple[str, ...] = ()) -> tuple[list[str], dict, Path]:
    """The uninterrupted 4-step FSDP2 run on 2 ranks (``full``) and the same run killed at the start of RL step 2
    (``cut``, its step-2 checkpoint checked); returns ``(torchrun command, env, cut run dir)``."""
    credo, torchrun = shutil.which("credo"), shutil.which("torchrun")
    if credo is None or torchrun is None:
        pytest.skip("the credo / torchrun console scripts are not on PATH")
    common = ["train.steps=4", "train.prompts_per_step=8", "rollout.group_size=4", "eval.every=2", "eval.size=8",
              "checkpoint.every=1", "checkpoint.keep=2", "log.report=false", "log.tensorboard=false",
              "log.progress=false", "train.threads=1", f"output_dir={tmp_path}", *TINY_MODEL,
              "reward.name=tests.reward_fixtures:length_score", "distributed.backend=torchrun",
              "distributed.rollout=replicate", "distributed.strategy=fsdp2", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    two = [torchrun, "--standalone", "--nproc-per-node", "2"]  # a free port: other tests run torchrun at once
    full = _run([*two, "--no-python", credo, "train", *common, "run_name=full"], env)
    assert full.returncode == 0, full.stderr[-3000:]
    cut = _run([*two, "--no-python", sys.executable, str(STOP_AT_STEP), "train", *common, "run_name=cut"],
               {**env, "CREDO_TEST_STOP_AT": "2"})
    assert cut.returncode != 0 and ("KeyboardInterrupt" in cut.stderr or "interrupted" in cut.stderr), \
        cut.stderr[-3000:]
    ckpt = tmp_path / "cut" / "checkpoints" / "step_000002"
    shards = sorted(p.name for p in (ckpt / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp", "sharded.json"]  # both ranks' shards, in rank 0's
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())["files"]
    assert {f"dcp/{s}" for s in shards} <= manifest.keys()  # checksummed with the rest
    assert list((ckpt / "model").glob("*.safetensors"))  # the whole weights (or adapter) stay (eval, export)
    assert json.loads((ckpt / "trainer_state.json").read_text())["state"]["optimizer"] == {"sharded": "dcp"}
    assert len(_rows(tmp_path / "cut" / "metrics.jsonl")) == 3  # steps 0-2, then the kill
    return [torchrun, "--standalone", "--no-python", credo, "train", "--resume", str(tmp_path / "cut")], env, \
        tmp_path / "cut"


def test_fsdp2_run_killed_and_resumed_matches_the_uninterrupted_run(tmp_path):
    _killed_and_resumed(tmp_path)


@pytest.mark.slow  # 3 torchrun runs: 50-60 s on 2 shared cores
def test_fsdp2_lora_run_killed_and_resumed_matches_the_uninterrupted_run(tmp_path):
    """model.lora under FSDP2: the frozen base stays out of dcp/ (it comes with the adapter's base), the adapters
    and their AdamW state resume exactly."""
    _killed_and_resumed(tmp_path, ("model.lora.r=4", "model.lora.alpha=8", "train.lr=3e-3"))
    metadata = tmp_path / "cut" / "checkpoints" / "step_000004" / "dcp" / ".metadata"
    from credo.train.dcp_checkpoint import _MetadataUnpickler

    with open(metadata, "rb") as f:
        keys = set(_MetadataUnpickler(f).load().state_dict_metadata)
    assert keys and all("lora_" in k for k in keys if k.startswith(("model.", "optim.state.")))


def _killed_and_resumed(tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
    resume, env, cut = _full_and_cut(tmp_path, extra)
    resumed = _run([*resume[:2], "--nproc-per-node", "2", *resume[2:]], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for rel in ("metrics.jsonl", "rank1/metrics.jsonl"):
        want, got = _rows(tmp_path / "full" / rel), _rows(cut / rel)
        assert [r["step"] for r in want] == [0, 1, 2, 3, 4]
        assert any(r.get("actor/grad_norm", 0) > 0 for r in want[3:])  # the resumed steps moved the weights
        assert got == want, rel
    w_full, w_cut = _weights(tmp_path / "full"), _weights(cut)
    assert w_full.keys() == w_cut.keys()
    for name in w_full:
        torch.testing.assert_close(w_cut[name], w_full[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow  # 3 torchrun runs, one on 3 ranks: 60-90 s on 2 shared cores
def test_fsdp2_run_resumed_on_3_ranks_continues_from_the_same_state_and_position(tmp_path):
    """The 2-rank checkpoint on 3 ranks: resharded; the run continues from the same global position with the
    same model and optimizer state (the same rollouts and rewards), the 3-way reduction rounding aside."""
    resume, env, cut = _full_and_cut(tmp_path)
    three = _run([*resume[:2], "--nproc-per-node", "3", *resume[2:]], env)
    assert three.returncode == 0, three.stderr[-3000:]
    assert "written by 2 ranks, on 3" in three.stderr, three.stderr[-3000:]
    want = _rows(tmp_path / "full" / "metrics.jsonl")
    for rel in ("metrics.jsonl", "rank1/metrics.jsonl", "rank2/metrics.jsonl"):
        got = {r["step"]: r for r in _rows(cut / rel)}
        assert sorted(got) == ([3, 4] if rel.startswith("rank2") else [0, 1, 2, 3, 4]), rel
        for w in want[3:]:  # the same rollouts (rank 0's engine state, exactly carried weights): same rewards
            g = got[w["step"]]
            assert g["reward/mean"] == w["reward/mean"] and g["response_length/mean"] == w["response_length/mean"]
            assert g["actor/grad_norm"] == pytest.approx(w["actor/grad_norm"], rel=1e-5), rel
            assert g["actor/pg_loss"] == pytest.approx(w["actor/pg_loss"], rel=1e-5, abs=1e-7), rel
            assert {k for k in w if k not in PER_RANK} == {k for k in g if k not in PER_RANK}
    w_full, w3 = _weights(tmp_path / "full"), _weights(cut)
    for name in w_full:  # the 3-way reduction rounds differently
        torch.testing.assert_close(w3[name], w_full[name], rtol=0, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------- the DCP round trip, unit level

class _Toy(torch.nn.Module):
    """A small decoder-shaped model (embedding, ``base_model.layers``, head): what credo's FSDP2 sharding needs,
    without transformers' import time in every spawned rank."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 20)
        self.base_model = torch.nn.Module()
        self.base_model.layers = torch.nn.ModuleList(torch.nn.Linear(20, 20) for _ in range(3))
        self.head = torch.nn.Linear(20, 50, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.base_model.layers:
            h = torch.tanh(layer(h))
        return self.head(h)


def _step(root, optimizer) -> None:
    x = torch.arange(24).reshape(2, 12) % 50
    root(lambda p, ids: p(ids).float().pow(2).mean(), x).backward()
    optimizer.step()
    optimizer.zero_grad()


def _full_moments(optimizer, model) -> dict[str, torch.Tensor]:
    """exp_avg / exp_avg_sq of every parameter, gathered whole, by parameter name."""
    from torch.distributed.tensor import DTensor

    whole = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
    out = {}
    for name, p in model.named_parameters():
        for key in ("exp_avg", "exp_avg_sq") if p.requires_grad else ():
            out[f"{name}.{key}"] = whole(optimizer.state[p][key]).clone()
    return out


def _dcp_worker(rank: int, world: int, init_file: str, folder: str, phase: str) -> None:
    import torch.distributed as dist

    from credo.train.dcp_checkpoint import load_sharded, save_sharded
    from credo.train.fsdp import full_state_dict, shard_policy
    from credo.train.optim import build_optimizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = _Toy()
        model.base_model.layers[0].requires_grad_(False)  # frozen (as a LoRA base): not in the checkpoint
        if phase == "load":  # other trainable weights: they must come from the checkpoint
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0 if p.requires_grad else 0.0)
        root = shard_policy(model, world)
        optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.1)
        if phase == "save":
            _step(root, optimizer)
            _step(root, optimizer)
            save_sharded(Path(folder), model, optimizer, world)
        else:
            load_sharded(Path(folder), model, optimizer)
        state = {"weights": full_state_dict(model), "moments": _full_moments(optimizer, model),
                 "step": float(optimizer.state[next(model.parameters())]["step"]),
                 "lr": optimizer.param_groups[0]["lr"]}
        _step(root, optimizer)
        state["next"] = full_state_dict(model)
        if rank == 0:
            torch.save(state, Path(folder).parent / f"{phase}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world: int, folder: Path, phase: str) -> dict:
    import torch.multiprocessing as mp

    init = folder.parent / f"init-{phase}"
    mp.start_processes(_dcp_worker, args=(world, str(init), str(folder), phase), nprocs=world, join=True,
                       start_method="spawn")
    return torch.load(folder.parent / f"{phase}.pt")


def test_dcp_round_trip_reshards_2_ranks_onto_3_exactly(tmp_path):
    """Weights and AdamW moments saved by 2 FSDP2 ranks load on 3 ranks bit for bit (into a model whose weights
    were moved and an optimizer that never stepped), and the next step agrees with the one the savers took. A
    frozen layer (a LoRA base) is left out of the checkpoint."""
    from credo.train.dcp_checkpoint import INFO, _MetadataUnpickler, saved_world_size

    folder = tmp_path / "dcp"
    saved = _spawn(2, folder, "save")
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", INFO]
    assert saved_world_size(folder) == 2
    with open(folder / ".metadata", "rb") as f:  # the real metadata passes the allow-list
        metadata = _MetadataUnpickler(f).load()
    assert type(metadata).__name__ == "Metadata"
    keys = set(metadata.state_dict_metadata)
    assert "model.base_model.layers.1.weight" in keys and "optim.state.base_model.layers.1.weight.exp_avg" in keys
    assert not [k for k in keys if "layers.0." in k]  # the frozen layer
    loaded = _spawn(3, folder, "load")
    assert loaded["step"] == saved["step"] == 2.0 and loaded["lr"] == saved["lr"]
    for kind in ("weights", "moments"):
        assert loaded[kind].keys() == saved[kind].keys()
        assert any(v.abs().max() > 0 for v in saved["moments"].values())
        for name, value in saved[kind].items():
            torch.testing.assert_close(loaded[kind][name], value, rtol=0, atol=0, msg=name)
    for name, value in saved["next"].items():  # 3-way instead of 2-way gradient reduction: rounding only
        assert torch.equal(value, saved["weights"][name]) == ("layers.0." in name)
        torch.testing.assert_close(loaded["next"][name], value, rtol=0, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------- agreeing on the checkpoint

def _fake_checkpoint(root: Path, step: int, written: int | None) -> None:
    """An intact checkpoint as far as checkpoint_problem can tell; ``written``: its dcp/sharded.json (None: none)."""
    from credo.train.checkpoint import COMPLETE, write_manifest

    ckpt = root / "checkpoints" / f"step_{step:06d}"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "config.json").write_text("{}")
    if written is not None:
        (ckpt / "dcp").mkdir()
        (ckpt / "dcp" / "sharded.json").write_text(json.dumps({"format": "credo-dcp/1", "world_size": written}))
    write_manifest(ckpt)
    (ckpt / COMPLETE).write_text(ckpt.name)
    (root / "checkpoints" / "latest").write_text(ckpt.name)


def _agree_worker(rank: int, init_file: str, runs: list[str], out: str) -> None:
    import torch.distributed as dist

    from credo.distributed.launch import agree_on_checkpoint
    from credo.train.checkpoint import resume_checkpoint
    from credo.train.data_parallel import DataParallel

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        got = []
        for run in runs:
            own_dir = Path(run) / (f"rank{rank}" if rank else "")
            try:
                got.append([str(p) for p in agree_on_checkpoint(DataParallel(rank, 2), own_dir,
                                                                resume_checkpoint(own_dir), sharded=True)])
            except (FileNotFoundError, ValueError) as exc:
                got.append([f"{type(exc).__name__}: {exc}"])
        Path(out, f"{rank}.json").write_text(json.dumps(got))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_fsdp2_ranks_agree_on_rank_0s_checkpoint_when_the_number_of_ranks_changed(tmp_path):
    """On 2 ranks: a checkpoint written by 3 ranks (rank 2's folder left over, rank 1 one checkpoint behind) is
    resumed by both ranks from rank 0's newest, trainer state included; one written by 2 ranks is agreed on as
    with DDP (the oldest of the newest); an FSDP2 checkpoint without dcp/ stops both ranks in one line."""
    import torch.multiprocessing as mp

    shrunk, same, old = tmp_path / "shrunk", tmp_path / "same", tmp_path / "old"
    for step in (1, 2):
        _fake_checkpoint(shrunk, step, 3)
        _fake_checkpoint(same, step, 2)
    _fake_checkpoint(shrunk / "rank1", 1, None)
    _fake_checkpoint(shrunk / "rank2", 2, None)
    _fake_checkpoint(same / "rank1", 1, None)
    _fake_checkpoint(old, 1, None)
    _fake_checkpoint(old / "rank1", 1, None)
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(_agree_worker, args=(str(out / "init"), [str(shrunk), str(same), str(old)], str(out)),
                       nprocs=2, join=True, start_method="spawn")
    r0, r1 = (json.loads((out / f"{r}.json").read_text()) for r in range(2))
    step2 = str(shrunk / "checkpoints" / "step_000002")
    assert r0[0] == r1[0] == [step2, step2]
    step1 = str(same / "checkpoints" / "step_000001")
    assert r0[1] == [step1, step1] and r1[1] == [str(same / "rank1" / "checkpoints" / "step_000001"), step1]
    for got in (r0[2], r1[2]):
        assert got[0].startswith("FileNotFoundError: cannot resume") and "holds no sharded model" in got[0], got


# ---------------------------------------------------------------------------- trust boundary, refusals

class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_dcp_metadata_is_unpickled_with_an_allow_list(tmp_path, monkeypatch):
    """A .metadata naming anything but DCP's metadata classes is refused before anything runs; a folder without
    credo's note is not loaded at all."""
    from credo.train.dcp_checkpoint import INFO, ShardedStateError, _reader, saved_world_size

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "dcp"
    folder.mkdir()
    with pytest.raises(ShardedStateError, match="sharded.json is missing or damaged"):
        saved_world_size(folder)
    for bad in [{"format": "credo-dcp/9", "world_size": 2}, {"format": "credo-dcp/1", "world_size": 0},
                {"format": "credo-dcp/1", "world_size": True}, {"format": "credo-dcp/1"}, [1, 2]]:
        (folder / INFO).write_text(json.dumps(bad))  # another format, no or a nonsense number of ranks
        with pytest.raises(ShardedStateError, match="sharded.json is missing or damaged"):
            saved_world_size(folder)
    (folder / INFO).write_text(json.dumps({"format": "credo-dcp/1", "world_size": 2}))
    (folder / ".metadata").write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(ShardedStateError, match="posix.system|os.system"):
        _reader(folder).read_metadata()
    assert not (tmp_path / "pwned").exists()


def test_a_checkpoint_of_the_other_strategy_is_refused_in_one_line(tmp_path):
    from credo.config import load_config
    from credo.recipes.rlvr import _sharded_optimizer

    fsdp2 = load_config(None, ["distributed.backend=torchrun", "distributed.strategy=fsdp2"])
    ddp = load_config(None, ["distributed.backend=torchrun", "distributed.strategy=ddp"])
    assert _sharded_optimizer(fsdp2, tmp_path, {"optimizer": {"sharded": "dcp"}}) == "dcp"
    assert _sharded_optimizer(ddp, tmp_path, {"optimizer": {"state": {}, "param_groups": []}}) is None
    with pytest.raises(ValueError, match="is an FSDP2 \\(sharded\\) checkpoint; resume it with the distributed"):
        _sharded_optimizer(ddp, tmp_path, {"optimizer": {"sharded": "dcp"}})
    with pytest.raises(ValueError, match="is a whole-model checkpoint"):
        _sharded_optimizer(fsdp2, tmp_path, {"optimizer": {"state": {}, "param_groups": []}})


def test_a_resharded_resume_gives_sharded_rollouts_their_own_streams():
    """On another number of ranks every rank restores rank 0's trainer state; with distributed.rollout=shard rank
    r > 0 then samples from a stream of its own (seeded by rank and step), not rank 0's; rank 0, replicated
    rollouts and a resume on the same number of ranks keep the restored stream."""
    from credo.distributed.coordinator import RolloutCoordinator
    from credo.recipes.rlvr import _reseed_resharded_engine
    from credo.rollout.hf import HFRolloutEngine  # noqa: F401  (the engine whose state layout this relies on)
    from credo.train.data_parallel import DataParallel

    cfg = SimpleNamespace(seed=3)
    restored = torch.Generator().manual_seed(99).get_state()

    class Engine:
        def __init__(self):
            self.generator = torch.Generator()
            self.generator.set_state(restored)

        def state_dict(self):
            return {"generator": self.generator.get_state()}

        def load_state_dict(self, state):
            self.generator.set_state(state["generator"])

    def after(rank: int, world: int, saved_world: int, shard: bool = True) -> torch.Tensor:
        dp = DataParallel(rank, world)
        parts = SimpleNamespace(dp=dp, engine=Engine(), rollout=RolloutCoordinator(dp, shard=shard))
        _reseed_resharded_engine(cfg, saved_world, 2, parts)
        return parts.engine.generator.get_state()

    assert torch.equal(after(0, 3, 2), restored)
    assert torch.equal(after(1, 2, 2), restored)
    assert torch.equal(after(1, 3, 2, shard=False), restored)
    r1, r2 = after(1, 3, 2), after(2, 3, 2)
    assert not torch.equal(r1, restored) and not torch.equal(r2, restored) and not torch.equal(r1, r2)
    assert torch.equal(r1, after(1, 3, 2))  # deterministic
