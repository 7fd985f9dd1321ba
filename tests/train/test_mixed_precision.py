"""train.mixed_precision=bf16: the policy's forward computes in bfloat16 (autocast, or FSDP2's MixedPrecisionPolicy)
while its parameters, gradients and optimizer state stay float32 and its log-probs are float32; the update's
gradients are those of float32 to a measured tolerance (relative error < 5e-2 on a tiny model; 3.7e-3 to 5.4e-3
measured) and not identical to them (autocast ran); fp16 scales the loss with a GradScaler; fp16 with FSDP2 and
non-float32 weights are refused; a tiny ``credo train`` run with it
completes (docs/performance.md, "Mixed precision")."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from credo.config import ModelConfig, load_config
from credo.errors import ConfigError
from credo.models import build_model
from credo.train.forward import ForwardOptions, policy_logprobs
from tests.train.test_forward import _batch

TOL = 5e-2  # relative gradient error bf16 vs float32 allowed (measured 3.7e-3 to 5.4e-3 on this model)


def _model():
    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                      max_position_embeddings=128)
    model, tok = build_model(cfg, seed=0)
    assert next(model.parameters()).dtype == torch.float32
    return model, tok


def _batch_with_advantages(tok):
    batch = _batch(tok)
    batch.advantages = torch.randn(batch.responses.shape, generator=torch.Generator().manual_seed(7)) \
        * batch.response_mask
    return batch


def _grads(model, batch, opts):
    model.train()
    model.zero_grad()
    weights = torch.randn(batch.responses.shape, generator=torch.Generator().manual_seed(3))
    lp, ent = policy_logprobs(model, batch, temperature=0.8, with_entropy=True, opts=opts)
    assert lp.dtype == ent.dtype == torch.float32  # log-probs and entropies in float32 whatever the compute
    loss = ((lp * weights + 0.1 * ent) * batch.response_mask).sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _layer_output_dtypes(model):
    seen = []
    handle = model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    return seen, handle


@pytest.mark.parametrize("opts", [ForwardOptions(chunk_size=4), ForwardOptions(chunk_size=0),
                                  ForwardOptions(chunk_size=3, pack=True, row_tokens=16)],
                         ids=["padded", "logits", "packed"])
def test_bf16_gradients_are_close_to_float32_and_not_identical(opts):
    model, tok = _model()
    batch = _batch(tok)
    loss32, g32 = _grads(model, batch, opts)
    seen, handle = _layer_output_dtypes(model)
    loss16, g16 = _grads(model, batch, ForwardOptions(**{**opts.__dict__, "autocast": "bf16"}))
    handle.remove()
    assert seen and all(d == torch.bfloat16 for d in seen)  # the backbone ran in bf16
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in g16.values())
    flat32 = torch.cat([g.flatten() for g in g32.values()])
    flat16 = torch.cat([g16[n].flatten() for n in g32])
    rel = float((flat16 - flat32).norm() / flat32.norm())
    assert 0 < rel < TOL, rel  # close, but not the float32 gradients: autocast really ran
    assert float(abs(loss16 - loss32) / abs(loss32)) < TOL


def test_bf16_update_keeps_float32_parameters_and_optimizer_state():
    from credo.train.optim import build_optimizer, build_scheduler
    from credo.train.update import UpdateOptions, update_policy

    model, tok = _model()
    batch = _batch_with_advantages(tok)
    cfg = load_config(None, ["train.mixed_precision=bf16", "train.micro_batch_size=2", "train.warmup_steps=0",
                             "algo.entropy_coef=0.01"])
    opts = UpdateOptions.of(cfg)
    assert opts.forward.autocast == "bf16"
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, betas=[0.9, 0.99])
    seen, handle = _layer_output_dtypes(model)
    metrics = update_policy(opts, model, batch, opt, build_scheduler(opt, warmup_steps=0, total_steps=1), step=0)
    handle.remove()
    assert seen and all(d == torch.bfloat16 for d in seen)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    assert states and all(v.dtype == torch.float32 for v in states)  # AdamW's moments: float32
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())  # it stepped


def test_fp16_update_scales_the_loss_and_steps_float32_weights():
    """fp16: a GradScaler (scale 2^16 > 1) scales each backward and unscales before clipping: the reported gradient
    norm is the unscaled one (close to float32's), parameters and AdamW state stay float32."""
    from credo.train.mixed_precision import loss_scaler
    from credo.train.optim import build_optimizer, build_scheduler
    from credo.train.update import UpdateOptions, update_policy

    norms = {}
    for mode in ("none", "fp16"):
        model, tok = _model()
        cfg = load_config(None, [f"train.mixed_precision={mode}", "train.micro_batch_size=2", "train.warmup_steps=0",
                                 "algo.entropy_coef=0.01", "train.grad_clip=0"])
        opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, betas=[0.9, 0.99])
        seen, handle = _layer_output_dtypes(model)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        metrics = update_policy(UpdateOptions.of(cfg), model, _batch_with_advantages(tok), opt,
                                build_scheduler(opt, warmup_steps=0, total_steps=1), step=0)
        handle.remove()
        norms[mode] = metrics["actor/grad_norm"]
        assert set(seen) == {torch.float16 if mode == "fp16" else torch.float32}
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())  # it stepped
        scaler = loss_scaler(opt, mode)
        if mode == "fp16":
            assert scaler is not None and scaler.get_scale() > 1  # 2^16: no overflow on this model
            states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
            assert states and all(v.dtype == torch.float32 for v in states)
        else:
            assert scaler is None
    assert norms["fp16"] != norms["none"]
    assert abs(norms["fp16"] - norms["none"]) / norms["none"] < TOL, norms  # unscaled before the norm


