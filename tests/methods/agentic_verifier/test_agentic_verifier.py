"""AgentV-RL's agentic verifier (``seed-algorithms.md`` §18): the reward and the scoring by hand, the ``verify``
environment (deterministic tasks, oracle, sandboxed Python, call cap, missing verdicts), the verifier on a tiny
model through the agent loop, the batch reward, and a tiny ``credo train agent.envs=[verify]`` run."""
from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from credo.envs import EVAL_OFFSET, LocalEnvClient, eval_task_ids, get_env_spec, train_task_ids
from credo.methods.agentic_verifier import env as venv
from credo.methods.agentic_verifier.env import CaseClient, VerifyCase, make_case
from credo.methods.agentic_verifier.reward import (
    AgenticVerifier,
    best_of_n,
    combine,
    final_verdict,
    multistage_reward,
    verdict_logits,
    verdict_probability,
    verdict_token_ids,
    verifier_reward,
)
from credo.types import Example, RewardResult, SamplingParams
from tests.sandbox_util import ONE_POOL_AT_A_TIME, isolation_missing

pytestmark = ONE_POOL_AT_A_TIME  # runs sandboxed programs (tests/sandbox_util.py)


def _sandbox_or_skip(observation: str) -> None:
    """Skip where sandbox isolation cannot exist here; fail where it must, as tests/sandbox_util.py decides."""
    if observation.startswith("error: sandbox unavailable"):
        reason = isolation_missing()
        if reason is None:
            pytest.fail(f"isolation must work here, yet: {observation}")
        pytest.skip(f"{reason}: {observation}")


# ----------------------------------------------------------------------------- scoring, by hand

def test_verdict_probability_is_the_softmax_over_the_pair():
    # 1 / (1 + e^-2) = 1 / 1.135335 = 0.880797
    assert verdict_probability(2.0, 0.0) == pytest.approx(0.880797, abs=1e-6)
    assert verdict_probability(0.0, 2.0) == pytest.approx(0.119203, abs=1e-6)  # 1 - 0.880797
    assert verdict_probability(3.0, 3.0) == 0.5
    # shift invariance: (5, 3) has the same gap as (2, 0)
    assert verdict_probability(5.0, 3.0) == pytest.approx(verdict_probability(2.0, 0.0), abs=1e-12)
    # p_true / (p_true + p_false) from a full softmax over 3 tokens: logits (2, 0, 7) -> the 7 cancels
    z = math.exp(2) + math.exp(0) + math.exp(7)
    assert verdict_probability(2.0, 0.0) == pytest.approx((math.exp(2) / z) / ((math.exp(2) + 1) / z), abs=1e-12)
    assert verdict_probability(1000.0, 0.0) == 1.0 and verdict_probability(-1000.0, 0.0) == 0.0  # no overflow


def test_verdict_logits_read_the_true_and_false_tokens():
    from credo.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    t, f = verdict_token_ids(tok)
    assert tok.decode([t]) == "t" and tok.decode([f]) == "f"  # character tokenizer: first letters
    logits = torch.zeros(3, len(tok))
    logits[-1, t], logits[-1, f] = 2.0, 0.0  # the last position is the verdict position
    logits[0, f] = 9.0  # an earlier position is ignored
    lt, lf = verdict_logits(logits, t, f)
    assert (lt, lf) == (2.0, 0.0)
    assert verdict_probability(lt, lf) == pytest.approx(0.880797, abs=1e-6)


def test_combine_and_final_verdict():
    assert combine(1.0, 0.0) == pytest.approx(0.7)  # 0.7 * 1 + 0.3 * 0
    assert combine(0.5, 1.0) == pytest.approx(0.65)  # 0.35 + 0.3
    assert combine(0.2, 0.6, w_fwd=0.5) == pytest.approx(0.4)  # (0.2 + 0.6) / 2
    assert final_verdict(True, True) is True
    assert final_verdict(True, False) is False and final_verdict(False, True) is False
    assert final_verdict(None, True) is False and final_verdict(False, False) is False


