"""Data-parallel updates over torch.distributed (gloo, 2 CPU processes): the loss and the gradients of a 2-rank
update equal those of a 1-rank update of the same batch, for every aggregation mode, with gradient accumulation,
uneven shards and skipped rows."""
from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from credo.algo import AGG_MODES
from credo.train.data_parallel import LOCAL, DataParallel

F64 = torch.float64
REPO = Path(__file__).resolve().parents[2]
# the CLI runs' model: tests/conftest.py's TINY sizes, a 3-step warm start (the runs compare DP with one process,
# whatever the model knows)
TINY_MODEL = ["model.hidden_size=32", "model.intermediate_size=64", "rollout.max_new_tokens=8", "warm_start.steps=3",
              "warm_start.batch_size=8", "reward.workers=1"]


def _setup():
    """The float64 model and batch, with RMSNorm in float64 so the comparison is exact (set for the whole process:
    the spawned ranks and the comparison in the test process alike)."""
    from transformers.models.qwen2 import modeling_qwen2

    from tests.train.test_forward import _group_batch, _model64, rmsnorm_in_input_dtype

    modeling_qwen2.Qwen2RMSNorm.forward = rmsnorm_in_input_dtype
    model, tok = _model64()
    batch = _group_batch(tok)  # 9 rows: rank 0 holds 5, rank 1 holds 4
    batch.advantages = torch.randn(batch.responses.shape, dtype=F64,
                                   generator=torch.Generator().manual_seed(7)) * batch.response_mask
    batch.advantages[[1, 3, 5]] = 0.0  # skipped rows, all on rank 1: it runs 1 micro-batch of 2, rank 0 runs 3
    return model, batch


def _update(model, batch, mode: str, dp: DataParallel, *, fsdp2: bool = False, overrides: tuple[str, ...] = ()):
    """One policy update with plain SGD at lr 1 and no clipping: parameters move by exactly minus the gradient.
    ``fsdp2``: the copy is sharded over the ranks first (the gradients compared are the gathered whole ones)."""
    from credo.config import load_config
    from credo.train.fsdp import full_state_dict, shard_policy
    from credo.train.optim import build_scheduler
    from credo.train.update import UpdateOptions, update_policy

    strategy = ["distributed.backend=torchrun", "distributed.strategy=fsdp2"] if fsdp2 else []
    cfg = load_config(None, [f"algo.agg={mode}", "train.micro_batch_size=2", "train.warmup_steps=0",
                             "train.grad_clip=0", *strategy, *overrides])
    m = copy.deepcopy(model)
    if fsdp2:
        shard_policy(m, dp.world_size)
    before = {k: v.clone() for k, v in full_state_dict(m).items()}
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    metrics = update_policy(UpdateOptions.of(cfg), m, batch, opt,
                            build_scheduler(opt, warmup_steps=0, total_steps=1), step=0, dp=dp)
    after = full_state_dict(m)
    grads = [before[k] - after[k] for k in before]
    return grads, metrics


def _worker(rank: int, world: int, init_file: str, out_dir: str, fsdp2: bool = False) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, batch = _setup()
        for mode in AGG_MODES:
            grads, metrics = _update(model, batch, mode, DataParallel(rank, world), fsdp2=fsdp2)
            if rank == 0:
                torch.save({"grads": grads, "metrics": metrics}, os.path.join(out_dir, f"{mode}.pt"))
        dist.barrier()  # neither rank tears gloo down while the other still talks to it (flaky SIGABRT without)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("fsdp2", [False, True], ids=["ddp", "fsdp2"])
