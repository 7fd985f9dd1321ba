"""Agent rollouts: token layout and loss mask checked token by token, horizon schedule, env failures."""
from __future__ import annotations

import pytest

from credo.envs import EnvError, LocalEnvClient
from credo.rollout import HFRolloutEngine
from credo.rollout.agent_loop import AgentLoop, plain_template, to_trajectory
from credo.collect.horizon import horizon
from credo.types import Example, SamplingParams


def _examples(env: str, ids: list[int]) -> list[Example]:
    return [Example(prompt=f"{env}:{i}", answer="", uid=f"{env}/{i}", meta={"env": env, "task_id": i}) for i in ids]


def test_layout_and_loss_mask_token_by_token(tiny_model):
    model, tok = tiny_model
    template = plain_template(tok)
    loop = AgentLoop(HFRolloutEngine(model, tok, seed=0), tok, template, max_turns=3, max_tokens_per_turn=6,
                     max_response_tokens=400, threads=2)
    examples = _examples("calc", [1, 2, 3, 4])
    clients = [LocalEnvClient("calc") for _ in examples]
    episodes = loop.run(examples, clients, [0, 0, 1, 1], SamplingParams(temperature=1.0))
    for ep, client in zip(episodes, clients):
        traj, result = to_trajectory(ep, tok)
        # the prompt is <bos> instruction \n first observation \n, mask 0 (not part of the response)
        first_obs = LocalEnvClient("calc").reset(ep.task_id)
        assert tok.decode(traj.prompt_ids, skip_special_tokens=True) == f"{client.instruction}\n{first_obs}\n"
        assert 1 <= len(traj.turns) <= 3 and len(traj.response_mask) == len(traj.response_ids)
        # walk the response: each turn's tokens are mask 1, everything between turns is an observation (mask 0)
        pos = 0
        for k, (start, end) in enumerate(traj.turns):
            gap = traj.response_ids[pos:start]
            assert all(m == 0 for m in traj.response_mask[pos:start])
            if k > 0:  # the observation after the previous turn: its text and a newline, never re-tokenised
                text = tok.decode(gap)
                assert text.endswith("\n") and ("invalid action" in text or text.startswith("= "))
            assert all(m == 1 for m in traj.response_mask[start:end]) and end > start
            assert all(lp <= 0 for lp in traj.rollout_logprobs[start:end])
            assert all(lp == 0 for lp in traj.rollout_logprobs[pos:start])
            turn = traj.response_ids[start:end]
            assert tok.eos_token_id not in turn[:-1]  # end-of-turn only as the turn's last token, mask 1
            pos = end
        assert pos == len(traj.response_ids)  # no observation after the last turn
        assert sum(traj.response_mask) == sum(e - s for s, e in traj.turns)
        assert traj.info["num_turns"] == len(traj.turns) and not result.failed


