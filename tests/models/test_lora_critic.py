"""A critic for a LoRA policy (``model.lora`` with a value-reading estimator, e.g. ``algo.advantage=gae``): the
critic's backbone is the policy's with its adapters merged into plain weights (credo.models.lora.merged_copy), so
it computes what the LoRA policy's backbone computes, trains all its weights, and saves / loads / resumes as any
critic."""
from __future__ import annotations

import torch

from credo.models import build_model
from credo.models.lora import apply_lora, is_lora
from credo.models.value import ValueModel
from credo.tracking.metrics import read_metrics
from tests.conftest import TINY, full_and_resumed_runs
from tests.models.test_lora import LORA, RUN, _kick


def test_critic_of_a_lora_policy_is_the_merged_backbone_and_round_trips(tmp_path):
    policy, _ = build_model(TINY, seed=0)
    apply_lora(policy, LORA, seed=0)
    _kick(policy, 0.1)  # B != 0: the merge changes the weights
    critic = ValueModel.from_policy(policy)
    assert not any("lora_" in n for n, _ in critic.named_parameters()) and not is_lora(critic.backbone)
    assert all(p.requires_grad for p in critic.parameters())  # the base was frozen in the policy, not here
    assert any("lora_" in n for n, _ in policy.named_parameters())  # the policy keeps its adapters
    ids = torch.randint(4, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = policy.model(input_ids=ids).last_hidden_state
        torch.testing.assert_close(critic.backbone(input_ids=ids).last_hidden_state, want, rtol=0, atol=1e-5)
        base, _ = build_model(TINY, seed=0)
        assert (base.model(input_ids=ids).last_hidden_state - want).abs().max() > 1e-3  # the adapters counted
    with torch.no_grad():  # the scalar head starts at zero: give it weights so the round trip compares values
        for param in critic.value_head.parameters():
            param.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    critic.save(tmp_path / "critic")
    loaded = ValueModel.load(tmp_path / "critic")
    mask = torch.ones_like(ids)
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        values = critic(ids, mask, pos)
        assert values.abs().max() > 0
        torch.testing.assert_close(loaded(ids, mask, pos), values, rtol=0, atol=0)


def test_lora_run_with_a_critic_trains_and_resumes_exactly(tmp_path, monkeypatch):
    args = [*RUN, "algo.advantage=gae", "train.steps=3", "checkpoint.every=1", "eval.every=0", "log.tensorboard=false"]
    full, cut = full_and_resumed_runs(tmp_path, monkeypatch, args, stop_at=2)
    keys = ("reward/mean", "actor/grad_norm", "actor/pg_loss", "critic/vf_loss", "critic/grad_norm")

    def rows(run):
        return [[r.get(k) for k in keys] for r in read_metrics(run / "metrics.jsonl") if "actor/grad_norm" in r]

    assert len(rows(full)) == 3 and all(r[3] is not None and r[4] > 0 for r in rows(full))
    assert rows(full) == rows(cut)
    model_dir = full / "checkpoints" / "step_000003" / "model"
    assert (model_dir / "adapter_model.safetensors").is_file() and not (model_dir / "model.safetensors").exists()
