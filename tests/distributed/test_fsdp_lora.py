"""LoRA under FSDP2 (``model.lora`` with ``distributed.strategy=fsdp2``, 2 gloo ranks through torchrun): each
decoder layer is one FSDP unit holding its frozen base weights and its trainable adapters; the engine sync and the
checkpoints gather the adapters only; rank 0 alone writes the adapter. The run equals one process's LoRA run on the
same data to float tolerance."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import TINY_RUN

REPO = Path(__file__).resolve().parents[2]
RUN = [*TINY_RUN, "model.lora.r=4", "model.lora.alpha=8", "train.lr=3e-3", "log.progress=false", "log.report=false",
       "log.tensorboard=false", "reward.name=tests.reward_fixtures:length_score", "reward.executor=inline",
       "algo.kl_coef=0.05", "train.steps=2", "checkpoint.every=1", "eval.every=0"]


def _rows(path: Path) -> list[dict]:
    return [r for r in map(json.loads, open(path)) if "reward/mean" in r]


ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _scripts() -> tuple[str, str]:
    credo, torchrun = shutil.which("credo"), shutil.which("torchrun")
    if credo is None or torchrun is None:
        pytest.skip("the credo / torchrun console scripts are not on PATH")
    return credo, torchrun


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    """One process's LoRA run (the reference of both 2-rank runs)."""
    credo, _ = _scripts()
    run = tmp_path_factory.mktemp("single")
    proc = subprocess.run([credo, "train", "--run-dir", str(run), *RUN, "--overwrite"], capture_output=True,
                          text=True, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_two_rank_lora_run_matches_the_single_process_lora_run_and_saves_only_the_adapter(tmp_path, single,
                                                                                          strategy):
    """FSDP2 (sharded base + adapters) and DDP (rank 1 once crashed saving an adapter naming a base it never
    wrote) against one process; the FSDP2 run resumed from its step-1 checkpoint gives the same rows and
    adapter."""
    credo, torchrun = _scripts()
    sharded = subprocess.run([torchrun, "--nproc-per-node", "2", "--no-python", credo, "train", "--run-dir",
                              str(tmp_path / "fsdp"), *RUN, "distributed.backend=torchrun",
                              f"distributed.strategy={strategy}", "distributed.rollout=replicate"],
                             capture_output=True, text=True, env=ENV)
    assert sharded.returncode == 0, sharded.stderr[-2000:]
    one, two, rank1 = (_rows(p / "metrics.jsonl") for p in (single, tmp_path / "fsdp", tmp_path / "fsdp/rank1"))
    assert len(one) == len(two) == len(rank1) == 2
    assert two[1]["actor/kl"] > 0.0  # the adapter moved (B starts at zero: step 0's KL is exactly 0)
    for a, b, c in zip(one, two, rank1):
        assert a["reward/mean"] == b["reward/mean"] == c["reward/mean"]  # the engine sampled the synced adapter
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4, abs=1e-6)
        assert b["actor/pg_loss"] == pytest.approx(a["actor/pg_loss"], abs=1e-6)
        assert b["actor/kl"] == pytest.approx(a["actor/kl"], rel=1e-3, abs=1e-9)
        assert b["guard/weight_sync_trips"] == 0.0
    for where in ("checkpoints/step_000002/model", "final"):
        d = tmp_path / "fsdp" / where
        assert (d / "adapter_model.safetensors").is_file() and not list(d.glob("model*.safetensors")), where
        want, got = load_file(single / where / "adapter_model.safetensors"), \
            load_file(d / "adapter_model.safetensors")
        assert got.keys() == want.keys() and all("lora_" in k for k in got)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-5, msg=k)
        assert not list((tmp_path / "fsdp" / "rank1" / where).glob("*.safetensors"))  # rank 0 writes the adapter
    if strategy == "fsdp2":  # resume from step 1 (the sharded dcp/ state) in a copy: the same rows and adapter
        cut = tmp_path / "cut"
        shutil.copytree(tmp_path / "fsdp", cut)
        for rank_dir in (cut, cut / "rank1"):
            shutil.rmtree(rank_dir / "checkpoints" / "step_000002")
            shutil.rmtree(rank_dir / "final")
        resumed = subprocess.run([torchrun, "--nproc-per-node", "2", "--no-python", credo, "train", "--resume",
                                  str(cut)], capture_output=True, text=True, env=ENV)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        keys = ("reward/mean", "actor/grad_norm", "actor/pg_loss", "actor/kl")
        assert [[r[k] for k in keys] for r in _rows(cut / "metrics.jsonl")] == [[r[k] for k in keys] for r in two]
        again, want = (load_file(d / "final" / "adapter_model.safetensors") for d in (cut, tmp_path / "fsdp"))
        assert all(torch.equal(again[k], want[k]) for k in want)
    # the trained adapter is not the initial one (a sync / save of stale adapters would still match single above
    # only if both were stale: this pins that the saved tensors moved)
    first = load_file(tmp_path / "fsdp" / "checkpoints/step_000001/model/adapter_model.safetensors")
    last = load_file(tmp_path / "fsdp" / "final" / "adapter_model.safetensors")
    assert any(not torch.equal(first[k], last[k]) for k in last)


def _sync_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Shard a LoRA'd tiny policy whose adapters moved (lora_B kicked), sync it to an engine holding the fresh
    adapters, count the tensors gathered."""
    import copy

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from credo.distributed.coordinator import RolloutCoordinator
    from credo.models import build_model
    from credo.models.lora import adapter_state, apply_lora
    from credo.rollout import HFRolloutEngine
    from credo.train.data_parallel import DataParallel
    from tests.conftest import TINY
    from tests.models.test_lora import LORA, _kick

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, tok = build_model(TINY, seed=0)
        apply_lora(model, LORA, seed=0)
        engine = HFRolloutEngine(copy.deepcopy(model), tok, seed=0)  # serves B = 0
        _kick(model, 0.05)
        want = {k: v.clone() for k, v in adapter_state(model).items()}
        coord = RolloutCoordinator(DataParallel(rank, world))
        coord.attach(model=model, engine=engine, runner=None, collector=None)
        coord.shard_policy()
        gathered = []
        full_tensor = DTensor.full_tensor
        DTensor.full_tensor = lambda self, **kw: gathered.append(self.shape) or full_tensor(self, **kw)
        coord.sync(1, force=True)
        DTensor.full_tensor = full_tensor
        if rank == 0:
            torch.save({"want": want, "served": adapter_state(engine.model), "gathered": len(gathered),
                        "params": len(model.state_dict())}, os.path.join(out_dir, "sync.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_sharded_lora_sync_gathers_the_adapters_only(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_sync_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    got = torch.load(tmp_path / "sync.pt")
    assert got["gathered"] == len(got["want"]) < got["params"]  # one gather per adapter tensor, none of the base
    assert got["served"].keys() == got["want"].keys()
    for k, v in got["want"].items():
        torch.testing.assert_close(got["served"][k], v, rtol=0, atol=0, msg=k)
    assert any(v.abs().max() > 0 for k, v in got["served"].items() if "lora_B" in k)