def test_verifier_reward_cases():
    ok = "<subtasks>12+34 =? 46</subtasks> <python>print(12+34)</python> OK: 46 <answer>true</answer>"
    assert verifier_reward(ok, True) == 1.0  # verdict matches the label
    assert verifier_reward(ok, "True") == 1.0 and verifier_reward(ok, "true") == 1.0  # label as text
    assert verifier_reward(ok, False) == -1.0  # wrong
    assert verifier_reward("<subtasks>p</subtasks> no verdict", True) == -1.0  # missing
    assert verifier_reward("<answer>maybe</answer>", True) == -1.0  # unparseable = wrong
    assert verifier_reward(ok, None) == 0.0 and verifier_reward(ok, "n/a") == 0.0  # unknown label
    assert verifier_reward("<answer>True</answer>", True) == 1.0  # the reference accepts True / False too
    # the last <answer> counts
    assert verifier_reward("<answer>false</answer> ... <answer>true</answer>", True) == 1.0
    # bool-reward variant: the verdict must come after a <subtasks> block
    early = "<answer>true</answer> <subtasks>plan</subtasks>"
    assert verifier_reward(early, True) == 1.0  # without the format rule it counts
    assert verifier_reward(early, True, require_plan=True) == -1.0
    assert verifier_reward("<answer>true</answer>", True, require_plan=True) == -1.0  # no plan at all
    assert verifier_reward(ok, True, require_plan=True) == 1.0
    assert verifier_reward(ok, None, require_plan=True) == 0.0


def test_multistage_reward_by_hand():
    plan = "<subtasks>1. recompute 2. compare</subtasks>"
    assert multistage_reward(plan, True, stage="plan", plan_score=0.5) == pytest.approx(0.4)  # 2 (0.2 + 0.5 - 0.5)
    assert multistage_reward("no plan", True, stage="plan", plan_score=0.3) == pytest.approx(-0.4)  # 2 (0 + 0.3 - 0.5)
    right = "<answer>true</answer>"
    assert multistage_reward(right, True, stage="subtask", subtask_label=True) == pytest.approx(1.2)  # 1 + 0.2 x 1
    assert multistage_reward(right, False, stage="subtask", subtask_label=True) == 1.0  # global -1 is not added
    assert multistage_reward(right, True, stage="subtask", subtask_label=False) == pytest.approx(-0.8)  # -1 + 0.2
    assert multistage_reward(right, True, stage="review") == 1.0
    assert multistage_reward(right, True) == -1.0  # stage None: the bool reward (no plan)
    with pytest.raises(ValueError, match="unknown stage"):
        multistage_reward(right, True, stage="nope")


def test_best_of_n_picks_the_highest_combined_score():
    class Fake:
        def score_batch(self, problems, candidates):
            table = {"a": 0.2, "b": 0.9, "c": 0.9, "d": 0.1}
            return [RewardResult(score=table[c]) for c in candidates]

    assert best_of_n(Fake(), "p", ["a", "b", "c", "d"]) == 1  # ties: the first
    assert best_of_n(Fake(), "p", ["d"]) == 0
    with pytest.raises(ValueError):
        best_of_n(Fake(), "p", [])


# ----------------------------------------------------------------------------- the environment

def test_reset_is_deterministic_per_task_id_and_covers_both_labels_and_modes():
    a, b = LocalEnvClient("verify"), LocalEnvClient("verify")
    for tid in (0, 5, EVAL_OFFSET + 3):
        assert a.reset(tid) == b.reset(tid) and a.env.case == b.env.case
    assert a.reset(1) != a.reset(2)
    cases = [make_case(t) for t in train_task_ids(200, seed=0)]
    labels = [c.label for c in cases]
    modes = [c.mode for c in cases]
    assert 60 < sum(labels) < 140 and 60 < modes.count("forward") < 140  # 0.5 / 0.5 per task id
    for c in cases:  # the label is the addition task's own check of the candidate
        x, y = c.problem.rstrip("=").split("+")
        assert c.label == (int(c.candidate) == int(x) + int(y))
        assert c.observation().startswith(f"mode: {c.mode}\nproblem: {c.problem}\ncandidate: ")
    assert {make_case(t, mode="backward").mode for t in range(20)} == {"backward"}
    assert make_case(3, task="reversal").problem.startswith("rev ")


