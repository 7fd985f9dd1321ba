"""credo plan: the cost model's arithmetic by hand, DDP vs FSDP2, published Qwen2 sizes, and the CLI."""
from __future__ import annotations

import functools

from pathlib import Path

import json

import pytest

from credo.cli.main import main
from credo.plan.cli import char_vocab_size, shape_of
from credo.plan.model import (QWEN2_SHAPES, ModelShape, Workload, activation_bytes, forward_flops,
                              generation_flops, kv_cache_bytes, layer_params, matmul_params, memory_per_rank,
                              param_count, step_flops)

# V=10 H=8 I=16 L=1 a=2 k=1 -> d=4, kv=4; Qwen2 (q/k/v biases), tied
TINY = ModelShape(vocab=10, hidden=8, intermediate=16, layers=1, heads=2, kv_heads=1, tied=True, qkv_bias=True)
# 4 sequences of 3 prompt + 2 new tokens, micro-batch 2, generation batch 4, float32 (b=4)
WORK = Workload(sequences=4, prompt_tokens=3, new_tokens=2, micro_batch=2, gen_batch=4)


def test_tiny_parameter_counts_by_hand():
    # q, o: 2 * 8*8 = 128; k, v: 2 * 8*4 = 64; biases q/k/v: 8 + 4 + 4 = 16; MLP 3*8*16 = 384; norms 2*8 = 16
    assert layer_params(TINY) == 128 + 64 + 16 + 384 + 16 == 608
    assert param_count(TINY) == 10 * 8 + 608 + 8 == 696  # tied embedding 80 + layer + final norm 8
    assert matmul_params(TINY) == (608 - 16 - 16) + 80 == 656  # layer linears + output projection V H


def test_tiny_memory_by_hand():
    # per layer per token with a mask: 9H + 2H + 4I + a = 72 + 16 + 64 + 2 = 154; + final norm 3H = 24 -> 178
    # T_mb = 2 * 5 = 10 tokens: 10 * 178 * 4 = 7120; head: kept hidden 4 rows * 8 * 4 = 128,
    # chunk rows min(2^26 // 10, 4) = 4: 3 * 4 * 10 * 4 = 480  -> 7728
    assert activation_bytes(TINY, WORK) == 7120 + 128 + 480 == 7728
    # 2 * L 1 * kv 4 * 4 bytes * 4 sequences * 5 positions = 640
    assert kv_cache_bytes(TINY, WORK) == 640
    ddp = memory_per_rank(TINY, WORK, "ddp", 2)
    assert (ddp.params, ddp.grads, ddp.optimizer) == (696 * 4, 696 * 4, 2 * 696 * 4) == (2784, 2784, 5568)
    assert ddp.engine_copy == ddp.gathered == ddp.reference == 0
    assert ddp.peak == 2784 + 2784 + 5568 + max(7728, 640) == 18864


def test_fsdp2_divides_params_grads_optimizer():
    ddp, fsdp = memory_per_rank(TINY, WORK, "ddp", 2), memory_per_rank(TINY, WORK, "fsdp2", 2)
    assert (fsdp.params, fsdp.grads, fsdp.optimizer) == (1392, 1392, 2784)  # the DDP values / 2
    assert fsdp.activations == ddp.activations and fsdp.kv_cache == ddp.kv_cache  # per-rank work is the same
    # the engine's unsharded copy 696 * 4 = 2784; the largest unit: the layer 608 * 4 = 2432 > root (80 + 8) * 4
    assert (fsdp.engine_copy, fsdp.gathered) == (2784, 2432)
    assert fsdp.peak == 1392 + 1392 + 2784 + 2784 + (7728 + 2432) == 18512
    one = memory_per_rank(TINY, WORK, "fsdp2", 1)  # one rank: nothing to shard, nothing extra
    assert one.peak == memory_per_rank(TINY, WORK, "ddp", 1).peak
    with pytest.raises(ValueError, match="ddp or fsdp2"):
        memory_per_rank(TINY, WORK, "zero3", 2)