def test_two_rank_update_equals_one_rank_for_every_aggregation_mode(fsdp2):
    """DDP arithmetic (gradient all-reduce) and FSDP2 (sharded parameters, gradients reduce-scattered in the
    backward, the ranks' backwards in lockstep: rank 1 has one micro-batch fewer) against one process."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(2, os.path.join(tmp, "init"), tmp, fsdp2), nprocs=2, join=True,
                           start_method="spawn")
        model, batch = _setup()
        for mode in AGG_MODES:
            want, want_metrics = _update(model, batch, mode, LOCAL)
            got = torch.load(os.path.join(tmp, f"{mode}.pt"))
            assert any(g.abs().max() > 0 for g in want)
            for g1, g2 in zip(got["grads"], want):
                torch.testing.assert_close(g1, g2, rtol=0, atol=1e-12, msg=mode)
            assert got["metrics"]["actor/pg_loss"] == pytest.approx(want_metrics["actor/pg_loss"], rel=1e-12, abs=1e-15)


def test_shard_splits_rows_round_robin_and_local_is_identity():
    _, batch = _setup()
    assert LOCAL.shard(batch) is batch
    a, b = DataParallel(0, 2).shard(batch), DataParallel(1, 2).shard(batch)
    assert a.batch_size == 5 and b.batch_size == 4
    torch.testing.assert_close(a.responses, batch.responses[0::2])
    torch.testing.assert_close(b.responses, batch.responses[1::2])


def _metrics(path):
    import json

    return [r for r in map(json.loads, open(path)) if "reward/mean" in r]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_torchrun_data_parallel_run_matches_the_single_process_run(tmp_path, strategy):
    """`torchrun --nproc-per-node 2 --no-python credo train ... distributed.backend=torchrun
    distributed.rollout=replicate` against the same command in one process: every rank runs the same rollouts,
    so rewards are identical; the split
    update changes only the float summation order, so losses, gradient norms and the final weights agree to float
    tolerance. Rank 1 logs under RUN_DIR/rank1 and sees the same run. With FSDP2 the rollout engine samples from
    the gathered whole weights and the checkpoints hold them."""
    import shutil
    import subprocess

    from safetensors.torch import load_file

    credo, torchrun = shutil.which("credo"), shutil.which("torchrun")
    if credo is None or torchrun is None:
        pytest.skip("the credo / torchrun console scripts are not on PATH")
    # the tiny model and a dense reward (lengths differ within a group: the updates move the weights)
    common = ["train.steps=3", "train.prompts_per_step=8", "rollout.group_size=4", "eval.every=0", "eval.size=8",
              "checkpoint.every=0", "log.report=false", "log.tensorboard=false", "log.progress=false",
              "train.threads=1", f"output_dir={tmp_path}", *TINY_MODEL, "reward.name=tests.reward_fixtures:length_score"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    single = subprocess.run([credo, "train", *common, "run_name=single"], capture_output=True, text=True, env=env)
    assert single.returncode == 0, single.stderr[-2000:]
    dp = subprocess.run([torchrun, "--nproc-per-node", "2", "--no-python", credo, "train", *common, "run_name=dp",
                         "distributed.backend=torchrun", "distributed.rollout=replicate",
                         f"distributed.strategy={strategy}"], capture_output=True, text=True, env=env)
    assert dp.returncode == 0, dp.stderr[-2000:]
    one, two, rank1 = (_metrics(tmp_path / p / "metrics.jsonl") for p in ("single", "dp", "dp/rank1"))
    assert len(one) == len(two) == len(rank1) == 3
    assert any(r.get("actor/grad_norm", 0) > 0 for r in one)  # the updates did something
    for a, b, c in zip(one, two, rank1):
        assert a["reward/mean"] == b["reward/mean"] == c["reward/mean"]
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4, abs=1e-6)
        assert b.get("actor/pg_loss", 0.0) == pytest.approx(a.get("actor/pg_loss", 0.0), abs=1e-6)
        assert b["actor/grad_norm"] == c["actor/grad_norm"]  # the ranks stepped the same summed gradient
    w1, w2 = (load_file(next((tmp_path / p / "final").glob("*.safetensors"))) for p in ("single", "dp"))
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-5, msg=name)


def test_distributed_backend_errors_are_clear(monkeypatch):
    from credo.config import load_config
    from credo.distributed.launch import init_data_parallel

    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="torchrun --nproc-per-node"):
        init_data_parallel(load_config(None, ["distributed.backend=torchrun"]))
    with pytest.raises(ValueError, match="ray_launch"):
        init_data_parallel(load_config(None, ["distributed.backend=ray"]))
    from credo.config import ConfigError

    with pytest.raises(ConfigError, match="only used with distributed.backend=ray"):
        load_config(None, ["distributed.world_size=2"])
    for bad in ("rollout:1", "trainer:0:1", "reward:0:0", "reward:x:1"):
        with pytest.raises(ConfigError, match="KIND:WORKER:CALL"):
            load_config(None, ["distributed.backend=ray", f"distributed.inject_faults=[{bad}]"])
    with pytest.raises(ConfigError, match="fsdp2: needs several ranks"):
        load_config(None, ["distributed.strategy=fsdp2"])
    cfg = load_config(None, ["distributed.backend=ray", "distributed.inject_faults=[rollout:1:4, reward:0:3]"])
    from credo.recipes.common import injected_faults

    assert injected_faults(cfg, "rollout") == {1: 4} and injected_faults(cfg, "reward") == {0: 3}
    assert init_data_parallel(load_config(None, [])) is LOCAL


def test_torchrun_sharded_rollouts_give_every_rank_the_whole_batch(tmp_path):
    """distributed.rollout=shard: each rank generates half of the prompts; after the exchange both ranks hold
    the same whole batch (same rewards, same gradient norms, every step), each generated half of it."""
    import shutil
    import subprocess

    credo, torchrun = shutil.which("credo"), shutil.which("torchrun")
    if credo is None or torchrun is None:
        pytest.skip("the credo / torchrun console scripts are not on PATH")
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", "--no-python", credo, "train", "train.steps=2",
                           "train.prompts_per_step=8", "rollout.group_size=4", "eval.every=0", "eval.size=8",
                           "checkpoint.every=0", "log.report=false", "log.tensorboard=false", "log.progress=false",
                           "train.threads=1", f"output_dir={tmp_path}", "run_name=shard", *TINY_MODEL,
                           "distributed.backend=torchrun"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r0, r1 = _metrics(tmp_path / "shard" / "metrics.jsonl"), _metrics(tmp_path / "shard" / "rank1" / "metrics.jsonl")
    assert len(r0) == len(r1) == 2
    for a, b in zip(r0, r1):
        assert a["dist/local_sequences"] == b["dist/local_sequences"] == 16  # 4 of the 8 prompts x 4 samples
        assert a["reward/mean"] == b["reward/mean"] and a["response_length/mean"] == b["response_length/mean"]
        assert a["actor/grad_norm"] == b["actor/grad_norm"]


def test_resuming_a_whole_model_checkpoint_as_fsdp2_is_refused(tmp_path):
    """A checkpoint without sharded state (written by one process or DDP) resumed with distributed.strategy=fsdp2:
    one clear error naming the strategy, not a silently wrong resume (FSDP2 runs resume from their own sharded
    checkpoints: tests/distributed/test_fsdp_resume.py)."""
    from credo.cli.main import main
    from credo.config import load_config
    from credo.recipes import rlvr
    from tests.conftest import TINY_RUN

    run = [*TINY_RUN, "train.steps=1", "eval.every=0", "log.report=false", "log.tensorboard=false"]
    assert main(["-q", "train", "--run-dir", str(tmp_path), *run]) == 0
    cfg = load_config(None, [*run, "distributed.backend=torchrun", "distributed.strategy=fsdp2"])
    with pytest.raises(ValueError, match=r"is a whole-model checkpoint; resume it with the distributed.strategy "
                                         r"that wrote it \(now fsdp2\)"):
        rlvr._train(cfg, tmp_path, True, LOCAL)