def test_fp16_with_fsdp2_and_low_precision_master_weights_are_refused():
    with pytest.raises(ConfigError, match="fp16: not implemented with distributed.strategy=fsdp2"):
        load_config(None, ["train.mixed_precision=fp16", "distributed.backend=torchrun", "distributed.strategy=fsdp2"])
    with pytest.raises(ConfigError, match="needs model.dtype=float32"):
        load_config(None, ["train.mixed_precision=bf16", "model.dtype=bfloat16"])
    assert load_config(None, ["train.mixed_precision=bf16"]).train.mixed_precision == "bf16"


def test_fsdp2_uses_the_policy_instead_of_autocast():
    cfg = load_config(None, ["train.mixed_precision=bf16", "distributed.backend=torchrun",
                             "distributed.strategy=fsdp2"])
    assert ForwardOptions.of(cfg).autocast == "none"  # FSDP2's MixedPrecisionPolicy casts the parameters
    from credo.train.mixed_precision import fsdp_policy

    policy = fsdp_policy("bf16")
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    assert fsdp_policy("none") is None


def _fsdp2_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from credo.train.data_parallel import DataParallel
    from credo.train.fsdp import full_state_dict, shard_policy
    from credo.train.optim import build_scheduler
    from credo.train.update import UpdateOptions, update_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, tok = _model()
        batch = _batch_with_advantages(tok)
        cfg = load_config(None, ["train.mixed_precision=bf16", "distributed.backend=torchrun",
                                 "distributed.strategy=fsdp2", "train.micro_batch_size=2", "train.warmup_steps=0",
                                 "train.grad_clip=0"])
        shard_policy(model, world, cfg.train.mixed_precision)
        seen, handle = _layer_output_dtypes(model)
        before = {k: v.clone() for k, v in full_state_dict(model).items()}
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        update_policy(UpdateOptions.of(cfg), model, batch, opt, build_scheduler(opt, warmup_steps=0, total_steps=1),
                      step=0, dp=DataParallel(rank, world))
        handle.remove()
        shards = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
        after = full_state_dict(model)
        if rank == 0:
            torch.save({"grads": {k: before[k] - after[k] for k in before}, "seen": [str(d) for d in seen],
                        "shard_dtypes": sorted({str(s.dtype) for s in shards})}, os.path.join(out_dir, "fsdp2.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_fsdp2_bf16_policy_on_two_gloo_ranks_is_close_to_one_float32_rank(tmp_path):
    """FSDP2 over 2 gloo ranks with MixedPrecisionPolicy(bf16 parameters, float32 reduction): the shards stay
    float32, the layers compute in bf16, and the update (SGD at lr 1: minus the gradient) is float32's to TOL."""
    import torch.multiprocessing as mp

    from credo.train.data_parallel import LOCAL
    from credo.train.optim import build_scheduler
    from credo.train.update import UpdateOptions, update_policy

    mp.start_processes(_fsdp2_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    got = torch.load(tmp_path / "fsdp2.pt")
    assert got["seen"] and set(got["seen"]) == {"torch.bfloat16"}
    assert got["shard_dtypes"] == ["torch.float32"]
    model, tok = _model()
    m = copy.deepcopy(model)
    cfg = load_config(None, ["train.micro_batch_size=2", "train.warmup_steps=0", "train.grad_clip=0"])
    before = {k: v.clone() for k, v in m.state_dict().items()}
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    update_policy(UpdateOptions.of(cfg), m, _batch_with_advantages(tok), opt,
                  build_scheduler(opt, warmup_steps=0, total_steps=1), step=0, dp=LOCAL)
    want = {k: before[k] - v for k, v in m.state_dict().items()}
    flat_want = torch.cat([want[k].flatten() for k in want])
    flat_got = torch.cat([got["grads"][k].flatten() for k in want])
    rel = float((flat_got - flat_want).norm() / flat_want.norm())
    assert flat_want.abs().max() > 0 and 0 < rel < TOL, rel


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_a_tiny_credo_train_run_with_mixed_precision(tmp_path, mode):
    run = tmp_path / "run"
    args = ["train.steps=2", "warm_start.steps=1", "eval.size=4", "eval.k=1", "log.progress=false",
            "log.tensorboard=false", "log.report=false", "checkpoint.every=0", "checkpoint.save_final=false",
            "train.threads=1", f"train.mixed_precision={mode}", "algo.entropy_coef=0.01"]
    out = subprocess.run([sys.executable, "-m", "credo.cli.main", "-q", "train", *args, "--run-dir", str(run),
                          "--overwrite"], env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    norms = [r["actor/grad_norm"] for r in steps if "actor/grad_norm" in r]
    assert len(norms) == 2 and all(0 < n < float("inf") for n in norms)


def test_fp16_loss_scaler_state_round_trip():
    """scaler_state / load_scaler_state carry the scale and the growth count (plain numbers) to a new optimizer."""
    from credo.train.mixed_precision import load_scaler_state, loss_scaler, scaler_state

    model, _ = _model()
    opt = torch.optim.AdamW(model.parameters())
    assert scaler_state(opt) is None  # no fp16 update yet: nothing to save
    scaler = loss_scaler(opt, "fp16")
    assert scaler.get_scale() == 2.0 ** 16 and scaler_state(opt)["_growth_tracker"] == 0
    scaler.update(1024.0)  # as after overflows halved it
    scaler._growth_tracker = torch.tensor(7, dtype=torch.int32)
    saved = json.loads(json.dumps(scaler_state(opt)))  # through trainer_state.json
    assert saved["scale"] == 1024.0 and saved["_growth_tracker"] == 7
    other = torch.optim.AdamW(model.parameters())
    load_scaler_state(other, saved)
    assert loss_scaler(other, "fp16").get_scale() == 1024.0 and scaler_state(other) == saved


def test_fp16_run_resumes_with_its_loss_scale(tmp_path, monkeypatch):
    """A killed fp16 run resumed from its checkpoint goes on with the loss scaler's state: its growth count (one per
    optimizer step) at the end equals the uninterrupted run's (a scaler started afresh at resume would count only
    the steps after it), and the metrics rows are the uninterrupted run's."""
    from tests.conftest import full_and_resumed_runs

    args = ["train.steps=3", "warm_start.steps=1", "eval.every=0", "log.progress=false", "log.tensorboard=false",
            "log.report=false", "checkpoint.every=1", "train.threads=1", "train.mixed_precision=fp16"]
    full, cut = full_and_resumed_runs(tmp_path, monkeypatch, args, stop_at=2)

    def scaler_at_end(run):
        return json.loads((run / "checkpoints" / "step_000003" / "trainer_state.json").read_text())["state"][
            "loss_scaler"]

    assert scaler_at_end(full)["_growth_tracker"] > 0
    assert scaler_at_end(cut) == scaler_at_end(full)

    def rows(run):
        return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))}
                for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]

    assert rows(cut) == rows(full)


def test_fp16_update_without_a_backward_steps_cleanly():
    """Regression: an fp16 update whose rows were all skipped (every group tied) runs no backward; its scaler must
    still unscale and step (GradScaler made its scale lazily in scale(), so unscale_ failed: the first fp16 runs
    crashed when their first step trained nothing)."""
    from credo.train.mixed_precision import loss_scaler
    from credo.train.optim import clip_and_step

    model, _ = _model()
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert clip_and_step(model, opt, sched, 1.0, loss_scaler(opt, "fp16")) == 0.0  # no gradients: norm 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
