"""AttnRL (seed-algorithms.md §9): steps, FCI, branch points, adaptive counts, tree advantages (arithmetic in
comments), the FCI pass on a real model, tree building, and a short run of the preset through the CLI."""
from __future__ import annotations

import json
import math

import pytest
import torch

from credo.algo import compute_advantages
from credo.methods.attnrl.algo import (
    Tree,
    TreePath,
    branch_budget,
    branch_points,
    ema,
    fci_from_step_attention,
    fci_scores,
    next_batch_size,
    running_mean,
    segment_steps,
    select_responses,
    step_attention,
    step_weights,
    tree_advantages,
    tree_values,
)
from credo.types import Example, RewardResult, Trajectory
from tests.conftest import TINY_RUN

# ----------------------------------------------------------------------------- steps

def test_segment_steps_separators_and_fallbacks():
    # a step ends after every token containing a blank line; the separator belongs to the step it ends
    assert segment_steps(["a", "b\n\n", "c", "\n\n", "d"]) == [(0, 2), (2, 4), (4, 5)]
    # a single newline is not a blank line: only "\n\n" counts while one occurs anywhere
    assert segment_steps(["a", "\n", "b", "\n\n", "c"]) == [(0, 4), (4, 5)]
    # fallback 1: no blank line -> single newlines
    assert segment_steps(["a", "\n", "b", "c", "\n"]) == [(0, 2), (2, 5)]
    # fallback 2: no newline at all -> every token is a step
    assert segment_steps(["a", "b", "c"]) == [(0, 1), (1, 2), (2, 3)]
    # fixed chunks (credo's character tasks)
    assert segment_steps(["a"] * 5, step_tokens=2) == [(0, 2), (2, 4), (4, 5)]
    assert segment_steps([]) == []


# ----------------------------------------------------------------------------- FCI

def _attention() -> torch.Tensor:
    """(L=1, H=2, S=6, S=6); token 0 = prompt, steps [1,2) [2,3) [3,5) [5,6)."""
    head0 = torch.tensor([
        [1.0, 0, 0, 0, 0, 0],
        [0.5, 0.5, 0, 0, 0, 0],
        [0.2, 0.3, 0.5, 0, 0, 0],
        [0.1, 0.2, 0.3, 0.4, 0, 0],
        [0.1, 0.1, 0.4, 0.2, 0.2, 0],
        [0.1, 0.1, 0.1, 0.1, 0.1, 0.5],
    ])
    head1 = torch.tril(torch.ones(6, 6)) / torch.arange(1, 7).unsqueeze(-1)  # uniform causal: row i is 1/(i+1)
    return torch.stack([head0, head1]).unsqueeze(0)


SPANS = [(0, 1), (1, 2), (2, 3), (3, 5), (5, 6)]  # step 0 = the prompt


def test_step_attention_hand_computed():
    alpha = step_attention(_attention(), step_weights(SPANS, 6))[0, 0]  # head 0, (K, K) query step first
    # alpha^{3,2} = mean over queries {3, 4} of the attention to key 2 = (0.3 + 0.4) / 2 = 0.35
    assert alpha[3, 2].item() == pytest.approx(0.35)
    # alpha^{3,3} = mean over queries {3,4} x keys {3,4} = (0.4 + 0 + 0.2 + 0.2) / 4 = 0.2
    assert alpha[3, 3].item() == pytest.approx(0.2)
    # alpha^{4,3} = (0.1 + 0.1) / 2 = 0.1; alpha^{2,1} = 0.3
    assert alpha[4, 3].item() == pytest.approx(0.1)
    assert alpha[2, 1].item() == pytest.approx(0.3)


