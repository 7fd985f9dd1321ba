"""ARPO / AEPO branching rollouts: budget, exact prefix sharing, seeded reproducibility, AEPO's split."""
from __future__ import annotations

import math

import pytest
import torch

from credo.envs import LocalEnvClient
from credo.rollout import HFRolloutEngine
from credo.rollout.agent_loop import AgentLoop, plain_template, segment_entropy
from credo.rollout.branching import branched_rollouts
from credo.types import Example, SamplingParams


def _setup(tiny_model, max_turns=4):
    model, tok = tiny_model
    engine = HFRolloutEngine(model, tok, seed=0)
    loop = AgentLoop(engine, tok, plain_template(tok), max_turns=max_turns, max_tokens_per_turn=5, threads=1,
                     top_logprobs=10)
    examples = [Example(prompt=f"maze:{i}", answer="", uid=str(i), meta={"env": "maze", "task_id": i}) for i in range(3)]
    return loop, examples


def _run(loop, examples, method, seed, **args):
    return branched_rollouts(loop, examples, 6, SamplingParams(temperature=1.0), lambda ex: LocalEnvClient("maze"),
                             method=method, generator=torch.Generator().manual_seed(seed), branch_on="any", **args)


@pytest.mark.parametrize("method", ["arpo", "aepo"])
def test_budget_prefix_sharing_and_determinism(tiny_model, method):
    loop, examples = _setup(tiny_model)
    trajs, results, stats = _run(loop, examples, method, seed=1, branch_probability=0.9)
    assert len(trajs) == len(results) == 3 * 6  # the budget is filled and never exceeded
    for g in range(3):
        assert sum(t.group_id == g for t in trajs) == 6
    branches = [t for t in trajs if t.info["branched_from"] is not None]
    assert branches and stats["branch/branches"] == len(branches)
    for b in branches:
        group = [t for t in trajs if t.group_id == b.group_id]
        src = group[b.info["branched_from"]]
        k = b.info["fork_at"]
        assert k > 0 and b.prompt_ids == src.prompt_ids
        assert b.response_ids[:k] == src.response_ids[:k]  # the shared prefix, token for token
        assert b.response_mask[:k] == src.response_mask[:k] and b.rollout_logprobs[:k] == src.rollout_logprobs[:k]
        assert b.response_mask[k - 1] == 0  # the branch point is right after an environment observation
    # seeded: the same generator seed gives the same rollouts
    loop2, _ = _setup(tiny_model)
    loop2.engine.generator.manual_seed(0)
    loop.engine.generator.manual_seed(0)
    a = _run(loop, examples, method, seed=5, branch_probability=0.9)[0]
    b = _run(loop2, examples, method, seed=5, branch_probability=0.9)[0]
    assert [t.response_ids for t in a] == [t.response_ids for t in b]


def test_no_branching_at_probability_zero(tiny_model):
    loop, examples = _setup(tiny_model)
    trajs, _, stats = _run(loop, examples, "arpo", seed=2, branch_probability=0.0, entropy_weight=0.0,
                           initial_rollouts=2)
    assert stats["branch/branches"] == 0 and stats["branch/global"] == 6 and stats["branch/fill"] == 12
    assert len(trajs) == 18


def test_aepo_budget_split_is_within_bounds(tiny_model):
    loop, examples = _setup(tiny_model)
    _, _, stats = _run(loop, examples, "aepo", seed=3, aepo_beta=5.0)
    assert 1 <= stats["branch/initial_mean"] <= 6


def test_unknown_branching_parameter_is_rejected(tiny_model):
    loop, examples = _setup(tiny_model)
    with pytest.raises(TypeError, match="no parameter"):
        _run(loop, examples, "arpo", seed=0, aepo_beta=1.0)


def test_segment_entropy_is_arpos_sum_over_top_k():
    # two tokens, top-2 log-probs each ln(0.5): -sum p log p = 4 * 0.5 ln 2 = 2 ln 2; / ln |V| (|V| = 4)
    class Tok:
        def __len__(self):
            return 4

    lp = torch.full((2, 2), math.log(0.5))
    assert segment_entropy(lp, Tok()) == pytest.approx(2 * math.log(2) / math.log(4))
    assert segment_entropy(torch.full((30, 1), math.log(0.5)), Tok(), max_tokens=20) == pytest.approx(
        20 * 0.5 * math.log(2) / math.log(4))


def _fake_state(method_params: dict, draws: list[float]):
    """A branching state over one prompt with one episode whose entropies are set by hand; ``_u`` replays
    ``draws`` and ``_fork`` copies the episode without an environment."""
    from types import SimpleNamespace

    from credo.rollout.branching import AEPO_DEFAULTS, _State

    st = _State(loop=None, examples=[None], n=8, sampling=None, client_factory=None,
                params={**AEPO_DEFAULTS, **method_params}, gen=None)
    ep = SimpleNamespace(done=False, tool_calls=1, turn_entropy=[1.0, 1.0])
    st.groups = [[ep]]
    it = iter(draws)
    st._u = lambda: next(it)
    st._fork = lambda src, g: SimpleNamespace(done=True, tool_calls=1, turn_entropy=list(src.turn_entropy))
    return st, ep


