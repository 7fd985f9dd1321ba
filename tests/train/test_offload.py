"""train.optimizer_offload (credo.train.offload; docs/performance.md, "Optimizer offload"): AdamW with its state and
master weights on the CPU steps exactly as the plain AdamW (bit for bit, through the real update loop, with bf16
autocast and fp16 loss scaling too); its state lives on the CPU; its state_dict round-trips and is plain AdamW's
(a checkpoint loads with or without offload); FSDP2's CPUOffloadPolicy on 2 gloo ranks equals the non-offloaded
sharded update; a tiny ``credo train`` run with offload equals the run without. On this CPU-only machine only
``device == "cpu"`` can be checked: the CUDA copies have never run."""
from __future__ import annotations

import os

import pytest
import torch

from credo.config import load_config
from credo.train.offload import OffloadedAdamW
from credo.train.optim import build_optimizer, build_scheduler
from credo.train.update import UpdateOptions, update_policy
from tests.conftest import TINY_RUN, full_and_resumed_runs
from tests.train.test_mixed_precision import _batch_with_advantages, _model


def _run(offload: bool, mode: str = "none", steps: int = 3, *, resume_at: int | None = None):
    """``steps`` updates of the tiny policy (AdamW, warm-up, clipping on); ``resume_at``: the optimizer and
    scheduler are rebuilt from their state_dicts after that many steps (a checkpoint round-trip)."""
    model, tok = _model()
    cfg = load_config(None, [f"train.mixed_precision={mode}", "train.micro_batch_size=2", "train.warmup_steps=2",
                             "algo.entropy_coef=0.01", "train.grad_clip=0.5"])
    opts = UpdateOptions.of(cfg)

    def make():
        opt = build_optimizer(model, lr=1e-2, weight_decay=0.01, betas=[0.9, 0.99], offload=offload)
        return opt, build_scheduler(opt, warmup_steps=2, total_steps=steps, schedule="cosine")

    opt, sched = make()
    norms = []
    for step in range(steps):
        if step == resume_at:
            saved = {"opt": opt.state_dict(), "sched": sched.state_dict()}
            opt, sched = make()
            opt.load_state_dict(saved["opt"])
            sched.load_state_dict(saved["sched"])
        batch = _batch_with_advantages(tok)
        norms.append(update_policy(opts, model, batch, opt, sched, step=step)["actor/grad_norm"])
    return model, opt, norms


@pytest.mark.parametrize("mode", ["none", "bf16", "fp16"])
def test_offloaded_adamw_steps_exactly_as_plain_adamw(mode):
    plain, plain_opt, n1 = _run(False, mode)
    off, off_opt, n2 = _run(True, mode)
    assert isinstance(off_opt, OffloadedAdamW) and not isinstance(plain_opt, OffloadedAdamW)
    assert n1 == n2 and all(n > 0 for n in n1)
    moved = 0
    for (name, p), q in zip(plain.named_parameters(), off.parameters()):
        assert torch.equal(p, q), name  # bit for bit
        moved += not torch.equal(p, _model()[0].get_parameter(name))
    assert moved > 0  # the steps did something
    assert off_opt.state_devices() == {"cpu"}
    # the host masters are copies (not the parameters themselves), equal to them after every step
    for p, m in zip(off.parameters(), off_opt.masters):
        assert m.data_ptr() != p.data_ptr() and torch.equal(m, p) and m.dtype == p.dtype == torch.float32
    # plain AdamW's state_dict layout: the same keys and moments
    a, b = plain_opt.state_dict(), off_opt.state_dict()
    assert a["param_groups"][0].keys() == b["param_groups"][0].keys()
    for k, s in a["state"].items():
        for name, v in s.items():
            assert torch.equal(v, b["state"][k][name]), (k, name)


def test_state_dict_round_trip_resumes_exactly_and_loads_into_either_optimizer():
    straight, _, n1 = _run(True, steps=4)
    resumed, opt, n2 = _run(True, steps=4, resume_at=2)
    assert n1 == n2
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters()))
    assert opt.state_dict()["param_groups"][0]["lr"] == opt.param_groups[0]["lr"]  # the schedule's lr is saved
    # an offloaded optimizer's state loads into plain AdamW and back
    model, _ = _model()
    plain = build_optimizer(model, lr=1e-2)
    plain.load_state_dict(opt.state_dict())
    back = build_optimizer(model, lr=1e-2, offload=True)
    back.load_state_dict(plain.state_dict())
    assert back.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    for k, s in opt.state_dict()["state"].items():
        assert all(torch.equal(v, back.state_dict()["state"][k][n]) for n, v in s.items())


