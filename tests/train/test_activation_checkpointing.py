"""train.activation_checkpointing: each decoder layer recomputed in the backward pass gives the same log-probs and
the same gradient of every parameter as the plain forward (float64, to 1e-6; in practice ~1e-15), for the padded
forward, the packed forward, a LoRA policy and a critic; the shared-prompt forward falls back to the full forward
while layers recompute; fewer bytes are saved for backward; a tiny ``credo train`` run with it on completes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from credo.config import ModelConfig
from credo.models import build_model
from credo.train.activation_checkpointing import enable_activation_checkpointing, recomputing
from credo.train.forward import ForwardOptions, policy_logprobs
from tests.train.test_forward import _batch, _group_batch, float64_norms  # noqa: F401 (a fixture)

F64 = torch.float64


def _model64(layers: int = 3):
    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=layers, num_heads=4, num_kv_heads=2,
                      max_position_embeddings=128)
    model, tok = build_model(cfg, seed=0)
    return model.to(F64), tok


def _loss_and_grads(model, batch, opts):
    model.train()
    model.zero_grad()
    weights = torch.randn(batch.responses.shape, dtype=F64, generator=torch.Generator().manual_seed(3))
    lp, ent = policy_logprobs(model, batch, temperature=0.8, with_entropy=True, opts=opts)
    loss = ((lp * weights + 0.1 * ent) * batch.response_mask).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _assert_same(plain, ckpt, trainable):
    (loss0, grads0), (loss1, grads1) = plain, ckpt
    torch.testing.assert_close(loss1, loss0, rtol=0, atol=1e-6)
    assert set(grads0) == set(grads1) == trainable  # every trainable parameter got a gradient both ways
    for name in grads0:
        assert grads0[name].abs().max() > 0 or "lora_B" not in name
        torch.testing.assert_close(grads1[name], grads0[name], rtol=0, atol=1e-6, msg=name)


def _saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn`` runs (checkpointed layers save their inputs)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


@pytest.mark.parametrize("opts", [ForwardOptions(chunk_size=4), ForwardOptions(chunk_size=0),
                                  ForwardOptions(chunk_size=3, pack=True, row_tokens=16)], ids=["padded", "logits", "packed"])
def test_checkpointed_gradients_equal_the_plain_ones(opts, float64_norms):  # noqa: F811 (the fixture imported above)
    model, tok = _model64()
    batch = _batch(tok)
    plain = _loss_and_grads(model, batch, opts)
    assert not recomputing(model)
    enable_activation_checkpointing(model)
    assert recomputing(model) and all(layer.gradient_checkpointing for layer in model.model.layers)
    _assert_same(plain, _loss_and_grads(model, batch, opts), {n for n, p in model.named_parameters()})
    with torch.no_grad():
        assert not recomputing(model)  # no backward: layers run as is (the rollout's cache included)


def test_checkpointing_saves_fewer_bytes_for_backward():
    model, tok = _model64(layers=4)
    batch = _batch(tok)
    opts = ForwardOptions(chunk_size=4)
    plain = _saved_bytes(lambda: _loss_and_grads(model, batch, opts))
    enable_activation_checkpointing(model)
    ckpt = _saved_bytes(lambda: _loss_and_grads(model, batch, opts))
    assert ckpt < 0.6 * plain, (ckpt, plain)


def test_lora_policy_checkpointed_gradients_equal_the_plain_ones(float64_norms):  # noqa: F811 (the fixture imported above)
    from credo.config.schema import LoraConfig
    from credo.models.lora import apply_lora

    model, tok = _model64()
    apply_lora(model, LoraConfig(r=4), seed=1)
    with torch.no_grad():  # B = 0 at init: make the adapters act so their A matrices get gradients too
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(n)))
    batch = _batch(tok)
    opts = ForwardOptions(chunk_size=4)
    plain = _loss_and_grads(model, batch, opts)
    enable_activation_checkpointing(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    _assert_same(plain, _loss_and_grads(model, batch, opts), trainable)


@pytest.mark.parametrize("pack_responses", [False, True])
def test_shared_prompt_forward_falls_back_to_the_full_forward(pack_responses, float64_norms, monkeypatch):  # noqa: F811 (the fixture imported above)
    """transformers drops the KV cache inside checkpointed layers, which the shared-prompt forward runs the responses
    on: while layers recompute it is not used (the full forward runs), and the gradients are still the plain ones."""
    from credo.train import forward

    model, tok = _model64()
    batch = _group_batch(tok)
    opts = ForwardOptions(chunk_size=5, share_prompt=True, pack_responses=pack_responses)
    plain = _loss_and_grads(model, batch, opts)
    enable_activation_checkpointing(model)

    def refuse(*a, **k):
        raise AssertionError("the shared-prompt forward ran under activation checkpointing")

    monkeypatch.setattr(forward, "shared_prompt_hidden", refuse)
    monkeypatch.setattr(forward, "packed_shared_hidden", refuse)
    _assert_same(plain, _loss_and_grads(model, batch, opts), {n for n, p in model.named_parameters()})


def test_critic_backbone_is_checkpointed(float64_norms):  # noqa: F811 (the fixture imported above)
    from credo.models.value import ValueModel
    from credo.train.forward import response_outputs

    model, tok = _model64()
    critic = ValueModel.from_policy(model, "scalar").to(F64)
    batch = _batch(tok)

    def grads():
        critic.train()
        critic.zero_grad()
        values = response_outputs(critic, batch).values
        (values * batch.response_mask).pow(2).sum().backward()
        return values.detach().sum(), {n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None}

    plain = grads()
    enable_activation_checkpointing(critic)
    assert recomputing(critic)
    _assert_same(plain, grads(), {n for n, p in critic.named_parameters()})


def test_a_tiny_credo_train_run_with_activation_checkpointing(tmp_path):
    run = tmp_path / "run"
    args = ["train.steps=2", "warm_start.steps=1", "eval.size=4", "eval.k=1", "log.progress=false",
            "log.tensorboard=false", "log.report=false", "checkpoint.every=0", "checkpoint.save_final=false",
            "train.threads=1", "train.activation_checkpointing=true",
            "algo.entropy_coef=0.01"]  # a gradient although the tiny run's rewards are all 0
    out = subprocess.run([sys.executable, "-m", "credo.cli.main", "-q", "train", *args, "--run-dir", str(run),
                          "--overwrite"], env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    norms = [r["actor/grad_norm"] for r in steps if "actor/grad_norm" in r]
    assert len(norms) == 2 and all(n > 0 for n in norms)  # both RL steps ran a backward through recomputed layers
    assert "Caching is incompatible" not in out.stderr  # no forward asked for a cache under checkpointing


def test_plan_models_checkpointing_as_layer_inputs_plus_one_layer():
    """credo plan's activation model (docs/plan.md): L layers' activations become L layer inputs + one layer's."""
    from credo.plan.model import ModelShape, Workload, activation_bytes, forward_flops, step_flops

    m = ModelShape(vocab=10, hidden=4, intermediate=8, layers=3, heads=2, kv_heads=1)
    kw = dict(sequences=2, prompt_tokens=3, new_tokens=2, micro_batch=2, gen_batch=2, chunk_size=0)
    off, on = Workload(**kw), Workload(**kw, activation_checkpointing=True)
    # one layer per token: 9 H + 2 kv' (= H, masked) + 4 I + a = 36 + 8 + 32 + 2 = 78 elements; 10 tokens, 4 bytes;
    # head: 4 response tokens x H x 4 bytes + 3 x (4, V) fp32 = 64 + 480
    assert activation_bytes(m, off) == 10 * (3 * 78 + 12) * 4 + 544 == 10384
    assert activation_bytes(m, on) == 10 * (3 * 4 + 78 + 12) * 4 + 544 == 4624
    # the recompute: one more forward of the layers, not of the output projection (2 V H per response token)
    extra = step_flops(m, on).training - step_flops(m, off).training
    assert extra == forward_flops(m, 2, 5, 2) - 2 * 10 * 4 * 2 * 2 > 0