def test_fci_scores_hand_computed():
    # ignore = 1: y^k = sum_{j >= k+1} alpha^{j,k}
    # head 0: y^2 = alpha^{3,2} + alpha^{4,2} = 0.35 + 0.1 = 0.45; y^3 = alpha^{4,3} = 0.1; y^4 = 0
    # head 1: alpha^{3,2} = (1/4 + 1/5) / 2 = 0.225, alpha^{4,2} = 1/6 -> y^2 = 0.391667; y^3 = alpha^{4,3} = 1/6
    # max over heads: y^2 = 0.45 (head 0), y^3 = 1/6 (head 1); y^0 = y^1 = 0 by definition (y^1 would be 0.45)
    y = fci_scores(_attention(), SPANS, ignore=1)
    torch.testing.assert_close(y, torch.tensor([0.0, 0.0, 0.45, 1 / 6, 0.0]))
    # ignore = 2: y^2 = alpha^{4,2}: head 0 0.1, head 1 1/6 -> 1/6; y^3 needs step 5: 0
    torch.testing.assert_close(fci_scores(_attention(), SPANS, ignore=2), torch.tensor([0.0, 0.0, 1 / 6, 0.0, 0.0]))
    # the end-of-thinking step and the later ones score 0
    torch.testing.assert_close(fci_scores(_attention(), SPANS, ignore=1, stop_step=3),
                               torch.tensor([0.0, 0.0, 0.45, 0.0, 0.0]))
    # y ignores the query step's own diagonal and earlier queries: ignore = 0 adds alpha^{k,k}
    y0 = fci_from_step_attention(step_attention(_attention(), step_weights(SPANS, 6)), ignore=0)[0, 0]
    assert y0[3].item() == pytest.approx(0.2 + 0.1)  # alpha^{3,3} + alpha^{4,3}


def test_fci_pass_matches_the_model_attentions(tiny_model):
    """The hooked eager pass equals fci_scores on the attentions transformers returns, padded rows included, and the
    model's attention kernel is restored afterwards."""
    from credo.methods.attnrl.fci import fci_forward

    model, tok = tiny_model
    prompts = [[1, 20, 21, 22], [1, 23]]
    responses = [[30, 31, 32, 33, 34, 2], [35, 36, 37]]
    spans = [[(0, 2), (2, 3), (3, 6)], [(0, 1), (1, 2), (2, 3)]]
    before = model.config._attn_implementation
    got = fci_forward(model, prompts, responses, spans, pad_id=tok.pad_token_id, ignore=1, micro_batch=2)
    assert model.config._attn_implementation == before
    model.set_attn_implementation("eager")
    try:
        for p, r, s, y in zip(prompts, responses, spans, got):
            ids = torch.tensor([p + r])
            with torch.no_grad():
                attn = torch.stack([a[0] for a in model(input_ids=ids, output_attentions=True).attentions])
            seq_spans = [(0, len(p))] + [(len(p) + a, len(p) + b) for a, b in s]
            torch.testing.assert_close(y, fci_scores(attn, seq_spans, ignore=1)[1:], atol=1e-5, rtol=1e-4)
    finally:
        model.set_attn_implementation(before)
    assert got[0][0] == 0 and got[0][1:].sum() > 0  # the first response step scores 0


# ----------------------------------------------------------------------------- branch points

ONE_TOKEN = [(k, k + 1) for k in range(7)]


def test_branch_points_quantile_index_order_spacing_and_fallback():
    scores = [0.0, 0.9, 0.1, 0.8, 0.95, 0.2, 0.85]
    # 0.8-quantile of the sorted scores [0, .1, .2, .8, .85, .9, .95]: position 0.8 * 6 = 4.8 -> .85 + .8 (.05) = .89
    # candidates >= .89: steps 1 (.9) and 4 (.95), taken in index order (not score order)
    assert branch_points(scores, ONE_TOKEN, num=2, min_position=0, min_gap=0) == [1, 4]
    # spacing: step 4 starts 4 - 2 = 2 tokens after step 1 ends (< 3): rejected; fallback: steps 1, 2, ... not chosen
    assert branch_points(scores, ONE_TOKEN, num=2, min_position=0, min_gap=3) == [1, 2]
    # minimum position: step 1 starts at 0 + 1 < 3: rejected, step 4 kept, then the fallback's first step 1
    assert branch_points(scores, ONE_TOKEN, num=2, min_position=3, min_gap=0) == [4, 1]
    # the position counts the prompt (offset 2): 2 + 1 >= 3
    assert branch_points(scores, ONE_TOKEN, num=2, min_position=3, min_gap=0, offset=2) == [1, 4]
    # the first response step is never a candidate, even with the top score: quantile of [0, .5, 1, 1] at
    # position 2.4 = 1.0 -> candidates 0 and 2 -> step 2
    assert branch_points([1.0, 0.0, 1.0, 0.5], ONE_TOKEN[:4], num=1, min_position=0, min_gap=0) == [2]


