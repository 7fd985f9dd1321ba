"""rollout.engine=vllm where vLLM cannot run (the default run: a clear error, never a hang), and the CUDA-only part
of the engine (sleep mode, marked `gpu` only, so that `-m vllm` on a CPU selects nothing it must skip; on a GPU
machine run `python -m pytest -m "vllm or gpu"`). The engine itself is tested
on any vLLM in tests/rollout/test_vllm.py (`-m vllm`)."""
from __future__ import annotations

import pytest
import torch

from credo.rollout.vllm_engine import vllm_available
from credo.types import Example, SamplingParams


def test_vllm_engine_is_refused_clearly_where_vllm_cannot_run(tmp_path):
    from credo.cli.main import main
    from credo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="not implemented for Ray rollout workers"):
        load_config(None, ["rollout.engine=vllm", "distributed.backend=ray", "rollout.vllm.mode=server"])
    if vllm_available():
        pytest.skip("vLLM runs on this machine (tests/rollout/test_vllm.py)")
    from credo.models import build_model
    from credo.recipes.common import rollout_engine
    from credo.rollout.vllm_engine import VLLMUnavailable

    model, tok = build_model(load_config(None, []).model)
    with pytest.raises(VLLMUnavailable, match="rollout.engine=vllm: .*use rollout.engine=hf"):
        rollout_engine(load_config(None, ["rollout.engine=vllm"]), model, tok, seed=0)
    assert main(["-q", "train", "--run-dir", str(tmp_path), "rollout.engine=vllm", "train.steps=1",
                 "warm_start.steps=1"]) == 2  # the preflight's one-line config error, before any work


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM's sleep mode needs CUDA (the CPU build has none)")
def test_sleep_mode_frees_the_gpu_between_rollouts_and_wakes_for_the_next():
    from credo.config import ModelConfig
    from credo.models import build_model
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    model, tok = build_model(ModelConfig(), seed=0)
    engine = VLLMRolloutEngine.from_model(model, tok, options=VLLMOptions(dtype="float32", sleep=True,
                                                                          gpu_memory_utilization=0.2))
    try:
        greedy = SamplingParams(max_new_tokens=8, greedy=True)
        prompts = [Example("rev abc=", "cba", "a")]
        first = engine.generate(prompts, 1, greedy)
        assert engine.transport.sleeping
        engine.update_weights(model, version=1)  # wakes, syncs
        again = engine.generate(prompts, 1, greedy)
        assert [t.response_ids for t in again] == [t.response_ids for t in first]
        assert engine.transport.sleeping and engine.served_version() == "1"
    finally:
        engine.close()
