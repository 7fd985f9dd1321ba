"""Bounded-staleness async training (rollout.max_staleness, rollout.partial): the version schedule, per-token
versions under partial rollouts, behaviour ratios, the staleness histogram, exact resume, CLI runs."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from credo.cli.main import main
from credo.config import ConfigError, load_config
from credo.train.data_parallel import DataParallel
from credo.distributed.coordinator import RolloutCoordinator
from credo.distributed.staleness import AsyncPipeline, StalenessSchedule, snapshot, staleness_metrics
from credo.rollout import HFRolloutEngine
from credo.tracking.metrics import read_metrics
from credo.types import Example, Rollouts, SamplingParams, Trajectory
from tests.conftest import TINY_RUN

RUN = [*TINY_RUN, "log.report=false", "log.tensorboard=false", "log.progress=false",
       "reward.name=tests.reward_fixtures:length_score"]
VOLATILE = ("timing_s/", "perf/")


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_metrics(run / "metrics.jsonl")
            if "reward/mean" in r]


def _dumps(run: Path) -> list[tuple]:
    """Every dumped rollout's prompt, response tokens and behaviour log-probs, in order."""
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    return [(r["prompt_ids"], r["response_ids"], r["rollout_logprobs"]) for r in rows]


# ---------------------------------------------------------------------------- the schedule, the metrics


def test_schedule_bounds_every_tokens_staleness_by_k():
    s = StalenessSchedule(2)
    assert [s.start_version(b) for b in range(5)] == [0, 0, 0, 1, 2]  # max(0, b - 2)
    assert s.version_at(4, 7) == 2  # no partial rollouts: every token by the batch's start version
    p = StalenessSchedule(2, partial=True, max_new_tokens=8)  # c = ceil(8 / 2) = 4 decode steps per version
    assert [p.version_at(5, d) for d in range(8)] == [3, 3, 3, 3, 4, 4, 4, 4]  # 5 - 2 + d // 4
    assert [p.version_at(1, d) for d in range(8)] == [0] * 8  # clamped to max(1 - 1, 0) = 0
    assert [p.version_at(0, d) for d in (0, 7)] == [0, 0]
    q = StalenessSchedule(3, partial=True, max_new_tokens=8)  # c = ceil(8 / 3) = 3
    assert [q.version_at(6, d) for d in range(8)] == [3, 3, 3, 4, 4, 4, 5, 5]
    for sched in (s, p, q):  # trained at step b, never older than b - K, never newer than b - 1 (b >= 1)
        for b in range(1, 9):
            vs = [sched.version_at(b, d) for d in range(8)]
            assert b - sched.k <= min(vs) and max(vs) <= b - 1


def _traj(versions: list[int], mask: list[int], policy_version: int = 0) -> Trajectory:
    return Trajectory(example=Example("p", "a"), group_id=0, prompt_ids=[1], response_ids=list(range(len(mask))),
                      rollout_logprobs=[0.0] * len(mask), response_mask=mask, finish_reason="eos",
                      policy_version=policy_version, token_versions=versions)


def test_staleness_metrics_count_loss_tokens_by_age():
    # step 5, K = 2: tokens of versions [3, 3, 4] (mask 1, 1, 0) and a whole response of version 4 (2 tokens)
    trajs = [_traj([3, 3, 4], [1, 1, 0]), _traj([], [1, 1], policy_version=4)]
    m = staleness_metrics(trajs, 5, 2)
    # loss tokens: ages 2, 2 (the third is masked), then 1, 1: 4 tokens
    assert m["rollout/staleness_hist/0"] == 0.0
    assert m["rollout/staleness_hist/1"] == pytest.approx(2 / 4)
    assert m["rollout/staleness_hist/2"] == pytest.approx(2 / 4)
    assert m["rollout/staleness_mean"] == pytest.approx((2 + 2 + 1 + 1) / 4)
    assert m["rollout/staleness_max"] == 2.0
    # an older sample (a replayed one) gets its own bin beyond K
    assert staleness_metrics([_traj([], [1], policy_version=0)], 5, 2)["rollout/staleness_hist/5"] == 1.0


def test_config_aliases_and_refusals():
    assert load_config(None, ["rollout.one_step_off=true"]).rollout.max_staleness == 1
    assert load_config(None, ["rollout.max_staleness=3"]).rollout.one_step_off is True
    dp = DataParallel()
    with pytest.raises(ConfigError, match="needs rollout.max_staleness"):
        RolloutCoordinator.of(load_config(None, ["rollout.partial=true"]), dp, shardable=True)
    with pytest.raises(ConfigError, match="not implemented with Ray"):
        RolloutCoordinator.of(load_config(None, ["rollout.max_staleness=2", "rollout.engine=vllm"]), dp,
                              shardable=True)


