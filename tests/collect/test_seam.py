"""The collector and token-selector seams (credo.collect.base, credo.train.token_select, credo.recipes.stages), the
batch's sampling record and the rollout coordinator of the distributed modes (credo.distributed.coordinator)."""
from __future__ import annotations

import types

import torch

from credo.collect.agent import AgentCollector
from credo.collect.base import CollectorNeeds
from credo.collect.group import GroupCollector, Rollouts
from credo.config import load_config
from credo.distributed import LOCAL
from credo.distributed.coordinator import RolloutCoordinator
from credo.methods.attnrl.collector import TreeCollector
from credo.methods.rlep.collector import ReplayCollector
from credo.methods.vepo.select import VepoSelector
from credo.recipes.stages import COLLECTOR_KEY, build_collector, build_token_selector, collector_state
from credo.models.batch import collate
from credo.train.token_select import AllTokens, EntropySelector
from credo.types import Example, RewardResult, SamplingParams, Trajectory


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
    assert batch.sampled.tolist() == [True, False]  # the replayed row was not sampled by the engine
    assert batch.select(torch.tensor([1])).sampled.tolist() == [False]
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


def test_token_selectors_declare_their_needs():
    cfg = load_config(None, ["token_select.type=entropy", "token_select.quantile=0.2"])
    assert type(build_token_selector(load_config(), None, None)) is AllTokens
    entropy = build_token_selector(cfg, None, None)
    assert entropy == EntropySelector(0.2) and entropy.needs.old_logprob_pass
    assert not EntropySelector(1.0).needs.old_logprob_pass  # keeps every token
    vepo = build_token_selector(load_config("vepo"), None, None)
    assert type(vepo) is VepoSelector and vepo.needs.old_logprob_pass
    assert not AllTokens().needs.old_logprob_pass


def test_collector_state_reads_checkpoints_written_before_the_seam(tmp_path):
    legacy = {"run": {"step": 2, "attnrl": {"batch_size": 3}}, "sampler": {"drawn": 8},
              "stage_samplers": [], "replay": None}
    state = collector_state(legacy)
    assert state == {"sampler": {"drawn": 8}, "stage_samplers": [], "replay": None, "attnrl": {"batch_size": 3}}
    tree = _build(load_config("attnrl"), tmp_path)
    tree.load_state_dict(state)
    assert tree.sampler.drawn == 8 and tree.state == {"batch_size": 3}
    assert collector_state({COLLECTOR_KEY: tree.state_dict()}) == tree.state_dict() == {
        "sampler": {"drawn": 8}, "attnrl": {"batch_size": 3}}


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
    from credo.train.stats import Timer

    engine, collector = _Engine(), _Collector()
    coord = RolloutCoordinator(LOCAL, one_step_off=True, steps=3, sampling=SamplingParams(temperature=0.9))
    coord.attach(model=torch.nn.Linear(1, 1), engine=engine, runner=None, collector=collector)
    assert not coord.follower and coord.engine_seed(5) == 5 and coord.sampler("s") == "s"
    coord.collect(0, Timer())
    coord.evaluate(lambda: None, 0)  # waits for the batch in flight; the version is served already
    assert engine.versions == [0] and collector.steps == [0, 1]
    saved = coord.state_dict()
    assert saved["pending_rollouts"].sampling.temperature == 0.5 and saved["engine"] == {"versions": [0]}
    coord.collect(1, Timer())  # the prefetched batch; step 2 starts generating
    coord.idle()
    assert engine.versions == [0, 1] and collector.steps == [0, 1, 2]
    # a pending batch saved before the rollouts recorded their sampling gets the run's
    old = RolloutCoordinator(LOCAL, sampling=SamplingParams(temperature=0.9))
    old.attach(model=None, engine=None, runner=None, collector=collector)
    old.load_state_dict({"pending_rollouts": Rollouts([_traj(0)], [RewardResult(0.0)])})
    assert old.pending.wait().sampling.temperature == 0.9