def test_writes_to_the_parameters_outside_the_optimizer_reach_the_masters():
    """A fused optimizer stepping the policy before the first step (the SFT warm start) and a weight load between
    steps: the offloaded optimizer steps from the written weights, as the plain one does."""
    results = []
    for offload in (False, True):
        model, _ = _model()
        opt = build_optimizer(model, lr=1e-2, offload=offload)
        warm = build_optimizer(model, lr=1e-1)  # fused: its writes do not move the version counter
        for _ in range(2):
            model.zero_grad()
            sum(p.square().sum() for p in model.parameters()).backward()
            warm.step()
            model.zero_grad()
            sum(p.sum() for p in model.parameters()).backward()
            opt.step()
            model.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()})  # a weight load
        results.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_the_config_key_defaults_off():
    assert load_config(None, []).train.optimizer_offload is False
    assert load_config(None, ["train.optimizer_offload=true"]).train.optimizer_offload is True


def _fsdp2_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from credo.train.data_parallel import DataParallel
    from credo.train.fsdp import full_state_dict, shard_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        cfg = load_config(None, ["distributed.backend=torchrun", "distributed.strategy=fsdp2",
                                 "train.micro_batch_size=2", "train.warmup_steps=0", "train.grad_clip=0.5"])
        out = {}
        for offload in (False, True):
            model, tok = _model()
            shard_policy(model, world, offload=offload)
            opt = build_optimizer(model, lr=1e-2, weight_decay=0.01, offload=offload)
            assert type(opt) is torch.optim.AdamW  # FSDP2 offloads through its policy, not OffloadedAdamW
            sched = build_scheduler(opt, warmup_steps=0, total_steps=2)
            for step in range(2):
                update_policy(UpdateOptions.of(cfg), model, _batch_with_advantages(tok), opt, sched, step=step,
                              dp=DataParallel(rank, world))
            states = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
            devices = {(v.to_local() if isinstance(v, DTensor) else v).device.type for v in states}
            out[offload] = {"weights": full_state_dict(model), "devices": sorted(devices)}
        if rank == 0:
            torch.save(out, os.path.join(out_dir, "fsdp2.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_fsdp2_cpu_offload_policy_equals_the_sharded_update_without_it(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_fsdp2_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    got = torch.load(tmp_path / "fsdp2.pt")
    assert got[True]["devices"] == ["cpu"]
    start = _model()[0].state_dict()
    assert any(not torch.equal(v, start[k]) for k, v in got[True]["weights"].items())
    for k, v in got[False]["weights"].items():
        torch.testing.assert_close(got[True]["weights"][k], v, rtol=0, atol=1e-6, msg=k)


def test_credo_train_with_optimizer_offload_equals_the_run_without_and_resumes_exactly(tmp_path, monkeypatch):
    """Tiny bf16 runs through the CLI: with offload, uninterrupted and interrupted + resumed (the optimizer state
    through the checkpoint), give the rows of the run without offload."""
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics

    args = [*TINY_RUN, "train.steps=3", "checkpoint.every=1", "log.progress=false", "log.report=false",
            "log.tensorboard=false", "reward.name=tests.reward_fixtures:length_score", "reward.executor=inline",
            "train.mixed_precision=bf16", "eval.every=0"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "plain"), *args]) == 0
    full, cut = full_and_resumed_runs(tmp_path, monkeypatch, [*args, "train.optimizer_offload=true"], stop_at=2)
    keys = ("reward/mean", "actor/grad_norm", "actor/pg_loss", "actor/entropy")

    def rows(run):
        return [[r.get(k) for k in keys] for r in read_metrics(run / "metrics.jsonl") if "actor/grad_norm" in r]

    assert len(rows(full)) == 3 and any(r[1] > 0 for r in rows(full))
    assert rows(full) == rows(tmp_path / "plain") == rows(cut)
