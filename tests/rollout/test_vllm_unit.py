"""The parts of the vLLM engine that need no vLLM (default run): weight chunks, row seeds, stop matching, the
options -> vLLM keywords / server flags, the rollout.vllm config section and the rollout-correction default."""
from __future__ import annotations

import base64

import pytest
import torch
from safetensors.torch import load as load_safetensors

from credo.config import load_config
from credo.rollout.vllm_engine import cut_at_stop, row_seed
from credo.rollout.vllm_sync import weight_chunks
from credo.rollout.vllm_transport import VLLMOptions, engine_kwargs, server_command


def _unpack(chunks):
    out = {}
    for c in chunks:
        out |= load_safetensors(base64.b64decode(c["blob"]) if isinstance(c["blob"], str) else c["blob"])
    return out


def test_weight_chunks_round_trip_split_by_size_and_clone_tied_tensors():
    emb = torch.randn(10, 4)
    state = {"embed.weight": emb, "lm_head.weight": emb, "a": torch.randn(100), "b": torch.randn(3, 3)}
    chunks = list(weight_chunks(state, chunk_bytes=200))  # 160, 160, 400, 36 bytes -> [emb], [lm_head], [a], [b]
    assert len(chunks) == 4 and all(isinstance(c["blob"], str) for c in chunks)  # base64 text (JSON, HTTP)
    back = _unpack(chunks)  # the tied head is sent too (vLLM's CPU build keeps its own copy of it)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    raw = list(weight_chunks(state, text=False))  # in process: raw bytes, 64 MiB chunks
    assert len(raw) == 1 and isinstance(raw[0]["blob"], bytes) and set(_unpack(raw)) == set(state)
    # a view of a bigger storage (a slice) is sent as its own tensor
    big = torch.arange(20.0)
    assert torch.equal(_unpack(weight_chunks({"v": big[5:8]}))["v"], torch.tensor([5.0, 6.0, 7.0]))


def test_row_seeds_are_a_function_of_key_and_row():
    seeds = [row_seed(7, r) for r in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= s < 2**31 - 1 for s in seeds)
    assert row_seed(7, 3) == row_seed(7, 3) != row_seed(8, 3)


def test_cut_at_stop_finds_the_first_complete_occurrence():
    assert cut_at_stop([1, 2, 3, 2, 3], ((2, 3),)) == 3
    assert cut_at_stop([5, 5, 5], ((5, 5),)) == 2
    assert cut_at_stop([1, 2, 4], ((2, 3), (4,))) == 3
    assert cut_at_stop([1, 2], ((2, 3),)) is None


def test_options_become_vllm_keywords_and_server_flags():
    cpu = engine_kwargs(VLLMOptions(dtype="float32"), seed=3, cpu=True)
    assert cpu["enforce_eager"] is True and cpu["kv_cache_memory_bytes"] == 512 << 20
    assert "gpu_memory_utilization" not in cpu and cpu["logprobs_mode"] == "processed_logprobs"
    assert cpu["weight_transfer_config"] == {"backend": "credo_torchdist"}  # weight_sync=auto: torchdist first
    old = engine_kwargs(VLLMOptions(weight_sync="safetensors"), seed=3, cpu=True)
    assert old["weight_transfer_config"] == {"backend": "credo_safetensors"}
    gpu = engine_kwargs(VLLMOptions(sleep=True, args={"max_num_seqs": 8}), seed=3, cpu=False)
    assert gpu["enforce_eager"] is False and gpu["gpu_memory_utilization"] == 0.4 and gpu["enable_sleep_mode"]
    assert gpu["max_num_seqs"] == 8 and "kv_cache_memory_bytes" not in gpu
    cmd = server_command("/m", port=8123, seed=3, opts=VLLMOptions(enforce_eager=False), cpu=True)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--no-enforce-eager" in cmd
    assert cmd[cmd.index("--weight-transfer-config") + 1] == '{"backend": "credo_torchdist"}'
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"


def test_vllm_section_defaults_legacy_keys_and_the_trainers_dtype():
    from credo.recipes.common import vllm_options

    cfg = load_config(None, ["rollout.engine=vllm"])
    assert vllm_options(cfg).dtype == "float32"  # auto = the trainer's dtype, not vLLM's auto (bfloat16 here)
    assert vllm_options(load_config(None, ["rollout.vllm.dtype=bfloat16"])).dtype == "bfloat16"
    old = load_config(None, ["rollout.vllm_dtype=float16", "rollout.vllm_gpu_memory_utilization=0.7"])
    assert (old.rollout.vllm.dtype, old.rollout.vllm.gpu_memory_utilization) == ("float16", 0.7)
    from credo.config import ConfigError

    with pytest.raises(ConfigError, match="rollout.vllm.mode"):
        load_config(None, ["rollout.vllm.mode=nowhere"])


def test_rollout_correction_is_on_by_default_with_vllm_only():
    from credo.train.update import LossSpec

    assert LossSpec.of(load_config(None, [])).rollout_correction == "none"
    assert LossSpec.of(load_config(None, ["rollout.engine=vllm"])).rollout_correction == "token_truncate"
    assert LossSpec.of(load_config(None, ["rollout.engine=vllm", "algo.rollout_correction=none"])) \
        .rollout_correction == "none"