def test_tiny_flops_by_hand():
    # forward of 4 sequences x 5 tokens, 2 response tokens each: body 656 - 80 = 576 -> 2 * 576 * 20 = 23040;
    # head 2 * 80 * 4 * 2 = 1280; attention 4 * L 1 * H 8 * s 5 * 20 tokens = 3200 -> 27520
    assert forward_flops(TINY, 4, 5, 2) == 23040 + 1280 + 3200 == 27520
    # prefill 2 * 656 * 3 + 4 * 8 * 3 * 3 = 3936 + 288; decode: contexts 4 + 5 = 9 -> 2 * 656 * 2 + 4 * 8 * 9
    # = 2624 + 288; per sequence 7136, 4 sequences -> 28544
    assert generation_flops(TINY, WORK) == 4 * (3936 + 288 + 2624 + 288) == 28544
    f = step_flops(TINY, WORK)
    # training 3 * forward + the chunked head's recomputed logits 2 * 80 * 8 response tokens = 1280
    assert f.training == 3 * 27520 + 1280 == 83840
    assert (f.old_logprob, f.reference) == (0, 0)
    full = step_flops(TINY, Workload(**{**WORK.__dict__, "chunk_size": 0, "old_logprob_pass": True,
                                        "reference": True, "ppo_epochs": 2}))
    assert full.training == 2 * 3 * 27520 and full.old_logprob == full.reference == 27520
    assert full.total == 28544 + 2 * 3 * 27520 + 2 * 27520


def test_published_qwen2_sizes():
    # Qwen2.5-0.5B / 1.5B / 7B parameter counts as published on their model cards' safetensors totals
    assert param_count(QWEN2_SHAPES["0.5B"]) == 494_032_768
    assert param_count(QWEN2_SHAPES["1.5B"]) == 1_543_714_304
    assert param_count(QWEN2_SHAPES["7B"]) == 7_615_616_512


def test_built_model_shape_matches_the_real_model():
    from credo.config import load_config
    from credo.models.build import build_model

    cfg = load_config(None, ["model.num_layers=3", "model.hidden_size=64", "model.intermediate_size=96"])
    model, tokenizer = build_model(cfg.model)
    assert char_vocab_size() == len(tokenizer)
    assert param_count(shape_of(cfg.model)) == sum(p.numel() for p in model.parameters())


def test_cli_prints_the_table(capsys):
    assert main(["plan", "--gpus", "8", "--gpu-mem-gb", "80", "train.prompts_per_step=4"]) == 0
    out = capsys.readouterr().out
    assert "505,600 parameters" in out and "8 x gpu with 80 GiB" in out
    assert "step: 32 sequences" in out  # 4 prompts x group_size 8
    for row in ("parameters", "gradients", "AdamW state", "activations", "KV cache", "peak", "generation", "total"):
        assert row in out
    assert "DDP" in out and "FSDP2" in out