def test_aepo_consecutive_branch_penalty():
    # entropy change 0 -> base branch probability 0.5; penalty 0.5 -> 0.5 * (1 - 0.5)^k after k consecutive
    # branching rounds. One draw u per round (beam_size 2: at most one branch per episode per round).
    st, ep = _fake_state({"branch_probability": 0.5, "entropy_weight": 0.2, "consecutive_penalty": 0.5},
                         [0.3, 0.3, 0.3, 0.2, 0.2, 0.2])
    made = []
    for _ in range(6):
        before = len(st.groups[0])
        st._branch([ep], aepo=True)
        made.append(len(st.groups[0]) - before)
    # round 1: p 0.5, u 0.3 -> branch; round 2: p 0.25, u 0.3 -> no (the streak resets); round 3: p 0.5 -> branch;
    # round 4: p 0.25, u 0.2 -> branch; round 5: p 0.125, u 0.2 -> no; round 6: p 0.5 -> branch
    assert made == [1, 0, 1, 1, 0, 1]
    # ARPO has no such penalty: the same draws branch every round
    st, ep = _fake_state({"branch_probability": 0.5, "entropy_weight": 0.2}, [0.3, 0.3, 0.3])
    for _ in range(3):
        st._branch([ep], aepo=False)
    assert len(st.groups[0]) == 4


def test_arpo_branch_probability_follows_the_entropy_change():
    # H_init 1.0, H_t 2.0, weight 0.2: p = clip(0.5 + 0.2 * 1.0) = 0.7 -> u 0.69 branches, u 0.71 does not
    for u, expected in ((0.69, 1), (0.71, 0)):
        st, ep = _fake_state({"branch_probability": 0.5, "entropy_weight": 0.2}, [u])
        ep.turn_entropy = [1.0, 2.0]
        st._branch([ep], aepo=False)
        assert len(st.groups[0]) - 1 == expected


def test_decision_stats_hand_computed():
    from credo.rollout.branching import decision_stats

    # (H_t, dH, branches made, consecutive rounds before); median H_t of the four decisions = (0.4 + 0.6) / 2 = 0.5
    rows = [(0.2, -0.1, 0, 0), (0.4, 0.0, 1, 0), (0.6, 0.3, 0, 1), (0.8, 0.5, 1, 1)]
    out = decision_stats(rows)
    assert out["branch/decisions"] == 4
    assert out["branch/entropy_branched"] == pytest.approx((0.4 + 0.8) / 2)
    assert out["branch/entropy_unbranched"] == pytest.approx((0.2 + 0.6) / 2)
    assert out["branch/dH_branched"] == pytest.approx((0.0 + 0.5) / 2)
    assert out["branch/dH_unbranched"] == pytest.approx((-0.1 + 0.3) / 2)
    assert out["branch/above_median_branched"] == pytest.approx(0.5)  # 0.8 is above 0.5, 0.4 is not
    assert out["branch/above_median_unbranched"] == pytest.approx(0.5)  # 0.6 is, 0.2 is not
    assert out["branch/consecutive_share"] == pytest.approx(0.5)  # the 0.8 decision followed a branching round
    # no branch taken: the branched-side keys are left out, not zero
    none = decision_stats([(0.3, 0.0, 0, 0)])
    assert none == {"branch/decisions": 1.0, "branch/entropy_unbranched": 0.3, "branch/dH_unbranched": 0.0,
                    "branch/above_median_unbranched": 0.0}  # the only H_t is the median, not above it
    assert decision_stats([]) == {"branch/decisions": 0.0}


def test_branch_decisions_are_recorded_with_their_entropy_and_streak():
    # three rounds of one AEPO episode with H_init 1.0, H_t 2.0: p = 0.7, then 0.7 * 0.5 = 0.35 after a branch
    st, ep = _fake_state({"branch_probability": 0.5, "entropy_weight": 0.2, "consecutive_penalty": 0.5},
                         [0.6, 0.6, 0.6])
    ep.turn_entropy = [1.0, 2.0]
    for _ in range(3):
        st._branch([ep], aepo=True)
    # round 1: u 0.6 < 0.7 branches (streak 0); round 2: 0.6 >= 0.35 no (streak 1); round 3: streak reset, branches
    assert st.decisions == [(2.0, 1.0, 1, 0), (2.0, 1.0, 0, 1), (2.0, 1.0, 1, 0)]
    stats = st.stats()
    assert stats["branch/decisions"] == 3 and stats["branch/consecutive_share"] == 0.0
    assert stats["branch/dH_branched"] == pytest.approx(1.0)


def test_real_rollouts_log_their_branch_decisions(tiny_model):
    loop, examples = _setup(tiny_model)
    _, _, stats = _run(loop, examples, "arpo", seed=1, branch_probability=0.9)
    assert stats["branch/decisions"] >= stats["branch/branches"] > 0  # beam 2: at most one branch per decision
    assert 0.0 <= stats["branch/above_median_branched"] <= 1.0