def test_branch_points_zero_threshold_short_responses_and_repeats():
    # 0.8-quantile of [0]*5 + [.5] is 0 (position 4): the threshold becomes the smallest positive score
    assert branch_points([0, 0, 0, 0, 0, 0.5], ONE_TOKEN[:6], num=2, min_position=0, min_gap=0) == [5, 1]
    assert branch_points([0.0], [(0, 3)], num=2) == []  # one step: nothing to branch from
    # two steps, two points: step 1 twice (the reference repeats steps when there are too few)
    assert branch_points([0.0, 0.3], [(0, 2), (2, 4)], num=2, min_position=0, min_gap=0) == [2, 2]
    # multi-token steps: the branch point is the step's first token
    assert branch_points([0.0, 0.1, 0.9], [(0, 3), (3, 5), (5, 9)], num=1, min_position=0, min_gap=0) == [5]


# ----------------------------------------------------------------------------- adaptive sampling

def test_branch_budget_and_response_selection():
    # ceil(6 e^{-a}): a=1 -> ceil(2.207) = 3; a=0 -> 6; a=1/2 -> ceil(3.639) = 4; a=5/6 -> ceil(2.607) = 3;
    # a=1/6 -> ceil(5.079) = 6
    assert [branch_budget(k, 6) for k in (6, 0, 3, 5, 1)] == [3, 6, 4, 3, 6]
    assert branch_budget(6, 6, mode="uniform") == 6
    gen = torch.Generator().manual_seed(0)
    assert select_responses([True] * 6, 3, gen) == [0, 1, 2]  # all correct: the first 3
    assert select_responses([False] * 6, 6, gen) == list(range(6))  # all wrong: every response
    correct = [True, True, False, True, False, True]  # a = 4/6 >= 0.5: the incorrect ones are the minority
    for seed in range(5):
        chosen = select_responses(correct, branch_budget(4, 6), torch.Generator().manual_seed(seed))
        assert len(chosen) == 4 and {2, 4} <= set(chosen) and set(chosen) - {2, 4} <= {0, 1, 3, 5}
    # a = 1/6 < 0.5: the one correct response, topped up with 5 of the 5 incorrect ones
    assert select_responses([False, True, False, False, False, False], 6, gen) == list(range(6))
    # running mean over every value: (1 + 2) / 2, then (1.5 * 2 + 4) / 3
    mean, count = running_mean(None, 0, [1.0, 2.0])
    assert (mean, count) == (1.5, 2)
    assert running_mean(mean, count, [4.0]) == (pytest.approx(7 / 3), 3)


def test_dynamic_batch_size():
    # B' = ceil(0.1 floor(16 * 480 / 240) + 0.9 * 16) = ceil(3.2 + 14.4) = 18
    assert next_batch_size(16, 240.0, target=480.0, beta=0.1) == 18
    # too many rows shrink it: ceil(0.1 floor(16 * 480 / 960) + 14.4) = ceil(15.2) = 16; 2000 rows: ceil(14.7) = 15
    assert next_batch_size(16, 960.0, target=480.0) == 16
    assert next_batch_size(16, 2000.0, target=480.0) == 15
    assert ema(None, 5.0, 1.0) == 5.0 and ema(5.0, 7.0, 1.0) == 7.0 and ema(5.0, 7.0, 0.5) == 6.0


# ----------------------------------------------------------------------------- tree advantages

def _hand_tree() -> Tree:
    """root 0; response A = segment 1 -> segment 2 (leaf, 1); branches under 1: leaf 3 (0) and leaf 5 (1);
    response B unbranched: leaf 4 (0)."""
    tree = Tree()
    for parent in (0, 1, 1, 0, 1):  # nodes 1..5
        tree.add(parent)
    tree.leaf_rewards.update({2: 1.0, 3: 0.0, 4: 0.0, 5: 1.0})
    return tree