@pytest.mark.parametrize("task", ["addition", "reversal", "countdown"])
def test_the_oracle_gets_plus_one_on_correct_and_corrupted_candidates(task):
    spec = get_env_spec("verify")
    client = LocalEnvClient("verify", task=task)
    seen = set()
    for tid in train_task_ids(12, seed=1) + eval_task_ids(4):
        obs = client.reset(tid)
        for _ in range(4):
            r = client.step(spec.oracle(client.env, obs))
            obs = r.observation
            if r.done:
                break
        assert r.done and r.reward == 1.0 and r.info["success"], (tid, client.env.case)
        assert client.env.python_calls == 1 and client.env.planned
        seen.add(client.env.case.label)
    assert seen == {True, False}


def test_a_python_action_runs_in_the_sandbox():
    client = LocalEnvClient("verify")
    client.reset(0)
    r = client.step("<python>print(12+34)</python>")
    _sandbox_or_skip(r.observation)
    assert r.observation == "OK: 46" and r.info["tool_call"] and not r.done and r.reward == -1.0
    r = client.step("<python>print(1/0)</python>")
    assert r.observation.startswith("RE:") and "ZeroDivisionError" in r.observation and r.info["tool_error"]
    r = client.step("<python>print('x' * 1000)</python>")
    assert r.observation.startswith("OK: xxx") and r.observation.endswith("...") and len(r.observation) <= 160


def test_the_fourth_python_call_is_refused():
    client = LocalEnvClient("verify")
    client.reset(0)
    for _ in range(3):
        r = client.step("<python>print(1)</python>")
        assert "no python calls left" not in r.observation
    r = client.step("<python>print(1)</python>")
    assert r.observation.startswith("error: no python calls left (3 per episode)") and not r.done
    assert client.env.python_calls == 3


def test_sandbox_unavailable_is_an_error_observation(monkeypatch):
    from credo.rewards import code
    from credo.sandbox import SandboxUnavailable

    def unavailable(workers=None, unsafe=False):
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")

    monkeypatch.setattr(code, "shared_sandbox", unavailable)
    monkeypatch.setattr(venv, "_SANDBOX_ERRORS", {})
    monkeypatch.setattr(venv, "_CACHE", OrderedDict())
    client = LocalEnvClient("verify")
    client.reset(0)
    for _ in range(2):  # the first call finds out, the second reuses the finding
        r = client.step("<python>print(1)</python>")
        assert r.observation.startswith("error: sandbox unavailable: bubblewrap (bwrap) is not installed")
        assert not r.done and r.info["tool_error"]
    assert client.step("<answer>true</answer>").done  # the episode goes on to its verdict


def test_plan_rule_unknown_label_and_invalid_turns():
    case = VerifyCase("12+34=", "46", "forward", label=True)
    strict = CaseClient(case, require_plan=True)
    strict.reset(0)
    assert strict.step("<answer>true</answer>").reward == -1.0  # right verdict, but no plan before it
    strict.reset(0)
    assert strict.step("<subtasks>12+34 =? 46</subtasks>").observation == "plan noted"
    assert strict.step("<answer>true</answer>").reward == 1.0
    unknown = CaseClient(VerifyCase("12+34=", "46", "backward"))
    unknown.reset(0)
    assert unknown.step("<answer>false</answer>").reward == 0.0  # label unknown
    lenient = CaseClient(case)
    lenient.reset(0)
    r = lenient.step("no tag at all")  # the env sees it: an invalid turn scores as a missing verdict
    assert r.info["invalid_action"] and r.reward == -1.0 and not r.done