# ---------------------------------------------------------------------------- partial rollouts, engine level


class _NoState:
    def state_dict(self) -> dict:
        return {}


def _partial_batch(tiny_model, recompute: bool, lean: bool = True):
    """Batches 0..2 under K = 2, partial, 8 new tokens (c = 4): batch 2 decodes steps 0-3 with version 0 and 4-7
    with version 1, whose weights are version 0's moved by noise. Returns (batch 2's trajectories, v0, v1)."""
    model, tok = tiny_model
    v0 = copy.deepcopy(model)
    v1 = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in v1.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    engine = HFRolloutEngine(copy.deepcopy(model), tok, seed=5, lean=lean)
    prompts = [Example("rev abc=", "cba"), Example("rev hgfe=", "efgh")]
    sp = SamplingParams(max_new_tokens=8, temperature=1.0)
    pipe = AsyncPipeline(StalenessSchedule(2, partial=True, max_new_tokens=8), engine=engine, collector=_NoState(),
                         collect=lambda s, timer: Rollouts(engine.generate(prompts, 3, sp), []), steps=3,
                         recompute_kv=recompute)
    try:
        pipe.publish(0, snapshot(v0))
        pipe.fill(0)  # batches 0, 1, 2 (each starts with version 0)
        first = pipe.take(0)
        assert all(t.token_versions == [0] * len(t.response_ids) for t in first.trajs)
        pipe.take(1)
        pipe.idle()  # batch 2 waits at decode step 4 for version 1: the engine is free meanwhile
        assert pipe.blocked
        pipe.publish(1, snapshot(v1))
        trajs = pipe.take(2).trajs
    finally:
        pipe.close()
    return trajs, v0, v1, tok


def _teacher_forced(model, traj: Trajectory) -> list[float]:
    """log pi(token_d | prompt + tokens[:d]) under ``model`` (temperature 1), a full forward."""
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float().log_softmax(-1)  # (P + T, V)
    p = len(traj.prompt_ids)
    return [float(logits[p - 1 + d, tok]) for d, tok in enumerate(traj.response_ids)]


@pytest.mark.parametrize("recompute,lean", [(False, True), (True, True), (True, False)])
def test_partial_rollouts_record_each_tokens_version_and_behaviour_logprob(tiny_model, recompute, lean):
    """Both decode paths: credo's lean loop and transformers' forward on a DynamicCache (lean=False)."""
    trajs, v0, v1, _ = _partial_batch(tiny_model, recompute, lean)
    long = [t for t in trajs if len(t.response_ids) > 4]
    assert long, "every row stopped before the switch (change the seed)"
    for t in trajs:
        n = len(t.response_ids)
        assert t.token_versions == [0] * min(n, 4) + [1] * max(n - 4, 0)  # d // 4 under K = 2
        assert t.policy_version == 0  # the first (oldest) token's version
        lp0, lp1 = _teacher_forced(v0, t), _teacher_forced(v1, t)
        # the first segment was sampled by version 0 (prefill and cache all version 0's)
        torch.testing.assert_close(torch.tensor(t.rollout_logprobs[:4]), torch.tensor(lp0[:4]), atol=1e-4, rtol=0)
        if n > 4 and recompute:  # the prefix re-prefilled by version 1: exactly version 1's log-probs
            torch.testing.assert_close(torch.tensor(t.rollout_logprobs[4:]), torch.tensor(lp1[4:n]), atol=1e-4,
                                       rtol=0)
    if not recompute:  # the kept KV cache is version 0's: the later tokens' log-probs are neither policy's own
        t = long[0]
        assert max(abs(a - b) for a, b in zip(t.rollout_logprobs[4:], _teacher_forced(v1, t)[4:])) > 1e-3


# ---------------------------------------------------------------------------- CLI runs


def test_staleness_two_run_samples_by_policy_step_minus_k_and_logs_the_histogram(tmp_path: Path):
    assert main(["-q", "train", "--run-dir", str(tmp_path / "k2"), *RUN, "train.steps=5", "eval.every=2",
                 "rollout.max_staleness=2"]) == 0
    rows = _rows(tmp_path / "k2")
    # batch s is sampled by policy max(0, s - 2); the staleness (lag) is min(s, 2), never more than K = 2
    assert [r["rollout/policy_version"] for r in rows] == [0, 0, 0, 1, 2]
    assert [r["rollout/policy_lag"] for r in rows] == [0, 1, 2, 2, 2]
    assert [r["rollout/staleness_max"] for r in rows] == [0, 1, 2, 2, 2]
    assert [r["rollout/staleness_hist/2"] for r in rows] == [0, 0, 1, 1, 1]
    assert rows[0]["rollout/staleness_hist/0"] == 1.0
    assert rows[0]["actor/ratio"] == pytest.approx(1.0, abs=1e-5)  # step 0 is on-policy
    assert all(r["rollout/logprob_abs_diff"] > 1e-4 for r in rows[1:])


