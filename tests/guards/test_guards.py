"""Runtime guards (credo.guards): finite_logprobs, first_ratio, counters in metrics.jsonl / TensorBoard, the CLI's
one-line guard error."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from credo.cli.main import main
from credo.config import load_config
from credo.guards import Guards, GuardError, GuardsConfig
from credo.guards.logprobs import (FIRST_RATIO_METRIC, check_behaviour_logprobs, check_first_ratio, on_policy,
                                   ratio_deviation)
from credo.rollout import HFRolloutEngine
from credo.rollout.agent_loop import Episode
from credo.rollout.vllm_transport import InProcessVLLM, ServerVLLM, per_token
from credo.tracking.metrics import read_metrics
from credo.models.batch import collate
from credo.train.update import UpdateOptions, update_policy
from credo.train.optim import build_optimizer, build_scheduler
from credo.types import Example, RewardResult, SamplingParams, Trajectory
from tests.conftest import TINY_COLD

NAN = float("nan")
RUN = [*TINY_COLD, "warm_start.enabled=false", "eval.every=0", "log.progress=false", "log.report=false",
       "log.tensorboard=false", "reward.name=tests.reward_fixtures:length_score"]


def _traj(ids, logprobs, mask=None, *, info=None, version=0) -> Trajectory:
    return Trajectory(example=Example("p", "a"), group_id=0, prompt_ids=[5, 6], response_ids=list(ids),
                      rollout_logprobs=list(logprobs), response_mask=list(mask or [1] * len(ids)),
                      finish_reason="eos", info=dict(info or {}), policy_version=version)


def _rows(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if "reward/mean" in r]


# ----------------------------------------------------------------------------- finite_logprobs: no zero-filling

def test_collate_marks_missing_behaviour_logprobs_nan_and_zeroes_the_rest():
    trajs = [_traj([1, 2, 3], [-0.5]),  # the engine returned one log-prob for three tokens
             _traj([1, 2, 3], [-0.1, None, -0.3], mask=[1, 1, 0]),  # a None entry; a non-loss token
             _traj([4, 5], [0.0, 0.0], info={"replay": "positive"})]  # a replayed answer: the trainer's later
    batch = collate(trajs, [RewardResult(0.0)] * 3, pad_id=0)
    lp = batch.rollout_logprobs
    assert lp[0, 0] == -0.5 and lp[0, 1:].isnan().all()
    assert lp[1, 0] == pytest.approx(-0.1) and lp[1, 1].isnan() and lp[1, 2] == 0.0  # mask 0: no NaN
    assert (lp[2] == 0.0).all() and not batch.extra("sampled")[2]  # unsampled row and padding: 0.0
    with pytest.raises(ValueError, match="4 rollout log-probs for a response of 3 tokens"):
        collate([_traj([1, 2, 3], [-1.0] * 4)], [RewardResult(0.0)], pad_id=0)


def test_vllm_transport_and_agent_loop_never_zero_fill_a_sampled_token():
    assert per_token([-0.5, None], 3)[0] == -0.5 and all(math.isnan(x) for x in per_token([-0.5, None], 3)[1:])
    assert per_token([-1.0, -2.0, -3.0], 2) == [-1.0, -2.0]
    # vLLM returned no log-probs at all (a request without logprobs, an engine that drops them)
    comp = SimpleNamespace(token_ids=[7, 8], logprobs=None, finish_reason="stop")
    sample = InProcessVLLM._sample(comp, 0)
    assert sample.ids == [7, 8] and all(math.isnan(x) for x in sample.logprobs)
    # a position whose entry lacks the sampled token
    comp = SimpleNamespace(token_ids=[7, 8], logprobs=[{7: SimpleNamespace(logprob=-0.25)}, {9: None}],
                           finish_reason="length")
    got = InProcessVLLM._sample(comp, 0).logprobs
    assert got[0] == -0.25 and math.isnan(got[1])
    # the OpenAI-compatible server: a null entry and a list shorter than the completion
    server = object.__new__(ServerVLLM)
    server.model_name = "m"
    server.weights = SimpleNamespace(post=lambda route, body: {"choices": [
        {"token_ids": [7, 8, 9], "logprobs": {"token_logprobs": [-0.1, None]}, "finish_reason": "length"}]})
    got = server._complete_one([1, 2], {"logprobs": 0}).logprobs
    assert got[0] == -0.1 and math.isnan(got[1]) and math.isnan(got[2]) and len(got) == 3
    ep = Episode(Example("p", "a"), 0, client=None, task_id=0)
    ep.add([1, 2], 0)  # a template / observation token: no behaviour log-prob needed
    ep.add([3], 1)  # a loss token added without log-probs
    ep.add([4], 1, [-0.7])
    assert ep.logprobs[:2] == [0.0, 0.0] and math.isnan(ep.logprobs[2]) and ep.logprobs[3] == -0.7


def test_finite_logprobs_errors_by_default_and_warn_drops_the_tokens_from_the_loss():
    trajs = [_traj([1, 2, 3], [-0.5, NAN, float("-inf")]), _traj([1, 2], [-0.2, -0.3])]
    batch = collate(trajs, [RewardResult(0.0)] * 2, pad_id=0)
    with pytest.raises(GuardError) as err:
        check_behaviour_logprobs(Guards(), batch)
    text = str(err.value)
    assert "\n" not in text and text.startswith("guard finite_logprobs: 2 of 5 sampled response tokens (1 rows)")
    assert "(1 missing/NaN, 1 inf)" in text and "guards.finite_logprobs=warn" in text
    guards = Guards(GuardsConfig(finite_logprobs="warn"))
    batch = collate(trajs, [RewardResult(0.0)] * 2, pad_id=0)
    assert check_behaviour_logprobs(guards, batch) == 2
    assert guards.metrics()["guard/finite_logprobs_trips"] == 1.0
    assert batch.response_mask.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]  # the two tokens left the loss
    assert torch.isfinite(batch.rollout_logprobs).all()
    clean = collate(trajs[1:], [RewardResult(0.0)], pad_id=0)
    assert check_behaviour_logprobs(guards, clean) == 0 and guards.checks["finite_logprobs"] == 2
    off = Guards(GuardsConfig(finite_logprobs="off"))
    batch = collate(trajs, [RewardResult(0.0)] * 2, pad_id=0)
    assert check_behaviour_logprobs(off, batch) == 2 and off.metrics() == {}  # no check, but no NaN in a loss
    assert torch.isfinite(batch.rollout_logprobs).all()


def test_an_engine_returning_a_nan_logprob_stops_training_with_a_one_line_guard_error(tmp_path, monkeypatch,
                                                                                       capsys):
    original = HFRolloutEngine.generate

    def nan_engine(self, prompts, n, sampling, *args, **kwargs):
        trajs = original(self, prompts, n, sampling, *args, **kwargs)
        trajs[-1].rollout_logprobs[0] = NAN  # as vLLM returning None for one token
        return trajs

    monkeypatch.setattr(HFRolloutEngine, "generate", nan_engine)
    capsys.readouterr()
    assert main(["-q", "train", "--run-dir", str(tmp_path / "r"), *RUN, "train.steps=2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("credo: guard error: guard finite_logprobs: 1 of ") and "(1 missing/NaN, 0 inf)" in err[-1]


# ----------------------------------------------------------------------------- first_ratio

def test_ratio_deviation_and_the_on_policy_condition():
    lp = torch.tensor([[0.0, math.log(2.0), 5.0]])
    ro = torch.tensor([[0.0, 0.0, NAN]])
    # tokens 0, 1 in the mask: |e^0 - 1| = 0, |e^ln2 - 1| = 1 -> mean 0.5 (token 2, NaN, is outside the mask)
    assert ratio_deviation(lp, ro, torch.tensor([[1.0, 1.0, 0.0]])) == pytest.approx(0.5)
    assert ratio_deviation(lp, ro, torch.zeros(1, 3)) == 0.0
    assert on_policy([_traj([1], [0.0], version=3)] * 2, 3)
    assert not on_policy([_traj([1], [0.0], version=3), _traj([1], [0.0], version=2)], 3)  # one stale row


def test_first_ratio_checks_only_on_policy_steps_against_the_tolerance(caplog):
    guards = Guards()  # first_ratio: warn, ratio_tol 1e-3
    fresh = [_traj([1], [0.0], version=4)]
    check_first_ratio(guards, {FIRST_RATIO_METRIC: 5e-4}, fresh, step=4)
    assert guards.checks["first_ratio"] == 1 and guards.trips["first_ratio"] == 0
    check_first_ratio(guards, {FIRST_RATIO_METRIC: 0.2}, fresh, step=5)  # stale rows (lag 1): not checked
    check_first_ratio(guards, {}, fresh, step=4)  # no policy update this step: nothing measured
    assert guards.checks["first_ratio"] == 1
    check_first_ratio(guards, {FIRST_RATIO_METRIC: 0.2}, fresh, step=4)
    assert guards.trips["first_ratio"] == 1 and "0.2 > guards.ratio_tol=0.001" in caplog.text
    with pytest.raises(GuardError, match="first_ratio: on an on-policy step"):
        check_first_ratio(Guards(GuardsConfig(first_ratio="error")), {FIRST_RATIO_METRIC: NAN}, fresh, step=4)


@pytest.mark.parametrize("shift", [0.0, 0.1])
def test_the_update_reports_the_first_mini_batchs_ratio_against_the_sampler(tiny_model, shift):
    model, tok = tiny_model
    engine = HFRolloutEngine(model, tok, seed=0)
    trajs = engine.generate([Example(f"rev {s}=", s[::-1]) for s in ("abc", "dcba")], 4,
                            SamplingParams(max_new_tokens=6))
    batch = collate(trajs, [RewardResult(float(i % 3)) for i in range(8)], pad_id=tok.pad_token_id)
    batch.rollout_logprobs = batch.rollout_logprobs + shift * batch.response_mask  # a sampler off by `shift`
    batch.advantages = torch.linspace(-1, 1, 8)[:, None] * batch.response_mask
    cfg = load_config(None, ["train.prompts_per_step=2", "rollout.group_size=4", "train.mini_batch_size=4",
                             "train.ppo_epochs=2", "train.warmup_steps=0"])
    opt = build_optimizer(model, lr=1e-2)
    metrics = update_policy(UpdateOptions.of(cfg), model, batch, opt, build_scheduler(opt, warmup_steps=0,
                                                                                      total_steps=4), step=0)
    # fused pass (no old_logprobs): only the first of the 4 mini-batches is measured, before any optimizer step;
    # there the trainer's log-probs equal the sampler's (HF engine, fp32, ~1e-7), so the deviation is
    # |exp(-shift) - 1|: 0 or 1 - e^-0.1 = 0.09516
    assert metrics[FIRST_RATIO_METRIC] == pytest.approx(1.0 - math.exp(-shift), abs=1e-5)


def test_ordinary_runs_trip_no_guard_and_a_temperature_mismatch_trips_first_ratio(tmp_path, monkeypatch):
    # an ordinary on-policy run, fused pass and (mini-batches) with the pass: every counter 0
    for name, extra in (("fused", []), ("pass", ["train.mini_batch_size=8"])):
        assert main(["-q", "train", "--run-dir", str(tmp_path / name), *RUN, "train.steps=2", *extra]) == 0
        rows = _rows(tmp_path / name)
        assert len(rows) == 2 and all(r["guard/finite_logprobs_trips"] == 0 == r["guard/first_ratio_trips"]
                                      for r in rows)
        assert all(r[FIRST_RATIO_METRIC] < 1e-5 for r in rows)
    original = HFRolloutEngine.generate

    def hot_engine(self, prompts, n, sampling, *args, **kwargs):  # samples at T=2, the trainer assumes T=1
        return original(self, prompts, n, dataclasses.replace(sampling, temperature=2.0), *args, **kwargs)

    monkeypatch.setattr(HFRolloutEngine, "generate", hot_engine)
    assert main(["-q", "train", "--run-dir", str(tmp_path / "hot"), *RUN, "train.steps=2"]) == 0  # warn: continues
    rows = _rows(tmp_path / "hot")
    assert [r["guard/first_ratio_trips"] for r in rows] == [1.0, 2.0]  # cumulative over the run
    assert all(r[FIRST_RATIO_METRIC] > 1e-2 for r in rows)
    assert main(["-q", "train", "--run-dir", str(tmp_path / "hot_err"), *RUN, "train.steps=2",
                 "guards.first_ratio=error"]) == 1


def test_first_ratio_is_not_checked_on_one_step_off_steps(tmp_path):
    # steps 1.. train on the previous policy's samples (lag 1): a deviation there is the policy lag, not a bug
    assert main(["-q", "train", "--run-dir", str(tmp_path / "r"), *RUN, "train.steps=3", "rollout.one_step_off=true",
                 "guards.first_ratio=error", "guards.ratio_tol=1e-4", "train.lr=1e-2"]) == 0
    rows = _rows(tmp_path / "r")
    assert [r["rollout/policy_lag"] for r in rows] == [0, 1, 1]
    assert rows[0][FIRST_RATIO_METRIC] < 1e-4 < rows[2][FIRST_RATIO_METRIC]
    assert all(r["guard/first_ratio_trips"] == 0 for r in rows)


def test_a_guard_turns_off_from_the_command_line_and_from_yaml(tmp_path):
    # YAML reads `off` as False: a field whose choices name "off" takes it back as the word
    assert load_config(None, ["guards.first_ratio=off"]).guards.first_ratio == "off"
    preset = tmp_path / "p.yaml"
    preset.write_text("guards: {finite_logprobs: off, tool_calls: warn}\n")
    cfg = load_config(str(preset), [])
    assert (cfg.guards.finite_logprobs, cfg.guards.tool_calls, cfg.guards.first_ratio) == ("off", "warn", "warn")
    assert not Guards(cfg.guards).enabled("finite_logprobs")


def test_guard_counters_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "r"
    assert main(["-q", "train", "--run-dir", str(run), *(a for a in RUN if a != "log.tensorboard=false"),
                 "train.steps=1"]) == 0
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"guard/finite_logprobs_trips", "guard/first_ratio_trips", FIRST_RATIO_METRIC} <= tags, tags