def _scripted(monkeypatch, script):
    """Every continuation becomes ``script(prefix_text)`` followed by EOS."""
    from credo.rollout.hf import Continuation, HFRolloutEngine

    def continue_ids(self, prefixes, sampling, *, stop_ids=(), top_logprobs=0, stop_sequences=(), **_):
        out = []
        for prefix in prefixes:
            ids = list(self.tokenizer(script(self.tokenizer.decode(prefix, skip_special_tokens=True)),
                                      add_special_tokens=False)["input_ids"]) + [self.eos_id]
            out.append(Continuation(ids, [-0.5] * len(ids), "stop"))
        return out

    monkeypatch.setattr(HFRolloutEngine, "continue_ids", continue_ids)


def test_a_missing_verdict_at_the_turn_cap_scores_minus_one(tiny_model, monkeypatch):
    from credo.rollout import HFRolloutEngine
    from credo.rollout.agent_loop import AgentLoop, plain_template, to_trajectory

    model, tok = tiny_model
    _scripted(monkeypatch, lambda prefix: "<subtasks>p</subtasks>" if prefix.count("plan noted") % 2 == 0
              else "garbage")
    loop = AgentLoop(HFRolloutEngine(model, tok), tok, plain_template(tok), max_turns=3, max_tokens_per_turn=40,
                     max_response_tokens=400)
    exs = [Example(prompt="v", answer="", uid=f"v/{i}", meta={"env": "verify", "task_id": i}) for i in range(2)]
    episodes = loop.run(exs, [LocalEnvClient("verify") for _ in exs], [0, 1], SamplingParams(greedy=True))
    for ep in episodes:
        _, result = to_trajectory(ep, tok)
        assert ep.cut == "max_turns" and len(ep.turns) == 3 and result.score == -1.0 and not result.correct
        assert ep.invalid_actions == 2  # turns: plan, garbage, garbage


# ----------------------------------------------------------------------------- the verifier on a tiny model

@pytest.fixture
def wide_model():
    from credo.config import ModelConfig
    from credo.models import build_model

    return build_model(ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                   max_position_embeddings=512), seed=0)


def test_agentic_verifier_reads_p_true_at_the_answer_token(wide_model, monkeypatch):
    model, tok = wide_model

    def script(prefix: str) -> str:  # forward says true, backward says false
        if "plan noted" not in prefix:
            return "<subtasks>check</subtasks>"
        if "OK:" not in prefix and "error:" not in prefix:
            return "<python>print(12+34)</python>"
        return "<answer>true</answer>" if "mode: forward" in prefix else "<answer>false</answer>"

    _scripted(monkeypatch, script)
    verifier = AgenticVerifier(model, tok, max_turns=4)
    (result,) = verifier.score_batch(["12+34="], ["46"])
    fwd, bwd = result.info["forward"], result.info["backward"]
    assert fwd["verdict"] is True and bwd["verdict"] is False and result.info["verdict"] is False
    assert not result.correct and fwd["turns"] == 3 and fwd["tool_calls"] == 1

    # recompute both scores by hand: the episode's tokens (EOS ends each turn) up to the verdict turn, then
    # "<answer>", one forward pass, the softmax over the logits of "t" and "f"
    t, f = verdict_token_ids(tok)
    enc = lambda text: list(tok(text, add_special_tokens=False)["input_ids"])
    for mode, info in (("forward", fwd), ("backward", bwd)):
        client = CaseClient(VerifyCase("12+34=", "46", mode))
        ids = list(tok(f"{client.instruction}\n{client.reset(0)}\n", add_special_tokens=True)["input_ids"])
        for action in ("<subtasks>check</subtasks>", "<python>print(12+34)</python>"):
            ids += enc(action) + [tok.eos_token_id] + enc(client.step(action).observation + "\n")
        ids += enc("<answer>")
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        assert info["score"] == pytest.approx(verdict_probability(float(logits[t]), float(logits[f])), abs=1e-6)
    assert result.score == pytest.approx(0.7 * fwd["score"] + 0.3 * bwd["score"], abs=1e-9)


