"""The ``toolgraph`` environment: the seeded tool library and its dependency graph, tiered tasks, the oracle
(SciForge-style demonstrations), strict call parsing, the unit-aware verifier, per-tier evaluation, the env
server, and a 2-step ``credo train --config agent_toolgraph`` through the CLI."""
from __future__ import annotations

import json
import random

import pytest

from credo.envs import EVAL_OFFSET, EnvError, HTTPEnvClient, LocalEnvClient, get_env_spec, train_task_ids
from credo.envs.toolgraph import ToolGraphEnv, check_answer, parse_unit, tier_of, toolgraph_oracle
from credo.envs.toolgraph_lib import (MATERIAL, Call, Given, Task, build_library, from_si, goal_layer, library_stats,
                                      make_task, to_si, type_text)
from tests.env_util import env_server


def _fresh(seed: int):
    return build_library.__wrapped__(seed, 0.5)  # not the cached object


# ----------------------------------------------------------------------------- library and graph

def test_library_is_deterministic_per_seed_and_typed():
    a, b, c = _fresh(0), _fresh(0), _fresh(1)
    assert [t.signature() for t in a.tools] == [t.signature() for t in b.tools]
    assert [t.table for t in a.tools] == [t.table for t in b.tools]
    # another seed draws other lookup tables and other unit variants of the laws
    assert [t.table for t in a.tools if t.kind == "lookup"] != [t.table for t in c.tools if t.kind == "lookup"]
    assert {t.name for t in a.tools} != {t.name for t in c.tools}
    stats = library_stats(a)
    assert stats["tools"] >= 200 and stats["convert"] == 96 and stats["lookup"] == 4  # 96: 2 x 48 non-SI units
    assert stats["tools"] == stats["convert"] + stats["law"] + stats["lookup"]
    for ty, consumers in a.consumers.items():  # every edge of the dependency graph is type-matched
        assert all(ty in t.inputs for t in consumers)


def test_tools_compute_in_si():
    lib = build_library(0)
    # 350 g -> 0.35 kg; F = a m = 9.8 * 0.35 = 3.43 N; 3.43 N -> 0.00343 kN
    assert lib.by_name["mass_g_to_kg"].apply((350.0,)) == pytest.approx(0.35)
    assert lib.by_name["force_from_accel_times_mass"].apply((9.8, 0.35)) == pytest.approx(3.43)
    assert lib.by_name["force_N_to_kN"].apply((3.43,)) == pytest.approx(0.00343)
    # 450 degC = 723.15 K = 723.15 * 9/5 - 459.67 = 842 degF (affine units)
    assert lib.by_name["temperature_degC_to_K"].apply((450.0,)) == pytest.approx(723.15)
    assert lib.by_name["temperature_K_to_degF"].apply((723.15,)) == pytest.approx(842.0)
    # f = 1 / T: a period of 0.5 s is 2 Hz
    assert lib.by_name["frequency_from_inverse_time"].apply((0.5,)) == pytest.approx(2.0)
    table = dict(lib.by_name["density_of"].table)
    assert lib.by_name["density_of"].apply(("iron",)) == table["iron"]
    assert from_si(to_si(72.0, ("speed", "km_h")), ("speed", "m_s")) == pytest.approx(20.0)  # 72 km/h = 20 m/s


def _min_calls_brute_force(lib, given: set, goal, limit: int) -> int:
    """The fewest calls to a value of type ``goal``, by enumerating every sequence of up to ``limit`` calls (a
    check of ``goal_layer`` that shares none of its code)."""
    frontier = {frozenset(given)}
    for depth in range(limit + 1):
        if any(goal in s for s in frontier):
            return depth
        frontier = {s | {t.output} for s in frontier for t in lib.tools if set(t.inputs) <= s and t.output not in s}
    return limit + 1


def test_tasks_are_deterministic_and_tiers_have_their_chain_length():
    lib = build_library(0)
    for tier in (1, 2, 3, 4):
        tasks = [make_task(lib, tid, tier, 3) for tid in range(40)]
        assert tasks == [make_task(lib, tid, tier, 3) for tid in range(40)]
        assert len(set(tasks)) > 30  # different ids, different tasks
        for task in tasks:
            assert task.tier == tier and len(task.chain) == tier
            assert goal_layer(lib, {g.type for g in task.givens}, task.goal, tier) == tier
            assert {c.tool for c in task.chain} <= set(task.listed) and list(task.listed) == sorted(task.listed)
            assert len(task.listed) == len({c.tool for c in task.chain}) + 3  # plus 3 distractors
    for tier in (1, 2, 3):  # no shorter chain exists, by enumeration (tier 3: every 2-call sequence)
        for task in [make_task(lib, tid, tier, 3) for tid in range(6)]:
            assert _min_calls_brute_force(lib, {g.type for g in task.givens}, task.goal, tier) == tier