def test_oracle_turns_produce_the_expected_episode(tiny_model):
    """Force the model's turns to the oracle's actions and check the exact token sequence."""
    _, tok = tiny_model
    template = plain_template(tok)

    class ScriptedEngine:
        def __init__(self):
            self.calls = 0

        def continue_ids(self, prefixes, sp, stop_ids=(), top_logprobs=0, stop_sequences=()):
            from credo.rollout.hf import Continuation

            self.calls += 1
            out = []
            for _ in prefixes:
                text = "<tool>12+3</tool>" if self.calls == 1 else "<answer>15</answer>"
                ids = list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
                out.append(Continuation(ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop"))
            return out

    class FixedCalc(LocalEnvClient):
        def reset(self, task_id):
            super().reset(task_id)
            self.env.expr, self.env.value = "12+3", 15
            return "12+3"

    loop = AgentLoop(ScriptedEngine(), tok, template, max_turns=4, max_tokens_per_turn=32, threads=1)
    (ep,) = loop.run(_examples("calc", [0]), [FixedCalc("calc")], [0], SamplingParams())
    traj, result = to_trajectory(ep, tok)
    enc = lambda s: list(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    turn1, obs1, turn2 = enc("<tool>12+3</tool>") + [tok.eos_token_id], enc("= 15\n"), enc("<answer>15</answer>") + [
        tok.eos_token_id]
    assert traj.response_ids == turn1 + obs1 + turn2
    assert traj.response_mask == [1] * len(turn1) + [0] * len(obs1) + [1] * len(turn2)
    assert traj.turns == [(0, len(turn1)), (len(turn1) + len(obs1), len(turn1) + len(obs1) + len(turn2))]
    assert result.score == 1.0 and result.correct and traj.info["tool_calls"] == 1 and traj.finish_reason == "eos"


def test_turn_cap_cuts_with_zero_reward_and_env_failure_is_recorded(tiny_model):
    model, tok = tiny_model
    loop = AgentLoop(HFRolloutEngine(model, tok, seed=0), tok, plain_template(tok), max_turns=2, max_tokens_per_turn=4,
                     threads=1)

    class Broken(LocalEnvClient):
        def step(self, text):
            raise EnvError("server answered 500")

    eps = loop.run(_examples("maze", [5, 6]), [LocalEnvClient("maze"), Broken("maze")], [0, 1], SamplingParams())
    ok, broken = (to_trajectory(e, tok) for e in eps)
    assert ok[0].info["cut"] == "max_turns" and len(ok[0].turns) == 2 and ok[1].score == 0.0
    assert broken[1].failed and "500" in broken[1].error and broken[1].score == 0.0
    assert len(broken[0].turns) == 1 and broken[0].finish_reason == "length"


def test_scaling_inter_horizon_schedule():
    # rounds [6, 13, 20], period 100: steps 1..100 -> 6, 101..200 -> 13, later -> 20
    h = lambda s: horizon(s, schedule="stepwise", rounds=[6, 13, 20], period=100)  # noqa: E731
    assert [h(1), h(100), h(101), h(200), h(201), h(10_000)] == [6, 6, 13, 13, 20, 20]
    assert horizon(57, schedule="fixed", max_turns=9) == 9
    # resume consistency: a pure function of the step, so resuming at 150 switches at 201 (the reference: 202)
    assert [h(s) for s in range(151, 203)] == [13] * 50 + [20, 20]
    with pytest.raises(ValueError):
        horizon(1, schedule="cosine")


def test_turn_and_invalid_action_costs_shape_training_scores():
    from types import SimpleNamespace

    from credo.collect.agent import shape_rewards
    from credo.types import RewardResult

    results = [RewardResult(1.0, correct=True), RewardResult(1.0, correct=True), RewardResult(0.0),
               RewardResult(0.0, failed=True, error="HTTP 500")]
    trajs = [SimpleNamespace(info={"num_turns": n, "invalid_actions": k}) for n, k in ((2, 0), (6, 3), (8, 2), (3, 0))]
    shaped = shape_rewards(results, trajs, turn_cost=0.1, invalid_action_cost=0.2)
    # direct success 1 - 0.1*2 = 0.8; wandering success 1 - 0.6 - 0.6 = -0.2; failure 0 - 0.8 - 0.4 = -1.2;
    # an env failure keeps its failure score
    assert [r.score for r in shaped] == pytest.approx([0.8, -0.2, -1.2, 0.0])
    assert [r.correct for r in shaped] == [True, True, False, False]  # success is the env's, unchanged
    assert shape_rewards(results, trajs, turn_cost=0.0, invalid_action_cost=0.0) is results


def test_stop_at_action_ends_turns_at_the_closing_tag(tiny_model):
    model, tok = tiny_model
    stop = tuple(tok("</move>", add_special_tokens=False)["input_ids"])

    class Scripted(HFRolloutEngine):  # the tiny model's turn, with a valid action spliced in for every other row
        def continue_ids(self, prefixes, sampling, **kw):
            out = super().continue_ids(prefixes, sampling, **kw)
            from credo.rollout.hf import Continuation
            ids = list(tok("<move>up</move>", add_special_tokens=False)["input_ids"])
            return [Continuation(ids, [-0.1] * len(ids), "stop") if i % 2 == 0 else c for i, c in enumerate(out)]

    loop = AgentLoop(Scripted(model, tok, seed=0), tok, plain_template(tok), max_turns=3, max_tokens_per_turn=12,
                     max_response_tokens=400, threads=1, stop_sequences=(stop,))
    examples = _examples("maze", [1, 2, 3, 4])
    episodes = loop.run(examples, [LocalEnvClient("maze") for _ in examples], [0, 0, 1, 1],
                        SamplingParams(temperature=1.0))
    scripted_turns = 0
    for ep in episodes:
        traj, _ = to_trajectory(ep, tok)
        for start, end in traj.turns:
            turn = traj.response_ids[start:end]
            assert tuple(turn[-len(stop):]) == stop or turn[-1] == tok.eos_token_id or len(turn) == 12
            scripted_turns += tuple(turn[-len(stop):]) == stop
            assert all(m == 1 for m in traj.response_mask[start:end])
    assert scripted_turns > 0


def test_the_chat_turn_template_renders_ids_under_transformers_5():
    """Regression: transformers 5 answers apply_chat_template(tokenize=True) with a BatchEncoding, whose list() is
    its keys; the agent's chat template read ["input_ids", "attention_mask"] as token ids (every pretrained-model
    agent run failed with "substring not found")."""
    from credo.models import build_char_tokenizer
    from credo.rollout.agent_loop import chat_template

    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}" + tok.eos_token
                         + "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    template = chat_template(tok)
    prompt = template.prompt("be brief", "at 0,0")
    assert all(isinstance(i, int) for i in prompt) and tok.decode(prompt) == (
        f"<system>be brief{tok.eos_token}<user>at 0,0{tok.eos_token}")
    assert tok.decode(template.assistant_prefix) == "<assistant>"
    assert tok.decode(template.observation("at 1,0")) == "<user>at 1,0" + tok.eos_token