def test_tree_values_and_advantages_hand_computed():
    tree = _hand_tree()
    values, leaves = tree_values(tree.parents, tree.leaf_rewards)
    # V_root = (1 + 0 + 0 + 1) / 4 = 0.5; node 1 holds leaves {2, 3, 5}: V = 2/3
    assert values[0] == 0.5 and leaves[0] == 4
    assert values[1] == pytest.approx(2 / 3) and leaves[1] == 3
    adv = tree_advantages(tree.parents, tree.leaf_rewards)
    # node 1: ((2/3 - 1/2) + (2/3 - 1/2)) / sqrt(3) = (1/3) / 1.7320508 = 0.1924501
    assert adv[1] == pytest.approx((1 / 3) / math.sqrt(3))
    # leaf 2: (1 - 1/2) + (1 - 2/3) = 0.8333; leaf 3: (0 - 1/2) + (0 - 2/3) = -1.1667; leaf 5 = leaf 2
    assert adv[2] == pytest.approx(5 / 6) and adv[5] == pytest.approx(5 / 6)
    assert adv[3] == pytest.approx(-7 / 6)
    # leaf 4 hangs under the root: (0 - 1/2) + (0 - 1/2) = -1; the root gets nothing
    assert adv[4] == pytest.approx(-1.0) and adv[0] == 0.0


def test_attnrl_estimator_paints_segments_without_normalisation():
    tree = _hand_tree()
    paths = [TreePath(tree, (1, 2), ((0, 2), (2, 5))), TreePath(tree, (1, 3), ((0, 2), (2, 4)))]
    mask = torch.tensor([[1.0] * 5 + [0.0], [1.0] * 4 + [0.0, 0.0]])
    out = compute_advantages("attnrl", rewards=torch.tensor([1.0, 0.0]), group_ids=torch.zeros(2, dtype=torch.long),
                             response_mask=mask, tree_paths=paths)
    a1 = (1 / 3) / math.sqrt(3)
    expected = torch.tensor([[a1, a1, 5 / 6, 5 / 6, 5 / 6, 0.0], [a1, a1, -7 / 6, -7 / 6, 0.0, 0.0]])
    torch.testing.assert_close(out.advantages, expected)
    assert out.metrics["attnrl/trees"] == 1.0
    with pytest.raises(ValueError, match="needs tree_paths"):
        compute_advantages("attnrl", rewards=torch.zeros(2), group_ids=torch.zeros(2), response_mask=mask)


# ----------------------------------------------------------------------------- trees from rollouts

def _traj(response: list[int], prompt=(1, 5)) -> Trajectory:
    return Trajectory(example=Example("p", "a"), group_id=0, prompt_ids=list(prompt), response_ids=list(response),
                      rollout_logprobs=[-0.1 * (i + 1) for i in range(len(response))],
                      response_mask=[1] * len(response), finish_reason="eos")


def test_build_trees_paths_share_prefixes_and_tile_the_response():
    from credo.methods.attnrl.collector import Branch, Problem, build_trees

    a, b = _traj([10, 11, 12, 13, 14, 2]), _traj([20, 21, 2])
    problem = Problem([a, b], [RewardResult(1.0, correct=True), RewardResult(0.0)])
    branches = []
    for offset, cont, score in ((2, [40, 41, 2], 0.0), (4, [50, 2], 1.0), (2, [60, 2], 1.0)):
        full = dataclasses_replace(a, a.response_ids[:offset] + cont)
        branches.append(Branch(0, 0, offset, full, RewardResult(score, correct=score == 1.0)))
    rows = build_trees([problem], branches, set())[0]
    # response a's own path first, then its three branches; response b is unbranched: not trained
    assert len(rows) == 4
    paths = [t.info["tree_path"] for t, _ in rows]
    tree = paths[0].tree
    # nodes: 1 = a[0:2], 2 = a[2:4], 3 = a[4:6] (leaf 1.0); a's branches: 4 (under 1, 0.0), 5 (under 2, 1.0),
    # 6 (under 1, 1.0); then b = 7 under the root (leaf 0.0)
    assert tree.parents == [-1, 0, 1, 2, 1, 2, 1, 0]
    assert tree.leaf_rewards == {3: 1.0, 4: 0.0, 5: 1.0, 6: 1.0, 7: 0.0}
    assert paths[0].nodes == (1, 2, 3) and paths[0].spans == ((0, 2), (2, 4), (4, 6))
    assert paths[1].nodes == (1, 4) and paths[1].spans == ((0, 2), (2, 5))
    assert paths[2].nodes == (1, 2, 5) and paths[2].spans == ((0, 2), (2, 4), (4, 6))
    assert paths[3].nodes == (1, 6) and paths[3].spans == ((0, 2), (2, 4))
    for (t, _), path in zip(rows, paths):
        assert path.spans[0][0] == 0 and path.spans[-1][1] == len(t.response_ids)  # spans tile the response
        assert all(x[1] == y[0] for x, y in zip(path.spans, path.spans[1:]))
        assert t.response_ids[:path.spans[0][1]] == a.response_ids[:2]  # the shared prefix, token for token
        assert t.rollout_logprobs[:2] == a.rollout_logprobs[:2]
    # train_unbranched adds b's one-node path
    assert len(build_trees([problem], branches, set(), train_unbranched=True)[0]) == 5