def test_task_ids_cycle_through_the_tiers():
    assert [tier_of(EVAL_OFFSET + i, 1, 4) for i in range(6)] == [1, 2, 3, 4, 1, 2]
    assert [tier_of(i, 2, 3) for i in range(4)] == [tier_of(EVAL_OFFSET + i, 2, 3) for i in range(4)] == [2, 3, 2, 3]
    env = ToolGraphEnv(max_chain=3)
    for i in range(6):
        env.reset(EVAL_OFFSET + i)
        assert env.task.tier == 1 + i % 3


# ----------------------------------------------------------------------------- episodes

def _play(client, spec, obs: str, limit: int = 12):
    for n in range(1, limit + 1):
        r = client.step(spec.oracle(client.env, obs))
        obs = r.observation
        if r.done:
            return r, n
    raise AssertionError("the oracle did not finish")


@pytest.mark.parametrize("answer,calls", [("ref", "name"), ("value", "name"), ("ref", "handle")])
def test_oracle_solves_every_task(answer, calls):
    spec = get_env_spec("toolgraph")
    client = LocalEnvClient("toolgraph", oracle_answer=answer, oracle_calls=calls)
    for tid in train_task_ids(60, seed=5) + [EVAL_OFFSET + i for i in range(20)]:
        obs = client.reset(tid)
        assert obs.startswith(f"goal: find {type_text(client.env.task.goal)}\ngiven: x1 = ")
        r, n = _play(client, spec, obs)
        assert r.reward == 1.0 and r.info["success"] and n == client.env.task.tier + 1  # tier calls + answer
        assert r.observation.startswith("correct")


def test_an_episode_step_by_step():
    env = ToolGraphEnv()
    obs = env.reset(EVAL_OFFSET + 2)  # tier 3
    task = env.task
    assert task.tier == 3 and obs.count("\n") == 2 + len(task.listed)
    call = task.chain[0]
    r = env.step(f"tool:{call.tool}({', '.join(call.args)})")
    out = env.library.by_name[call.tool]
    assert r.observation.startswith("r1 = ") and r.observation.endswith(type_text(out.output))
    assert r.info == {"tool_call": True} and not r.done and r.reward == 0.0
    r = env.step("answer:r1")  # r1 is not of the goal's type
    assert r.done and r.reward == 0.0 and "the goal is" in r.observation


BAD_CALLS = [
    ("tool:no_such_tool(x1)", "unknown tool no_such_tool"),
    ("tool:mass_g_to_kgg(x1)", "did you mean"),
    ("tool:mass_g_to_kg", "a call is name(ref, ...)"),
    ("tool:mass_g_to_kg()", "takes 1 argument(s), got 0"),
    ("tool:mass_g_to_kg(x1, x1)", "takes 1 argument(s), got 2"),
    ("tool:mass_g_to_kg(x9)", "unknown reference x9"),
    ("tool:mass_g_to_kg(r1)", "unknown reference r1"),
    ("tool:mass_g_to_kg(350)", "is not a reference"),
    ("tool:mass_g_to_kg(__import__('os'))", "a call is name(ref, ...)"),
    ("tool:mass_g_to_kg(x1); mass_g_to_kg(x1)", "a call is name(ref, ...)"),
    ("tool:" + "a" * 300, "longer than 200"),
    ("tool:t4(x1)", "unknown tool t4"),  # the listing has 3 tools
    ("tool:t0(x1)", "unknown tool t0"),
]


def _hand_task(env: ToolGraphEnv) -> None:
    """The module docstring's task: x1 = 350 mass[g], x2 = 9.8 accel[m/s2], goal force[kN] (3 calls)."""
    env.task = Task(3, ("force", "kN"), (Given("x1", ("mass", "g"), 350.0), Given("x2", ("accel", "m_s2"), 9.8)),
                    (Call("mass_g_to_kg", ("x1",)), Call("force_from_accel_times_mass", ("x2", "r1")),
                     Call("force_N_to_kN", ("r2",))), ("force_N_to_kN", "force_from_accel_times_mass", "mass_g_to_kg"))
    env.values = {g.ref: (g.type, g.value) for g in env.task.givens}
    env.calls, env.target = 0, env._oracle_value()