def test_agentic_verifier_with_an_untrained_model_and_the_batch_reward(wide_model, tmp_path: Path):
    from credo.models.build import save_model
    from credo.rewards import RewardRunner, get_reward_fn

    model, tok = wide_model
    verifier = AgenticVerifier(model, tok, max_turns=2, max_tokens_per_turn=12)
    results = verifier.score_batch(["12+34=", "1+1="], ["46", "3"])
    for r in results:  # an untrained model rarely emits a verdict: missing verdicts score 0
        assert 0.0 <= r.score <= 1.0 and set(r.info) >= {"forward", "backward", "verdict", "s_fwd", "s_bwd"}
        for side in ("forward", "backward"):
            if r.info[side]["verdict"] is None:
                assert r.info[side]["score"] == 0.0
    fn = get_reward_fn("agentic_verifier")
    assert fn.credo_batch
    save_model(model, tok, tmp_path / "verifier")
    kwargs = {"model_path": str(tmp_path / "verifier"), "max_turns": 2, "max_tokens_per_turn": 12, "w_fwd": 0.5}
    with RewardRunner("agentic_verifier", fn_kwargs=kwargs) as runner:
        scored = runner.score(["46", "3"], [Example("12+34=", "46"), Example("1+1=", "2")])
    assert [r.failed for r in scored] == [False, False]
    assert all(0.0 <= r.score <= 1.0 and "fwd_verdict" in r.info for r in scored)


# ----------------------------------------------------------------------------- end to end

def test_credo_train_on_verify_completes_and_logs_rewards(tmp_path: Path):
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics
    from tests.conftest import TINY_RUN

    args = [*TINY_RUN, "agent.envs=[verify]", "agent.max_turns=3", "agent.max_tokens_per_turn=40",
            "agent.max_response_tokens=160", "model.max_position_embeddings=384", "task.eval_size=2", "eval.k=1",
            "eval.every=0", "log.tensorboard=false", "log.report=false", "log.progress=false",
            "checkpoint.save_final=false", "train.steps=2", f"output_dir={tmp_path}", "run_name=verify"]
    assert main(["-q", "train", *args]) == 0
    metrics = read_metrics(tmp_path / "verify" / "metrics.jsonl")
    steps = [m for m in metrics if "agent/success_rate" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert -1.0 <= m["reward/mean"] <= 1.0 and m["agent/env_failures"] == 0


def test_credo_train_with_the_agentic_verifier_as_reward(wide_model, tmp_path: Path):
    from credo.cli.main import main
    from credo.models.build import save_model
    from credo.tracking.metrics import read_metrics
    from tests.conftest import TINY_RUN

    model, tok = wide_model
    save_model(model, tok, tmp_path / "verifier")
    kwargs = f"reward.kwargs={{model_path: {tmp_path / 'verifier'}, max_turns: 2, max_tokens_per_turn: 8}}"
    assert main(["-q", "train", *TINY_RUN, "task.name=addition", "reward.name=agentic_verifier", kwargs,
                 "train.steps=1", "eval.every=0", "task.eval_size=2", "eval.k=1", "log.tensorboard=false",
                 "log.report=false", "log.progress=false", "checkpoint.save_final=false", f"output_dir={tmp_path}",
                 "run_name=rm"]) == 0
    (step1,) = [m for m in read_metrics(tmp_path / "rm" / "metrics.jsonl") if m.get("step") == 1]
    assert step1["reward/verifier_failures"] == 0 and 0.0 <= step1["reward/mean"] <= 1.0