def test_staleness_one_with_the_pipeline_equals_one_step_off_token_for_token(tmp_path: Path):
    """K = 1 with partial rollouts runs the pipeline (no switch falls inside a batch): the same tokens, log-probs
    and metrics as the one-step-off Prefetch (no evaluation between the steps: one-step-off's evaluations draw
    from the engine's key stream, the pipeline's partial rollouts have their own)."""
    args = [*RUN, "train.steps=4", "eval.every=0", "log.rollouts_every=1"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "old"), *args, "rollout.one_step_off=true"]) == 0
    assert main(["-q", "train", "--run-dir", str(tmp_path / "new"), *args, "rollout.max_staleness=1",
                 "rollout.partial=true"]) == 0
    assert _dumps(tmp_path / "old") == _dumps(tmp_path / "new")
    old, new = _rows(tmp_path / "old"), _rows(tmp_path / "new")
    assert old == new and [r["rollout/policy_lag"] for r in new] == [0, 1, 1, 1]


def test_partial_run_trains_with_behaviour_ratios_of_mixed_version_tokens(tmp_path: Path, monkeypatch):
    """K = 2, partial: the PPO ratio is exp(logprobs - behaviour log-probs), token by token."""
    import credo.recipes.step as step
    from credo.algo import masked_mean
    from credo.train.forward import batched_logprobs

    seen = []
    real = step.update_policy

    def checked(opts, model, batch, *a, **kw):
        current, _ = batched_logprobs(model, batch, micro_batch_size=None, temperature=batch.temperature)
        metrics = real(opts, model, batch, *a, **kw)
        # behaviour: old_logprobs are the sampler's; one optimizer step per batch, so the logged ratio is the
        # token mean of exp(current - behaviour) before the step, over the rows the update keeps (a nonzero
        # advantage: train.skip_zero_advantage)
        assert torch.equal(batch.old_logprobs, batch.rollout_logprobs)
        live = ((batch.advantages != 0) & batch.response_mask.bool()).any(-1, keepdim=True)  # (B, 1)
        expected = float(masked_mean((current - batch.rollout_logprobs).exp(), batch.response_mask * live))
        seen.append((metrics["actor/ratio"], expected))
        return metrics

    monkeypatch.setattr(step, "update_policy", checked)  # the step's policy update (credo/recipes/step.py)
    assert main(["-q", "train", "--run-dir", str(tmp_path / "p"), *RUN, "train.steps=4", "eval.every=0",
                 "rollout.max_staleness=2", "rollout.partial=true"]) == 0
    assert len(seen) == 4
    for logged, expected in seen:
        assert logged == pytest.approx(expected, abs=1e-5)
    rows = _rows(tmp_path / "p")
    # batch 2 (step 2): tokens 0-3 by version 0 (age 2), 4-7 by version 1 (age 1): both bins are filled
    assert 0 < rows[2]["rollout/staleness_hist/1"] < 1 and 0 < rows[2]["rollout/staleness_hist/2"] < 1
    assert all(r["rollout/staleness_max"] <= 2 for r in rows)


def test_staleness_zero_equals_the_synchronous_loop(tmp_path: Path):
    """issue 37's cross-mode equivalence: rollout.max_staleness=0 is the synchronous loop, not a pipeline with no
    lag: the same sampled tokens and behaviour log-probs, metrics rows and final weights as a run that never names
    the key. It catches a K = 0 that starts the async pipeline or Prefetch (an extra key-stream draw, evaluations
    sampled from another engine state, a lag of one), or that logs async-only metrics."""
    from safetensors.torch import load_file

    args = [*RUN, "train.steps=3", "eval.every=2", "log.rollouts_every=1"]
    assert main(["-q", "train", "--run-dir", str(tmp_path / "sync"), *args]) == 0
    assert main(["-q", "train", "--run-dir", str(tmp_path / "k0"), *args, "rollout.max_staleness=0"]) == 0
    assert load_config(None, ["rollout.max_staleness=0"]).rollout.one_step_off is False
    assert _dumps(tmp_path / "sync") == _dumps(tmp_path / "k0") and len(_dumps(tmp_path / "k0")) == 3 * 16
    sync, k0 = _rows(tmp_path / "sync"), _rows(tmp_path / "k0")
    assert len(k0) == 3 and sync == k0
    assert not any(k.startswith("rollout/staleness") for r in k0 for k in r)  # no async-only metrics
    assert all(r.get("rollout/policy_lag", 0) == 0 for r in k0)
    a, b = (load_file(next((tmp_path / r / "final").glob("*.safetensors"))) for r in ("sync", "k0"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
