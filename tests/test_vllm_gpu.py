"""The vLLM rollout engine (rollout.engine=vllm). The GPU tests run where CUDA and vLLM are present
(`python -m pytest -m gpu tests/test_vllm_gpu.py`); on a CPU machine they are skipped. The CPU test checks the
clear error and the config rule."""
from __future__ import annotations

import pytest
import torch

from credo.rollout.vllm_engine import vllm_available
from credo.types import Example, SamplingParams

PROMPTS = [Example("rev abc=", "cba", "a"), Example("rev hgfedc=", "cdefgh", "b"), Example("12+3=", "15", "c")]
GPU = pytest.mark.skipif(not vllm_available(), reason="needs a CUDA GPU and vLLM")


def test_vllm_engine_is_refused_clearly_without_a_gpu_or_vllm(tmp_path):
    from credo.cli.main import main
    from credo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="not implemented for Ray rollout workers"):
        load_config(None, ["rollout.engine=vllm", "distributed.backend=ray"])
    if vllm_available():
        pytest.skip("this machine has a GPU and vLLM")
    from credo.recipes.common import rollout_engine
    from credo.models import build_model

    model, tok = build_model(load_config(None, []).model)
    with pytest.raises(ValueError, match="needs a CUDA GPU and vLLM"):
        rollout_engine(load_config(None, ["rollout.engine=vllm"]), model, tok, seed=0)
    assert main(["-q", "train", "--run-dir", str(tmp_path), "rollout.engine=vllm", "train.steps=1",
                 "warm_start.steps=1"]) != 0  # a clear failure through the CLI, not a hang


@pytest.fixture(scope="module")
def vllm_setup():
    from credo.config import ModelConfig
    from credo.models import build_model
    from credo.rollout.vllm_engine import VLLMRolloutEngine

    model, tok = build_model(ModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                                         num_kv_heads=2), seed=0)
    engine = VLLMRolloutEngine.from_model(model, tok, seed=0, dtype="float32", gpu_memory_utilization=0.2)
    yield model, tok, engine
    engine.close()


@pytest.mark.gpu
@GPU
def test_vllm_generates_groups_with_stops_and_logprobs(vllm_setup):
    _, tok, engine = vllm_setup
    trajs = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=8))
    assert [t.group_id for t in trajs] == [0] * 4 + [1] * 4 + [2] * 4
    for t in trajs:
        assert 1 <= len(t.response_ids) <= 8 and len(t.rollout_logprobs) == len(t.response_ids)
        assert all(lp <= 0 for lp in t.rollout_logprobs)
        if t.finish_reason == "eos":
            assert t.response_ids[-1] == tok.eos_token_id
    conts = engine.continue_ids([engine.encode(p.prompt) for p in PROMPTS], SamplingParams(max_new_tokens=4),
                                top_logprobs=3)
    assert all(c.top_logprobs.shape == (len(c.ids), 3) for c in conts)


@pytest.mark.gpu
@GPU
def test_vllm_logprobs_agree_with_the_trainer(vllm_setup):
    from credo.train.batch import collate
    from credo.train.forward import batched_logprobs
    from credo.types import RewardResult

    model, tok, engine = vllm_setup
    trajs = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=8, temperature=0.8))
    batch = collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id)
    trainer, _ = batched_logprobs(model.cuda(), batch, micro_batch_size=None, temperature=0.8)
    diff = ((trainer.cpu() - batch.rollout_logprobs).abs() * batch.response_mask).max()
    assert float(diff) < 1e-3  # float32 on both sides
    model.cpu()


@pytest.mark.gpu
@GPU
def test_vllm_weight_sync_changes_outputs_and_versions_them(vllm_setup):
    model, tok, engine = vllm_setup
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    before = engine.generate(PROMPTS, 1, greedy)
    other = {k: v + torch.randn_like(v) * 0.5 for k, v in model.state_dict().items()}
    engine.update_weights(other, version=3)
    after = engine.generate(PROMPTS, 1, greedy)
    assert {t.policy_version for t in after} == {3}
    assert [t.response_ids for t in after] != [t.response_ids for t in before]
    engine.update_weights(model, version=4)  # back to the original weights: the original outputs
    assert [t.response_ids for t in engine.generate(PROMPTS, 1, greedy)] == [t.response_ids for t in before]
