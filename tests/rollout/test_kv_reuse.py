"""KV sessions across agent turns (credo.rollout.kv_reuse): the batch layout by hand, the same tokens and log-probs
as re-prefilling the history (lean and generic decode paths, float32 and float64, split batches, branching), stale
sessions never read, and the switch through the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from credo.cli.main import main
from credo.config.schema import ModelConfig
from credo.envs import LocalEnvClient
from credo.models import build_model
from credo.rollout import HFRolloutEngine
from credo.rollout.agent_loop import AgentLoop, plain_template
from credo.rollout.branching import branched_rollouts
from credo.rollout.kv_reuse import KVSession, assemble
from credo.types import Example, SamplingParams
from tests.conftest import TINY_RUN

LONG = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   max_position_embeddings=512)


@pytest.fixture(scope="module")
def long_model():
    torch.manual_seed(0)
    return build_model(LONG, seed=0)


def _examples(n: int, env: str = "maze") -> list[Example]:
    return [Example(prompt="", answer="", uid=f"{env}/{i}", meta={"env": env, "task_id": i}) for i in range(n)]


def _run(model, tok, reuse: bool, *, lean: bool = True, n: int = 12, max_batch_size: int = 256, env: str = "maze"):
    engine = HFRolloutEngine(model, tok, seed=3, lean=lean, max_batch_size=max_batch_size)
    loop = AgentLoop(engine, tok, plain_template(tok), max_turns=5, max_tokens_per_turn=10, max_response_tokens=300,
                     threads=1, kv_reuse=reuse)
    examples = _examples(n, env)
    return loop.run(examples, [LocalEnvClient(env) for _ in examples], list(range(n)), SamplingParams(temperature=1.0))


def _assert_same(plain, reused, tol: float) -> None:
    assert [e.response_ids for e in plain] == [e.response_ids for e in reused]
    assert [e.mask for e in plain] == [e.mask for e in reused]
    for a, b in zip(plain, reused):
        lp_a = torch.tensor([x for x, m in zip(a.logprobs, a.mask) if m])
        lp_b = torch.tensor([x for x, m in zip(b.logprobs, b.mask) if m])
        torch.testing.assert_close(lp_b, lp_a, atol=tol, rtol=0)


def test_assemble_layout_by_hand():
    # row 0 holds 2 cached tokens [5, 6] and feeds 1 new one (7); row 1 holds none and feeds 3 (8, 9, 10)
    kv = torch.arange(2 * 2 * 1 * 2 * 1, dtype=torch.float32).view(2, 2, 1, 2, 1)  # (layers, k/v, heads, L=2, hd)
    sessions = [KVSession([5, 6], kv, version=0), KVSession()]
    past, ids, attn, pos = assemble(sessions, [2, 0], [[5, 6, 7], [8, 9, 10]], pad_id=0)
    # Wc = max(2, 0) = 2 cache columns, N = max(1, 3) = 3 new columns
    assert past.shape == (2, 2, 2, 1, 2, 1)
    assert torch.equal(past[:, :, 0], kv) and not past[:, :, 1].any()  # row 1's cache block is all padding
    assert ids.tolist() == [[0, 0, 7], [8, 9, 10]]  # new tokens right-aligned in their block
    assert attn.tolist() == [[1, 1, 0, 0, 1], [0, 0, 1, 1, 1]]
    assert pos.tolist() == [[0, 0, 2], [0, 1, 2]]  # row 0's new token sits at position 2, after its 2 cached


def test_cached_length_rules():
    kv = torch.zeros(1, 2, 1, 3, 1)
    s = KVSession([1, 2, 3], kv, version=4)
    assert s.cached_length([1, 2, 3, 9], 4) == 3
    assert s.cached_length([1, 2, 3, 9], 5) == 0  # computed by another policy version
    assert s.cached_length([1, 2, 4, 9], 4) == 0  # not a prefix of the new one
    assert s.cached_length([1, 2, 3], 4) == 0  # nothing left to feed: the next-token logits need one token
    s.clear()
    assert s.cached_length([1, 2, 3, 9], 4) == 0


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "generic"])
def test_same_tokens_and_logprobs_as_re_prefill(long_model, lean):
    model, tok = long_model
    plain, reused = _run(model, tok, False, lean=lean), _run(model, tok, True, lean=lean)
    assert sum(len(e.turns) for e in plain) > 2 * len(plain)  # several turns per episode: the cache was used
    _assert_same(plain, reused, tol=1e-5)
    # the same tokens prefilled when reusing are only the new ones: far fewer than the whole history every turn
    assert all(e.reused_tokens == 0 for e in plain)
    assert sum(e.prefill_tokens for e in reused) * 3 < sum(e.prefill_tokens for e in plain)
    for e in reused:  # every turn's prefix is either read from the session or prefilled, nothing lost
        assert e.prefill_tokens + e.reused_tokens == next(p for p in plain if p.example.uid == e.example.uid) \
            .prefill_tokens
        assert e.kv.kv is None  # the episode ended: its keys / values were released


def test_float64_agrees_to_rounding(long_model):
    model, tok = long_model
    model64 = build_model(LONG, seed=0)[0].double()
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    _assert_same(_run(model64, tok, False), _run(model64, tok, True), tol=1e-10)


def test_split_batches_and_compaction(long_model):
    model, tok = long_model
    # batches of 5 rows: sessions are sliced with their rows; rows finish at different steps (compaction)
    _assert_same(_run(model, tok, False, n=11), _run(model, tok, True, n=11, max_batch_size=5), tol=1e-5)


def test_stale_sessions_are_never_read(long_model):
    model, tok = long_model
    engine = HFRolloutEngine(model, tok, seed=0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11)
    prefix = tok("abc", add_special_tokens=False)["input_ids"]
    sessions = [KVSession()]
    first = engine.continue_ids([prefix], sp, sessions=sessions)[0]
    held = list(sessions[0].ids)
    assert held == prefix + first.ids[:-1]  # the last sampled token was never fed
    nxt = held + first.ids[-1:] + tok("xy", add_special_tokens=False)["input_ids"]
    expect = engine.continue_ids([nxt], sp)[0]
    # a session of another policy version: not read (the prefill covers the whole prefix), same result
    engine.policy_version = 1
    got = engine.continue_ids([nxt], sp, sessions=sessions)[0]
    assert sessions[0].reused_tokens == 0 and got.ids == expect.ids
    # a session whose tokens are not a prefix (e.g. a continuation the caller replaced): not read
    sessions[0].ids = [t + 1 for t in sessions[0].ids]
    got = engine.continue_ids([nxt], sp, sessions=sessions)[0]
    assert sessions[0].reused_tokens == 0 and got.ids == expect.ids
    # the right version and tokens: everything but the last sampled token is read from the session
    third = nxt + got.ids
    again = engine.continue_ids([third], sp, sessions=sessions)[0]
    assert sessions[0].reused_tokens == len(third) - 1
    assert again.ids == engine.continue_ids([third], sp)[0].ids


def test_sessions_cleared_where_the_engine_cannot_keep_them(long_model):
    model, tok = long_model
    engine = HFRolloutEngine(model, tok, seed=0)
    engine.kv_sessions = False  # e.g. an architecture outside the Llama family
    s = KVSession([1, 2], torch.zeros(2, 2, 2, 2, 8), version=0)
    engine.continue_ids([[1, 2, 3]], SamplingParams(max_new_tokens=2), sessions=[s])
    assert s.kv is None and s.ids == []


def test_branching_with_sessions_matches(long_model):
    model, tok = long_model

    def run(reuse: bool):
        engine = HFRolloutEngine(model, tok, seed=0)
        loop = AgentLoop(engine, tok, plain_template(tok), max_turns=4, max_tokens_per_turn=5, threads=1,
                         top_logprobs=10, kv_reuse=reuse)
        trajs, _, _ = branched_rollouts(loop, _examples(3), 6, SamplingParams(temperature=1.0),
                                        lambda ex: LocalEnvClient("maze"), method="arpo",
                                        generator=torch.Generator().manual_seed(1), branch_on="any",
                                        branch_probability=0.9)
        return trajs

    plain, reused = run(False), run(True)
    assert any(t.info["branched_from"] is not None for t in reused)
    assert [t.response_ids for t in plain] == [t.response_ids for t in reused]
    assert sum(t.info["kv_reused_tokens"] for t in reused) > 0


def _agent_run(tmp_path: Path, name: str, *extra: str) -> list[dict]:
    args = [*TINY_RUN, "rollout.collector.type=agent", "rollout.collector.envs=[maze]", "rollout.collector.max_turns=3",
            "rollout.collector.max_tokens_per_turn=8", "rollout.collector.max_response_tokens=96",
            "model.max_position_embeddings=256", "train.steps=2", "eval.every=0", "eval.size=4", "warm_start.steps=2"]
    assert main(["-q", "train", *args, *extra, f"output_dir={tmp_path}", f"run_name={name}"]) == 0
    run_dir = next(p for p in tmp_path.iterdir() if p.name.startswith(name))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"agent/prefill_tokens"' in line]


def test_cli_switch_same_run_fewer_prefill_tokens(tmp_path):
    on = _agent_run(tmp_path, "reuse")
    off = _agent_run(tmp_path, "prefill", "rollout.collector.kv_reuse=false")
    assert len(on) == len(off) == 2  # one line per training step
    assert [m["agent/turns_mean"] for m in on] == [m["agent/turns_mean"] for m in off]
    assert [m["response_length/mean"] for m in on] == [m["response_length/mean"] for m in off]
    assert all(m["agent/kv_reused_frac"] > 0.3 for m in on) and all(m["agent/kv_reused_frac"] == 0 for m in off)
    assert all(a["agent/prefill_tokens"] < b["agent/prefill_tokens"] for a, b in zip(on, off))