def _counting(fn, calls):
    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return counted


def _fsdp2_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from credo.train.data_parallel import DataParallel
    from tests.distributed.test_data_parallel import _setup, _update

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, batch = _setup()
        enable_activation_checkpointing(model)  # the sharded copy recomputes its layers
        calls = []
        for layer in model.model.layers:  # count the checkpointed calls (a function survives the deepcopy)
            layer._gradient_checkpointing_func = _counting(layer._gradient_checkpointing_func, calls)
        grads, metrics = _update(model, batch, "token-mean", DataParallel(rank, world), fsdp2=True)
        assert calls, "no layer was checkpointed under FSDP2"
        if rank == 0:
            torch.save({"grads": grads, "metrics": metrics}, os.path.join(out_dir, "fsdp2.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_fsdp2_with_checkpointing_equals_one_plain_rank(tmp_path):
    """FSDP2 over 2 gloo ranks with every layer checkpointed (transformers checkpoints the layer's forward inside
    FSDP2's hooks, so each unit's gather and reduce-scatter run once): the update equals one plain process's."""
    import torch.multiprocessing as mp

    from credo.train.data_parallel import LOCAL
    from tests.distributed.test_data_parallel import _setup, _update

    mp.start_processes(_fsdp2_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    model, batch = _setup()
    want, want_metrics = _update(model, batch, "token-mean", LOCAL)
    got = torch.load(tmp_path / "fsdp2.pt")
    assert any(g.abs().max() > 0 for g in want)
    for g1, g2 in zip(got["grads"], want):
        torch.testing.assert_close(g1, g2, rtol=0, atol=1e-6)
    assert got["metrics"]["actor/pg_loss"] == pytest.approx(want_metrics["actor/pg_loss"], abs=1e-6)