def dataclasses_replace(traj: Trajectory, ids: list[int]) -> Trajectory:
    """``traj`` with response ``ids`` whose first two tokens (the branch prefix) keep their log-probs."""
    import dataclasses

    logprobs = traj.rollout_logprobs[:2] + [0.0] * (len(ids) - 2)
    return dataclasses.replace(traj, response_ids=ids, rollout_logprobs=logprobs, response_mask=[1] * len(ids))


def test_plan_branches_easy_filter_and_counts():
    from types import SimpleNamespace

    from credo.methods.attnrl.collector import Problem, plan_branches

    def problem(correct, fci):
        trajs = [_traj([10, 11, 12, 13]) for _ in correct]
        p = Problem(trajs, [RewardResult(float(c), correct=c) for c in correct])
        p.spans = [[(k, k + 1) for k in range(4)] for _ in correct]
        p.fci = [torch.tensor([0.0, fci, 0.0, fci / 2]) for _ in correct]
        return p

    a = SimpleNamespace(num_splits=2, branch_samples=2, quantile=0.8, min_position=0, min_gap=0, budget="exp",
                        easy_filter=True)
    # two all-correct problems, mean FCI 0.375 * 0.4 = 0.15 and 0.375 * 0.1 = 0.0375 -> running mean 0.09375:
    # the first is branched (3 responses), the second dropped; an all-wrong one branches all 4 of its responses
    problems = [problem([True] * 4, 0.4), problem([True] * 4, 0.1), problem([False] * 4, 0.2)]
    state: dict = {}
    branches, dropped = plan_branches(problems, a, state, n=4, generator=torch.Generator().manual_seed(0))
    assert dropped == {1}
    assert state["fci_mean"] == pytest.approx((0.15 + 0.0375) / 2) and state["fci_count"] == 2
    # budget for 4/4 correct: ceil(4 e^-1) = ceil(1.47) = 2 responses; for 0/4: 4; 2 points x 2 samples each
    per_problem = {q: {b.response for b in branches if b.problem == q} for q in (0, 2)}
    assert per_problem == {0: {0, 1}, 2: {0, 1, 2, 3}}
    assert len(branches) == (2 + 4) * 2 * 2
    # scores [0, f, 0, f/2]: the 0.8-quantile is f/2 + 0.4 (f/2) = 0.7 f, so step 1 is the only candidate and the
    # sequential fallback adds step 2
    assert {b.offset for b in branches} == {1, 2}


# ----------------------------------------------------------------------------- config and the CLI

def test_config_refusals():
    from credo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="rollout.collector.type=tree"):
        load_config(None, ["algo.advantage=attnrl"])
    with pytest.raises(ConfigError, match="algo.filter_groups"):
        load_config("attnrl", ["algo.filter_groups=true"])
    with pytest.raises(ConfigError, match="distributed.rollout"):
        load_config("attnrl", ["distributed.backend=torchrun"])
    cfg = load_config("attnrl", ["rollout.one_step_off=true"])  # in-process hf engine: supported
    assert cfg.rollout.collector.type == "tree" and cfg.algo.advantage == "attnrl"


def test_preset_runs_through_the_cli(tmp_path):
    from credo.cli.main import main

    run = tmp_path / "run"
    assert main(["-q", "train", "--config", "attnrl", "--run-dir", str(run), *TINY_RUN, "rollout.group_size=4",
                 "train.steps=2", "eval.every=0", "log.report=false", "log.tensorboard=false",
                 "reward.name=tests.reward_fixtures:length_score", "attnrl.max_prompts=6"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2
    for r in steps:
        assert r["tree/continuations"] > 0 and r["tree/paths"] > 0 and "actor/pg_loss" in r
        assert r["tree/leaves"] == r["tree/prompts"] * 4 + r["tree/continuations"]
        assert "attnrl/trees" in r and r["advantages/abs_mean"] > 0
    assert steps[1]["tree/prompts"] == steps[0]["tree/next_prompts"]  # the dynamic batch size is used
