"""credo plan: the cost model's arithmetic by hand, DDP vs FSDP2, published Qwen2 sizes, and the CLI."""
from __future__ import annotations

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
