"""Ray rollout and reward pools (credo.distributed.ray_pools) on a local Ray instance: exact sampling whatever
the number of workers, versioned weight sync, dead workers replaced and their shares re-queued."""
from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

from credo.distributed.ray_launch import start_local  # noqa: E402
from credo.config.schema import GuardsConfig  # noqa: E402
from credo.distributed.ray_pools import RewardPool, RolloutPool, split  # noqa: E402
from credo.guards import GuardError, Guards  # noqa: E402
from credo.guards.weights import check_weight_sync  # noqa: E402
from credo.rewards import RewardRunner  # noqa: E402
from credo.rollout import HFRolloutEngine  # noqa: E402
from credo.types import Example, SamplingParams  # noqa: E402

PROMPTS = [Example("rev abc=", "cba", "a"), Example("rev hgfedc=", "cdefgh", "b"), Example("12+3=", "15", "c"),
           Example("rev xy=", "yx", "d"), Example("rev pqrs=", "srqp", "e")]


@pytest.fixture(scope="module")
def local_ray():
    start_local(ray, num_cpus=8, log_to_driver=False)  # ray.init(_node_ip_address="127.0.0.1"): loopback only
    yield
    ray.shutdown()


def test_split_gives_contiguous_near_equal_shares():
    assert [(s.start, s.stop) for s in split(5, 2)] == [(0, 3), (3, 5)]
    assert [(s.start, s.stop) for s in split(2, 3)] == [(0, 1), (1, 2)]  # no empty shares
    assert split(0, 2) == []


@pytest.mark.ray
def test_rollout_pool_samples_what_one_engine_samples_recovers_a_dead_worker_and_syncs_weights(local_ray, tiny_model):
    model, tok = tiny_model
    sp = SamplingParams(max_new_tokens=6, temperature=1.3)
    engine = HFRolloutEngine(model, tok, seed=11)
    # worker 1 dies at the start of its second generate call (the second batch below)
    pool = RolloutPool(model, tok, workers=2, seed=11, faults={1: 2})
    try:
        for _ in range(2):  # two calls: the per-call keys advance identically
            want = engine.generate(PROMPTS, 3, sp)
            got = pool.generate(PROMPTS, 3, sp)
            assert [t.response_ids for t in got] == [t.response_ids for t in want]
            assert [t.group_id for t in got] == [t.group_id for t in want]  # 0..4, three samples each
            for a, b in zip(got, want):
                torch.testing.assert_close(torch.tensor(a.rollout_logprobs), torch.tensor(b.rollout_logprobs),
                                           rtol=0, atol=1e-5)
        assert pool.restarts == 1  # the second call's share was re-queued on the replacement
        # seeded calls (evaluation) and the token-level API (agent loops) agree too
        seeded = SamplingParams(max_new_tokens=6, seed=5)
        assert [t.response_ids for t in pool.generate(PROMPTS, 2, seeded)] == \
            [t.response_ids for t in engine.generate(PROMPTS, 2, seeded)]
        prefixes = [engine.encode(p.prompt) for p in PROMPTS]
        assert [c.ids for c in pool.continue_ids(prefixes, sp, top_logprobs=2)] == \
            [c.ids for c in engine.continue_ids(prefixes, sp, top_logprobs=2)]
        assert pool.state_dict()["generator"].equal(engine.state_dict()["generator"])
        _check_weight_sync(pool, model, tok)
    finally:
        pool.close()


def _check_weight_sync(pool: RolloutPool, model, tok) -> None:
    """Weight sync changes what the workers sample, to exactly the new policy, and versions each trajectory."""
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    before = pool.generate(PROMPTS, 1, greedy)
    assert {t.policy_version for t in before} == {0}
    with torch.no_grad():  # a different policy: the trainer's "update"
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    assert [t.response_ids for t in pool.generate(PROMPTS, 1, greedy)] == [t.response_ids for t in before]
    pool.update_weights(model, version=7)
    after = pool.generate(PROMPTS, 1, greedy)
    assert {t.policy_version for t in after} == {7}
    assert [t.response_ids for t in after] != [t.response_ids for t in before]
    local = HFRolloutEngine(model, tok).generate(PROMPTS, 1, greedy)  # exactly the trainer's new policy
    assert [t.response_ids for t in after] == [t.response_ids for t in local]
    # the weight_sync guard checks every worker (it used to skip the pool: a silent no-op of guards.weight_sync)
    guards = Guards(GuardsConfig(weight_sync="error"))
    check_weight_sync(guards, model, pool, 7)
    assert guards.checks["weight_sync"] == 1 and guards.trips["weight_sync"] == 0
    with torch.no_grad():  # trained again, never synced: the workers serve stale weights
        next(model.parameters()).add_(0.5)
    with pytest.raises(GuardError, match="rollout worker 0: .* differs"):
        check_weight_sync(guards, model, pool, 8)


@pytest.mark.ray
def test_reward_pool_scores_like_one_runner_and_recovers_a_dead_worker(local_ray):
    responses = ["cba", "x", "15", "yx", "srqp", "no", "cdefgh"]
    examples = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3], PROMPTS[4], PROMPTS[0], PROMPTS[1]]
    kwargs = dict(name_or_path="exact_match", executor="inline")
    with RewardRunner(**kwargs) as runner:
        want = [(r.score, r.correct) for r in runner.score(responses, examples)]
    with RewardPool(kwargs, workers=3, faults={0: 1, 2: 2}) as pool:
        for _ in range(2):
            assert [(r.score, r.correct) for r in pool.score(responses, examples)] == want
        assert pool.restarts == 2  # worker 0 died in the first call, worker 2 in the second
        assert want == [(1.0, True), (0.0, False), (1.0, True), (1.0, True), (1.0, True), (0.0, False), (1.0, True)]
    with pytest.raises(KeyError):
        RewardPool(dict(name_or_path="no_such_verifier"), workers=1)