def test_the_docstring_episode():
    env = ToolGraphEnv()
    _hand_task(env)
    assert env.target == pytest.approx(0.00343)  # 0.35 kg * 9.8 m/s2 = 3.43 N = 0.00343 kN
    assert env.step("tool:mass_g_to_kg(x1)").observation == "r1 = 0.35 mass[kg]"
    assert toolgraph_oracle(env, "") == "<tool>force_from_accel_times_mass(x2, r1)</tool>"
    env.oracle_calls = "handle"
    assert toolgraph_oracle(env, "") == "<tool>t2(x2, r1)</tool>"  # listed: force_N_to_kN, force_from_..., mass_...
    assert env.step("tool:t2(x2, r1)").observation == "r2 = 3.43 force[N]"
    assert env.step("tool:force_N_to_kN(r2)").observation == "r3 = 0.00343 force[kN]"
    r = env.step("answer:r3")
    assert r.done and r.reward == 1.0 and r.info == {"success": True, "tier": 3}


def test_bad_calls_are_error_observations():
    env = ToolGraphEnv()
    _hand_task(env)
    for action, message in BAD_CALLS:
        r = env.step(action)
        assert r.observation.startswith("error: ") and message in r.observation, (action, r.observation)
        assert not r.done and r.reward == 0.0
    r = env.step("tool:force_N_to_kN(x1)")  # x1 is mass[g]
    assert r.observation == "error: x1 is mass[g], force_N_to_kN needs force[N]"
    assert env.step("move:up").observation == "invalid action"
    assert env.step("tool:mass_g_to_kg(x1)").observation == "r1 = 0.35 mass[kg]"  # the episode goes on


def test_random_text_never_crashes_and_the_call_budget_ends_an_episode():
    rng = random.Random(0)
    alphabet = "abcdefgxr0123456789_(), .:=[]'\"\\"
    client = LocalEnvClient("toolgraph", max_calls=256)
    client.reset(7)
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        r = client.step(f"<tool>{text}</tool>" if rng.random() < 0.8 else text)
        assert not r.done and r.reward == 0.0
    env = ToolGraphEnv(max_calls=2)
    env.reset(3)
    assert not env.step("tool:x(x1)").done and not env.step("tool:x(x1)").done
    r = env.step("tool:x(x1)")
    assert r.done and r.reward == 0.0 and "call budget" in r.observation
    with pytest.raises(EnvError, match="step before reset"):
        LocalEnvClient("toolgraph").step("<tool>a(x1)</tool>")


def test_parameters_are_checked():
    for bad, match in (({"max_chain": 6}, "max_chain=6"), ({"min_chain": 3, "max_chain": 2}, "max_chain=2"),
                       ({"oracle_answer": "x"}, "oracle_answer"), ({"rtol": 0.0}, "rtol"),
                       ({"oracle_calls": "index"}, "oracle_calls")):
        with pytest.raises(ValueError, match=match):
            LocalEnvClient("toolgraph", **bad)


# ----------------------------------------------------------------------------- verifier

def test_verifier_units_and_tolerance():
    goal, target = ("force", "kN"), 0.00343
    results = {"r2": (("force", "N"), 3.43), "r3": (("force", "kN"), 0.00343), "x1": (("mass", "g"), 350.0)}

    def ok(text: str, rtol: float = 0.01) -> bool:
        return check_answer(text, goal, target, results, rtol)[0]

    assert ok("r3") and not ok("r2") and not ok("x1") and not ok("r4")  # references: the goal's exact type
    # 1 dyn = 1e-5 N, so 3.43 N = 343000 dyn
    assert ok("0.00343 kN") and ok("0.00343") and ok("3.43 N") and ok("3.43 force[N]") and ok("343000 dyn")
    assert ok("3.43e-3 kN") and ok(".00343")
    # relative tolerance 1%: 0.003463 / 0.00343 = 1.0096 passes, 0.0035 / 0.00343 = 1.0204 does not
    assert ok("0.003463 kN") and not ok("0.0035 kN") and ok("0.0035 kN", rtol=0.03)
    assert not ok("3.43 J") and not ok("3.43 energy[J]") and not ok("mass[g]") and not ok("inf") and not ok("")
    assert check_answer("3.43 J", goal, target, results, 0.01)[1] == "'J' is not a unit of force"
    # temperature is affine: 842 degF = (842 - 32) * 5/9 = 450 degC = 723.15 K
    t_goal = ("temperature", "degF")
    assert check_answer("450 degC", t_goal, 842.0, {}, 1e-6)[0] and check_answer("723.15 K", t_goal, 842.0, {}, 1e-6)[0]
    assert not check_answer("723.15", t_goal, 842.0, {}, 0.01)[0]  # no unit: read as degF
    assert parse_unit("km/h", "speed") == ("speed", "km_h") == parse_unit("km_h", "speed")
    assert parse_unit("speed[km/h]", "speed") == ("speed", "km_h") and parse_unit("length[m]", "speed") is None
    assert type_text(MATERIAL) == "material"