def test_cli_reads_config_json_without_weights(tmp_path, capsys):
    s = QWEN2_SHAPES["7B"]
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "vocab_size": s.vocab, "hidden_size": s.hidden, "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
        "tie_word_embeddings": False}))
    assert main(["plan", "--gpus", "8", "--gpu-mem-gb", "80", f"model.path={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "7,615,616,512 parameters" in out
    # float32 DDP: params + grads + moments = 4 * 4 * 7.6e9 = 122 GB > 80 GiB; FSDP2 shards it
    fits = next(line for line in out.splitlines() if line.startswith("fits in"))
    assert fits.split()[-2:] == ["FIT", "fits"]


@pytest.mark.parametrize("flags", [["--gpus", "0", "--gpu-mem-gb", "80"], ["--gpus", "8"],
                                   ["--cpu", "--gpus", "2", "--mem-gb", "4"], ["--cpu"], []])
def test_bad_hardware_flag_is_one_line(flags, capsys):
    assert main(["plan", *flags]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("credo: error:") and "\n" not in err


def test_plan_imports_no_torch():
    import subprocess
    import sys

    code = "import credo.cli.main, credo.plan.cli, sys; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]


# ----------------------------------------------------------------------------- mixed precision, offload, LoRA

BF16 = Workload(**{**WORK.__dict__, "mixed_precision": "bf16"})


def test_mixed_precision_memory_by_hand():
    # autocast, per layer per token (bytes): norms' float32 input + normalised 2 * 2 * 8 * 4 = 128; the bf16 casts
    # of q/k/v/gate/up inputs 5 * 8 * 2 = 80; (3H + 2kv' + 4I) * 2 = (24 + 16 + 64) * 2 = 208; log-sum-exp 2 * 4
    # = 8 -> 424; + final norm 3H * 4 = 96 -> 520; 10 tokens -> 5200; head (float32) 128 + 480
    assert activation_bytes(TINY, BF16) == 5200 + 608 == 5808
    # autocast's bf16 copies of the linear weights: (608 - 16 biases - 16 norms) * 2 = 1152
    ddp = memory_per_rank(TINY, BF16, "ddp", 2)
    assert ddp.compute_copy == 576 * 2 == 1152
    # float32 master weights, gradients and moments: as without mixed precision
    assert (ddp.params, ddp.grads, ddp.optimizer) == (2784, 2784, 5568)
    assert ddp.peak == 2784 + 2784 + 5568 + 5808 + 1152 == 18096
    # FSDP2's policy: the norms keep their bf16 cast and output (4 H * 2 = 64 instead of 80) -> 408 + 96 = 504;
    # no autocast copies; the unit is gathered in bf16: 608 * 2
    fsdp = memory_per_rank(TINY, BF16, "fsdp2", 2)
    assert fsdp.activations == 10 * 504 + 608 and fsdp.compute_copy == 0 and fsdp.gathered == 608 * 2
    # checkpointing under autocast: the float32 layer inputs H * 4 = 32 + one layer's 424 + final 96
    ckpt = Workload(**{**BF16.__dict__, "activation_checkpointing": True})
    assert activation_bytes(TINY, ckpt) == 10 * (32 + 424 + 96) + 608
    assert memory_per_rank(TINY, ckpt, "fsdp2", 2).activations == 10 * (8 * 2 + 408 + 96) + 608  # bf16 inputs


def test_optimizer_offload_moves_the_state_to_the_host():
    off = Workload(**{**WORK.__dict__, "optimizer_offload": True})
    ddp = memory_per_rank(TINY, off, "ddp", 2)
    # OffloadedAdamW: no moments on the device; host: float32 master + 2 moments + the gradients' copy
    assert ddp.optimizer == 0 and ddp.host == 4 * 696 * 4 and ddp.params == ddp.grads == 2784
    assert ddp.peak == memory_per_rank(TINY, WORK, "ddp", 2).peak - 5568
    # FSDP2's CPUOffloadPolicy: the shards of parameters, gradients and moments all on the host
    fsdp = memory_per_rank(TINY, off, "fsdp2", 2)
    assert (fsdp.params, fsdp.grads, fsdp.optimizer, fsdp.host) == (0, 0, 0, 1392 + 1392 + 2784)
    assert fsdp.engine_copy == 2784 and fsdp.gathered == 2432  # still on the device


def test_lora_counts_match_a_peft_model_and_only_adapters_train():
    from credo.config import load_config
    from credo.models.build import build_model
    from credo.models.lora import apply_lora
    from credo.plan.model import lora_params

    # q (8 x 8): r (8 + 8) = 32, v (8 -> 4): r (8 + 4) = 24 at r = 2
    assert lora_params(TINY, 2, ("q_proj", "v_proj")) == 56
    lora = Workload(**{**WORK.__dict__, "lora_rank": 2, "lora_targets": ("q_proj", "v_proj")})
    mem = memory_per_rank(TINY, lora, "ddp", 1)
    assert (mem.params, mem.grads, mem.optimizer) == ((696 + 56) * 4, 56 * 4, 2 * 56 * 4)
    assert activation_bytes(TINY, lora) == activation_bytes(TINY, WORK) + 10 * 2 * 2 * 4  # r per target per token
    with pytest.raises(ValueError, match="lm_head"):
        lora_params(TINY, 2, ("lm_head",))
    cfg = load_config(None, ["model.num_layers=2", "model.hidden_size=64", "model.intermediate_size=96",
                             "model.lora.r=4"])
    model, _ = build_model(cfg.model)
    apply_lora(model, cfg.model.lora)
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert adapters == lora_params(shape_of(cfg.model), 4, tuple(cfg.model.lora.target_modules)) > 0


def test_cli_models_mixed_precision_offload_and_lora(capsys):
    assert main(["plan", "--gpus", "2", "--gpu-mem-gb", "80", "train.mixed_precision=bf16",
                 "train.optimizer_offload=true", "model.lora.r=4", "algo.kl_coef=0.01"]) == 0
    out = capsys.readouterr().out
    assert "mixed precision bf16" in out and "optimizer offload on" in out and "LoRA r=4" in out
    host = next(line for line in out.splitlines() if line.startswith("host memory"))
    assert float(host.split()[-2]) > 0
    ref = next(line for line in out.splitlines() if line.startswith("reference model"))
    assert float(ref.split()[-1]) == 0.0  # a LoRA policy's reference is itself with its adapters off


def _live_bytes(prof) -> tuple[int, int]:
    """(peak, final) of the running sum of the profiler's CPU allocation events: benchmarks/plan_validate.py's
    ``live_bytes``, the one measurement both use (benchmarks/ is a folder of scripts, not a package)."""
    return _plan_validate().live_bytes(prof)


@functools.cache
def _plan_validate():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "plan_validate.py"
    spec = importlib.util.spec_from_file_location("plan_validate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _measure(mode: str) -> dict:
    """One training step of a ~5M Qwen2 on a micro-batch of 8 x (32 + 32) tokens through credo's split (backbone
    under autocast, float32 chunked log-prob + entropy head, fused AdamW), measured as benchmarks/plan_validate.py
    does: live bytes after the forward, and parameters + moments + the peak of a second step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from credo.algo.chunked import chunked_logprobs_entropy
    from credo.config import load_config
    from credo.models.build import build_model
    from credo.train.mixed_precision import compute, full_precision
    from credo.train.optim import build_optimizer

    torch.manual_seed(0)
    cfg = load_config(None, ["model.hidden_size=256", "model.intermediate_size=1024", "model.num_layers=5",
                             "model.num_heads=8", "model.num_kv_heads=4"])
    model, _ = build_model(cfg.model)
    shape, (batch, prompt, response) = shape_of(cfg.model), (8, 32, 32)
    ids = torch.randint(4, shape.vocab, (batch, prompt + response))

    def loss_of():
        with compute(model, mode):
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        (hidden,) = full_precision(hidden)
        h = hidden[:, prompt - 1: -1, :].reshape(-1, hidden.shape[-1])
        lp, ent = chunked_logprobs_entropy(h, model.lm_head.weight, ids[:, prompt:].reshape(-1))
        return -(lp.mean() + 0.01 * ent.mean())

    opt = build_optimizer(model, lr=1e-4)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = loss_of()
    acts = _live_bytes(prof)[1]
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del loss
    static = sum(p.numel() * p.element_size() for p in model.parameters())
    static += sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                  if torch.is_tensor(t) and t.dim() > 0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss_of().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    w = Workload(sequences=batch, prompt_tokens=prompt, new_tokens=response, micro_batch=batch, gen_batch=batch,
                 masked=False, mixed_precision=mode)
    pred = memory_per_rank(shape, w, "ddp", 1)
    return {"act": (pred.activations + pred.compute_copy, acts),
            "peak": (pred.params + pred.grads + pred.optimizer + pred.activations + pred.compute_copy,
                     static + _live_bytes(prof)[0])}


@pytest.mark.parametrize("mode", ["none", "bf16"])
def test_memory_model_against_cpu_measurements(mode):
    """The model is an upper bound close to what the CPU measures (docs/plan.md, "Validation"): activations (with
    autocast's weight copies under bf16) 0-12% above the live bytes after the forward; the step's peak 0-25% above
    (the prediction adds the gradients to the activations they replace)."""
    r = _measure(mode)
    act, peak = ((p - m) / m for p, m in (r["act"], r["peak"]))
    print(mode, r, f"activations {act:+.1%}, peak {peak:+.1%}")
    assert 0 <= act < 0.12, r
    assert 0 <= peak < 0.25, r
