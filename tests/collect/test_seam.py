"""The collector seam and registry (credo.collect.base, credo.collect.registry, credo.recipes.stages), the token
selections as batch transforms (credo.train.transforms), the batch's sampling record and the rollout coordinator
of the distributed modes (credo.distributed.coordinator)."""
from __future__ import annotations

import types

import pytest
import torch

from credo.collect.agent import AgentCollector
from credo.collect.base import CollectorNeeds
from credo.collect.group import GroupCollector
from credo.config import load_config
from credo.train.data_parallel import LOCAL
from credo.distributed.coordinator import RolloutCoordinator
from credo.methods.attnrl.collector import TreeCollector
from credo.methods.rlep.collector import ReplayCollector
from credo.methods.vepo.select import VepoSelector
from credo.recipes.stages import build_collector
from credo.models.batch import collate
from credo.train.transforms import BuildContext, TopEntropyTokens, build_transforms
from credo.types import Example, RewardResult, Rollouts, SamplingParams, Trajectory


def _traj(gid: int, info: dict | None = None) -> Trajectory:
    return Trajectory(example=Example("p", "a"), group_id=gid, prompt_ids=[1, 2], response_ids=[3, 4],
                      rollout_logprobs=[-0.5, -0.25], response_mask=[1, 1], finish_reason="eos", info=info or {})


class _Sampler:
    def __init__(self) -> None:
        self.drawn = 0

    def next_batch(self, n: int):
        self.drawn += n
        return [Example(f"p{i}", "a") for i in range(n)]

    def state_dict(self):
        return {"drawn": self.drawn}

    def load_state_dict(self, state) -> None:
        self.drawn = state["drawn"]


def _build(cfg, tmp_path):
    return build_collector(cfg, engine=None, runner=None, model=None, tokenizer=None,
                           data=types.SimpleNamespace(stage_train=[["x"]], train=[]), sampler=_Sampler(),
                           run_dir=tmp_path)


def test_collate_records_how_the_batch_was_sampled():
    batch = collate([_traj(0), _traj(0, {"replay": "positive"})], [RewardResult(1.0)] * 2, pad_id=0,
                    temperature=0.7)
    assert batch.temperature == 0.7
    assert batch.extra("sampled").tolist() == [True, False]  # the replayed row was not sampled by the engine
    assert batch.select(torch.tensor([1])).extra("sampled").tolist() == [False]
    assert collate([_traj(0)], [RewardResult(0.0)], pad_id=0).temperature == 1.0


def test_the_factory_chooses_the_collector_once_from_the_config(tmp_path):
    assert type(_build(load_config(), tmp_path)) is GroupCollector
    assert type(_build(load_config("attnrl"), tmp_path)) is TreeCollector
    assert type(_build(load_config("agent_calc"), tmp_path)) is AgentCollector
    replay = _build(load_config("rlep"), tmp_path)
    assert type(replay) is ReplayCollector and type(replay.inner) is GroupCollector
    # replay.pool=warm_start: no pool before start() collected it, so nothing needs the old-log-prob pass yet
    assert replay.pool is None and replay.needs == CollectorNeeds()
    replay.pool = object()
    assert replay.needs.old_logprob_pass


def test_token_selections_are_policy_phase_transforms_that_declare_their_reads(tmp_path):
    def policy_transforms(cfg):
        return [t for t in build_transforms(BuildContext(cfg, None, None, tmp_path)) if t.phase == "policy"]

    assert policy_transforms(load_config()) == []  # token_select.type=none: nothing between advantages and update
    cfg = load_config(None, ["token_select.type=entropy", "token_select.top_fraction=0.2"])
    assert policy_transforms(cfg) == [TopEntropyTokens(0.2)] and TopEntropyTokens(0.2).reads == ("entropy",)
    assert policy_transforms(load_config(None, ["token_select.type=entropy", "token_select.top_fraction=1.0"])) == []
    [vepo] = policy_transforms(load_config("vepo"))
    assert type(vepo.selector) is VepoSelector and "old_logprobs" in vepo.reads


class _Engine:
    def __init__(self) -> None:
        self.versions: list[int] = []

    def update_weights(self, weights, *, version: int) -> None:
        self.versions.append(version)

    def state_dict(self):
        return {"versions": list(self.versions)}


class _Collector:
    needs = CollectorNeeds()

    def __init__(self) -> None:
        self.steps: list[int] = []

    def collect(self, step: int, timer) -> Rollouts:
        self.steps.append(step)
        return Rollouts([_traj(0)], [RewardResult(1.0)], {}, sampling=SamplingParams(temperature=0.5))


def test_coordinator_syncs_once_per_version_and_prefetches_the_next_step():
    from credo.tracking.timer import Timer

    engine, collector = _Engine(), _Collector()
    coord = RolloutCoordinator(LOCAL, one_step_off=True, steps=3)
    coord.attach(model=torch.nn.Linear(1, 1), engine=engine, runner=None, collector=collector)
    assert not coord.follower and coord.engine_seed(5) == 5 and coord.sampler("s") == "s"
    with pytest.raises(RuntimeError, match="before sync_weights"):
        coord.collect(0, Timer())  # the step's first line is its weight sync (credo/recipes/step.py)
    coord.sync_weights(0, Timer())
    coord.collect(0, Timer())
    coord.evaluate(lambda: None, 0)  # waits for the batch in flight; the version is served already
    assert engine.versions == [0] and collector.steps == [0, 1]
    saved = coord.state_dict()
    assert saved["pending_rollouts"].sampling.temperature == 0.5 and saved["engine"] == {"versions": [0]}
    coord.sync_weights(1, Timer())  # finishes the batch in flight, then serves version 1
    coord.collect(1, Timer())  # the prefetched batch; step 2 starts generating
    coord.idle()
    assert engine.versions == [0, 1] and collector.steps == [0, 1, 2]