def test_a_value_answer_from_the_observation_is_accepted():
    """The results are shown with 4 significant digits: answering that number (and unit) is within rtol."""
    env = ToolGraphEnv()
    for tid in range(EVAL_OFFSET, EVAL_OFFSET + 12):
        obs = env.reset(tid)
        for call in env.task.chain:
            obs = env.step(f"tool:{call.tool}({', '.join(call.args)})").observation
        value, unit = obs.split(" = ")[1].split(" ", 1)
        assert env.step(f"answer:{value} {unit}").reward == 1.0


# ----------------------------------------------------------------------------- evaluation per tier

def test_group_success_reports_each_tier():
    from credo.collect.agent import group_success
    from credo.collect.config import AgentCollectorConfig
    from credo.types import Example, RewardResult, Trajectory

    ids = [EVAL_OFFSET + i for i in range(6)]  # tiers 1 2 3 1 2 3 with max_chain=3
    trajs = [Trajectory(example=Example(prompt="", answer="", meta={"env": "toolgraph", "task_id": t}), group_id=0,
                        prompt_ids=[1], response_ids=[1], rollout_logprobs=[0.0], response_mask=[1],
                        finish_reason="eos") for t in ids]
    results = [RewardResult(float(c), correct=c) for c in (True, True, False, False, True, False)]
    a = AgentCollectorConfig(envs=["toolgraph"], env_params={"toolgraph": {"max_chain": 3}})
    # tier1: ids 0, 3 -> (True, False) = 0.5; tier2: ids 1, 4 -> 1.0; tier3: ids 2, 5 -> 0.0
    assert group_success(a, trajs, results, "greedy_success") == {
        "eval/toolgraph/tier1/greedy_success": 0.5, "eval/toolgraph/tier2/greedy_success": 1.0,
        "eval/toolgraph/tier3/greedy_success": 0.0}


# ----------------------------------------------------------------------------- server and CLI

def test_env_serve_plays_a_task():
    """``credo env serve toolgraph max_chain=2``: the same observations as in-process, the oracle solves."""
    local = LocalEnvClient("toolgraph", max_chain=2)
    with env_server("toolgraph", "max_chain=2") as (url, _):
        client = HTTPEnvClient(url, "toolgraph", timeout_s=10)
        for tid in (EVAL_OFFSET, EVAL_OFFSET + 1):
            obs = client.reset(tid)
            assert obs == local.reset(tid)
            for _ in range(4):
                r = client.step(toolgraph_oracle(local.env, obs))
                local.step(toolgraph_oracle(local.env, obs))
                obs = r.observation
                if r.done:
                    break
            assert r.done and r.reward == 1.0
        assert client.step("<tool>nope(x1)</tool>").observation.startswith("error: unknown tool nope")
        client.close()


def test_train_and_eval_agent_toolgraph_through_the_cli(tmp_path, capsys):
    """``credo train --config agent_toolgraph`` for 2 RL steps (tiny model), then ``credo eval`` of the run: both
    report held-out success per tier."""
    from credo.cli.main import main
    from credo.tracking.metrics import read_metrics
    from tests.conftest import TINY_RUN

    run = tmp_path / "run"
    args = [*TINY_RUN, "train.steps=2", "task.eval_size=6", "eval.every=0", "eval.k=1", "warm_start.steps=2",
            "rollout.collector.max_tokens_per_turn=16", "rollout.collector.max_turns=3", "log.tensorboard=false",
            "log.report=false", "log.progress=false"]
    assert main(["train", "--config", "agent_toolgraph", *args, "--run-dir", str(run)]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert sum("agent/success_rate" in r for r in rows) == 2  # two RL steps
    final = json.loads((run / "summary.json").read_text())
    assert all(f"final/eval/toolgraph/tier{k}/greedy_success" in final for k in (1, 2, 3))
    assert "final/eval/toolgraph/tier3/avg@1" in final
    samples = [json.loads(line) for line in (run / "eval_samples" / "step_000002.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and {r["env"] for r in samples} == {"toolgraph"}
    assert "goal: find" in samples[0]["prompt"] and "tools:" in samples[0]["prompt"]
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    metrics = json.loads(out[out.index("{"):])
    # 6 held-out tasks, tiers 1 2 3 1 2 3: each tier's success is a multiple of 1/2
    assert {k: v * 2 == int(v * 2) for k, v in metrics.items() if "/tier" in k} == {
        f"eval/toolgraph/tier{k}/{m}": True for k in (1, 2, 3) for m in ("greedy_success", "avg@1")}
