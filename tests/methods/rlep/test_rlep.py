"""RLEP experience replay: pool collection and files, group mixing, advantages over the mixed group, the CLI."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from credo.algo import compute_advantages
from credo.methods.rlep.pool import (
    ReplayEntry,
    ReplayOptions,
    ReplayPool,
    collect_pool,
    mix_replay,
    refresh_entries,
    replay_rows,
    step_rng,
)
from credo.types import Example, RewardResult, SamplingParams, Trajectory
from tests.conftest import TINY_RUN


class Tok:
    """Characters a.. are ids 3..; EOS 2, pad 0."""
    pad_token_id, eos_token_id = 0, 2

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) - 94 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i + 94) for i in ids if i > 2)


class ExactRunner:
    def __init__(self):
        self.calls = 0

    def score(self, texts, examples):
        self.calls += 1
        return [RewardResult(float(t == e.answer), correct=t == e.answer) for t, e in zip(texts, examples)]


class ScriptedEngine:
    """Sample k of prompt g is ``answers[g][k]``."""

    def __init__(self, answers):
        self.answers = answers

    def generate(self, examples, n, sampling):
        out = []
        for g, ex in enumerate(examples):
            for k in range(n):
                text = self.answers[ex.uid][k]
                out.append(Trajectory(example=ex, group_id=g, prompt_ids=[1, 3], response_ids=Tok()(text)["input_ids"]
                                      + [2], rollout_logprobs=[-0.5] * (len(text) + 1), response_mask=[1] * (len(text) + 1),
                                      finish_reason="eos", response_text=text, policy_version=7))
        return out


EXS = [Example("rev ab=", "ba", uid="t/0"), Example("rev cd=", "dc", uid="t/1"), Example("rev ef=", "fe", uid="t/2")]


def test_collect_keeps_verified_answers_of_prompts_with_enough_of_them():
    engine = ScriptedEngine({"t/0": ["ba", "ba", "ab", "ba"],  # 3 correct -> stored
                             "t/1": ["dc", "cd", "cc", "dd"],  # 1 correct < 2 -> not stored
                             "t/2": ["ee", "ff", "ef", "fe"]})  # 1 correct -> not stored
    entries, stats = collect_pool(engine, ExactRunner(), EXS, samples=4, sampling=SamplingParams(temperature=0.7),
                                  min_correct=2, source={"model": "ckpt"}, chunk_prompts=2)
    assert [(e.uid, e.response, e.source["sample_index"]) for e in entries] == [("t/0", "ba", 0), ("t/0", "ba", 1),
                                                                                ("t/0", "ba", 3)]
    assert all(e.correct and e.source["model"] == "ckpt" and e.source["temperature"] == 0.7 for e in entries)
    assert stats["stored_prompts"] == 1 and stats["stored_answers"] == 3
    assert stats["sampled_accuracy"] == pytest.approx(5 / 12)
    # with negatives: every failed answer of every prompt is kept too, marked incorrect
    entries, stats = collect_pool(engine, ExactRunner(), EXS, samples=4, sampling=SamplingParams(), min_correct=2,
                                  keep_negatives=True)
    assert stats["stored_negatives"] == 7 and sum(e.correct for e in entries) == 3


def test_pool_file_round_trip_and_malformed_rows(tmp_path: Path):
    pool = ReplayPool([ReplayEntry("t/0", "rev ab=", "ba", True, 1.0, {"model": "m"}),
                       ReplayEntry("t/0", "rev ab=", "ab", False, 0.0)])
    pool.save(tmp_path / "pool.jsonl")
    with (tmp_path / "pool.jsonl").open("a") as f:
        f.write("not json\n")
        f.write(json.dumps({"prompt": "x"}) + "\n")  # no response
        f.write(json.dumps({"prompt": "x", "response": "y", "correct": "yes"}) + "\n")
        f.write("\n")
    again = ReplayPool.load(tmp_path / "pool.jsonl")
    assert again.bad_rows == 3 and len(again) == 2
    assert [e.response for e in again.stored("t/0")] == ["ba"]
    assert [e.response for e in again.stored("t/0", correct=False)] == ["ab"]
    assert again.stored("t/0")[0].source == {"model": "m"}
    with pytest.raises(FileNotFoundError, match="rlep collect"):
        ReplayPool.load(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text("nope\n")
    with pytest.raises(ValueError, match="no valid rows"):
        ReplayPool.load(tmp_path / "bad.jsonl")


def _fresh(n=3):
    """n fresh samples per prompt for t/0 (group 0) and t/1 (group 1), none correct."""
    trajs = ScriptedEngine({"t/0": ["aa"] * n, "t/1": ["cc"] * n}).generate(EXS[:2], n, SamplingParams())
    return trajs, [RewardResult(0.0) for _ in trajs]


def _pool():
    # t/0 has 3 stored answers, t/1 has 1, and one stored failure each
    return ReplayPool([ReplayEntry("t/0", "", "ba", True, 1.0, {"i": i}) for i in range(3)]
                      + [ReplayEntry("t/1", "", "dc", True, 1.0), ReplayEntry("t/0", "", "bb", False, 0.0),
                         ReplayEntry("t/1", "", "cd", False, 0.0)])


def test_mixing_adds_only_existing_answers_and_scores_them():
    trajs, results = _fresh()
    runner = ExactRunner()
    out_t, out_r, m = mix_replay(trajs, results, _pool(), Tok(), runner, opts=ReplayOptions(num=2, max_new_tokens=8),
                                 rng=random.Random(0))
    sizes = {g: sum(t.group_id == g for t in out_t) for g in (0, 1)}
    assert sizes == {0: 3 + 2, 1: 3 + 1}  # G' = n + min(M, stored): no filler for t/1's missing slot
    replayed = [t for t in out_t if "replay" in t.info]
    assert all(t.response_ids and t.response_ids[-1] == 2 for t in replayed)  # re-tokenised with EOS, never empty
    assert [t.response_text for t in replayed] == ["ba", "ba", "dc"] and all(r.correct for r in out_r[3:5])
    assert [t.group_id for t in out_t] == [0, 0, 0, 0, 0, 1, 1, 1, 1]  # each group's replays follow its samples
    assert all(t.prompt_ids == [1, 3] and t.policy_version == 7 for t in replayed)
    assert runner.calls == 1 and m["replay/samples"] == 3 and m["replay/short_groups"] == 1
    assert m["replay/empty"] == 0 and m["replay/positive_accuracy"] == 1.0
    assert replay_rows(out_t).tolist() == [False] * 3 + [True] * 2 + [False] * 3 + [True]


def test_mixing_reference_filler_and_negative_replay():
    trajs, results = _fresh()
    out_t, out_r, m = mix_replay(trajs, results, _pool(), Tok(), ExactRunner(),
                                 opts=ReplayOptions(num=2, negative=1, fill_missing=True, max_new_tokens=8),
                                 rng=random.Random(0))
    kinds = [t.info.get("replay") for t in out_t]
    assert kinds == [None] * 3 + ["positive", "positive", "negative"] + [None] * 3 + ["positive", "empty", "negative"]
    empty = out_t[10]
    assert empty.response_ids == [] and empty.response_text == "" and not out_r[10].correct  # scored as a failure
    assert m["replay/empty"] == 1


def test_truncation_to_the_response_budget():
    trajs, results = _fresh(1)
    pool = ReplayPool([ReplayEntry("t/0", "", "abcdef", True, 1.0)])
    out_t, _, _ = mix_replay(trajs, results, pool, Tok(), ExactRunner(), opts=ReplayOptions(num=1, max_new_tokens=4),
                             rng=random.Random(0))
    assert out_t[1].response_ids == [3, 4, 5, 6] and out_t[1].finish_reason == "length"


def test_grpo_advantages_are_normalised_over_the_mixed_group():
    trajs, results = _fresh()
    out_t, out_r, _ = mix_replay(trajs, results, _pool(), Tok(), ExactRunner(), opts=ReplayOptions(num=2),
                                 rng=random.Random(0))
    scores = torch.tensor([r.score for r in out_r])
    mask = torch.ones(len(out_t), 3)
    adv = compute_advantages("grpo", rewards=scores, group_ids=torch.tensor([t.group_id for t in out_t]),
                             response_mask=mask).advantages[:, 0]
    # group 0 = 3 fresh failures + 2 replayed successes: mean 0.4, unbiased std sqrt((3 * 0.16 + 2 * 0.36) / 4)
    std0 = ((3 * 0.16 + 2 * 0.36) / 4) ** 0.5
    torch.testing.assert_close(adv[:5], torch.tensor([-0.4, -0.4, -0.4, 0.6, 0.6]) / (std0 + 1e-6))
    # group 1 = 3 failures + 1 success: mean 0.25, std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5
    torch.testing.assert_close(adv[5:], torch.tensor([-0.25, -0.25, -0.25, 0.75]) / (0.5 + 1e-6))


def test_draws_depend_on_seed_and_step_only_and_refresh_caps():
    pool = ReplayPool([ReplayEntry("t/0", "", s, True, 1.0) for s in "abcdefgh"], max_per_prompt=4)
    draw = lambda rng: [e.response for e in pool.draw("t/0", 3, rng)]
    assert draw(step_rng(0, 5)) == draw(step_rng(0, 5)) and draw(step_rng(0, 5)) != draw(step_rng(0, 6))
    trajs, _ = _fresh(2)
    results = [RewardResult(1.0, correct=True), RewardResult(0.0)] * 2
    added = refresh_entries(trajs, results, step=3)
    assert [(e.uid, e.source["refresh_step"]) for e in added] == [("t/0", 3), ("t/1", 3)]
    pool.add(added)
    assert [e.response for e in pool.stored("t/0")][-1] == "aa" and len(pool.stored("t/0")) == 4  # oldest dropped
    restored = ReplayPool([ReplayEntry("t/0", "", s, True, 1.0) for s in "abcdefgh"], max_per_prompt=4)
    restored.load_state_dict(pool.state_dict())  # a resumed run re-adds what the checkpoint recorded
    assert [e.response for e in restored.stored("t/0")] == [e.response for e in pool.stored("t/0")]


def _reversal_pool(path: Path, n: int) -> None:
    from credo.config import load_config
    from credo.data.source import load_task_data

    data = load_task_data(load_config(None, TINY_RUN).task, seed=0)
    with path.open("w") as f:
        for ex in data.train[:n]:
            for _ in range(2):
                f.write(json.dumps({"uid": ex.uid, "prompt": ex.prompt, "response": ex.answer, "correct": True}) + "\n")


def test_rlep_preset_through_the_cli_replays(tmp_path: Path):
    """The preset replays 2 stored answers per group (a SIGKILL and resume of a refreshed replay run:
    tests/resume/test_matrix.py's replay mode)."""
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics

    _reversal_pool(tmp_path / "pool.jsonl", 64)  # every training prompt has 2 stored right answers
    run = tmp_path / "run"
    args = ["train", "--config", "rlep", "--run-dir", str(run), *TINY_RUN, "train.steps=2", "eval.every=0",
            "checkpoint.every=1", f"replay.pool={tmp_path / 'pool.jsonl'}", "replay.refresh=true", "log.progress=false"]
    assert main(args) == 0
    rows = read_metrics(run / "metrics.jsonl")
    step = rows[1]
    assert step["replay/samples"] == 4 * 2 and step["replay/per_group"] == 2.0 and step["replay/short_groups"] == 0
    assert step["replay/positive_accuracy"] == 1.0
    assert step["reward/mean"] < 1.0  # the fresh samples' own metrics, without the replayed answers


def test_collect_cli_from_a_run_and_warm_start_pool(tmp_path: Path):
    from credo.cli.main import main

    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY_RUN, "train.steps=1", "eval.every=0", "log.progress=false",
                 "reward.name=tests.reward_fixtures:length_score"]) == 0
    out = tmp_path / "pool.jsonl"
    # length_score marks a response correct when it is 8 characters long
    assert main(["rlep", "collect", str(run / "checkpoints" / "step_000001"), "--out", str(out),
                 "replay.collect_samples=3", "replay.collect_prompts=10", "log.progress=false"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    summary = json.loads((tmp_path / "pool.jsonl.summary.json").read_text())
    assert rows and len(rows) == summary["stored_answers"] and summary["prompts"] == 10
    assert all(r["correct"] and len(r["response"]) == 8 for r in rows)
    per_prompt = {u: sum(r["uid"] == u for r in rows) for u in {r["uid"] for r in rows}}
    assert len(per_prompt) == summary["stored_prompts"] and min(per_prompt.values()) >= 2  # collect_min_correct
    assert rows[0]["source"]["model"].endswith("step_000001/model") and rows[0]["source"]["samples"] == 3
    # replay.pool=warm_start: collected inside the run, before RL, into the run directory
    run2 = tmp_path / "run2"
    assert main(["train", "--config", "rlep", "--run-dir", str(run2), *TINY_RUN, "train.steps=1", "eval.every=0",
                 "log.progress=false", "reward.name=tests.reward_fixtures:length_score", "replay.collect_samples=4",
                 "replay.collect_prompts=8"]) == 0
    summary2 = json.loads((run2 / "replay_pool.jsonl.summary.json").read_text())
    assert len((run2 / "replay_pool.jsonl").read_text().splitlines()) == summary2["stored_answers"] > 0
    assert summary2["source"]["model"] == "warm_start"


def test_replay_config_errors():
    from credo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="replays nothing"):
        load_config(None, ["replay.pool=x.jsonl", "replay.num=0"])
    with pytest.raises(ConfigError, match="single-turn"):
        load_config(None, ["replay.pool=x.jsonl", "agent.envs=[calc]"])
    with pytest.raises(ConfigError, match="rlep collect"):
        load_config(None, ["replay.pool=warm_start", "distributed.backend=torchrun"])
