"""Agent turns through vLLM's automatic prefix caching (rollout.vllm.prefix_caching): the cached-token counts per row
(in process: RequestOutput.num_cached_tokens; server: usage.prompt_tokens_details.cached_tokens), the same tokens and
log-probs with the cache on and off, the reset at a weight sync, and the agent loop's counters (agent/kv_reused_frac).
Marker `vllm` (tests/rollout/test_vllm.py); three engines start once for the module (~25 s each on 2 CPU cores).

vLLM caches keys / values in full blocks of ``block_size`` tokens (128 on CPU), the sampled tokens' blocks included
(a decoded token's keys / values are computed when the next token is sampled, so the last sampled token has none),
and always recomputes at least a prompt's last token. A prompt ``p2`` that extends ``p1 + c1`` (an earlier call's
prompt and its continuation) therefore finds ``B * floor((len(p1) + len(c1) - 1) / B)`` tokens cached (those
blocks lie within ``p2[:-1]`` because ``len(p2) > len(p1) + len(c1)``)."""
from __future__ import annotations

import pytest
import torch

from credo.config import ModelConfig
from credo.types import Example, SamplingParams

pytestmark = pytest.mark.vllm

DEMO = ModelConfig()  # head_dim 32 (vLLM's CPU attention), 512 positions
SP = SamplingParams(temperature=1.0, max_new_tokens=24)
# float32 on both engines. Measured on vLLM 0.32 CPU (2026-12-02): max |difference| 0.0 in both tests below (the
# cached blocks hold the very keys / values a prefill computes, read by the same kernels). A CUDA build runs a
# different kernel for a prefill on cached context, which may reorder float32 sums: ~1e-6 per log-prob at this size,
# so the bound is 10x that; any real mismatch (a wrong or stale block) moves log-probs by O(0.1).
TOL = 1e-5


def _need_vllm():
    from credo.rollout.vllm_engine import vllm_problem

    problem = vllm_problem()
    assert problem is None, f"the vllm tests need vLLM: {problem}"


@pytest.fixture(scope="module")
def policy():
    from credo.models import build_model

    torch.manual_seed(0)
    return build_model(DEMO, seed=0)


def _engine(policy, **kw):
    _need_vllm()
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    model, tok = policy
    return VLLMRolloutEngine.from_model(model, tok, seed=0, options=VLLMOptions(dtype="float32", **kw))


@pytest.fixture(scope="module")
def cached(policy):
    eng = _engine(policy)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def uncached(policy):
    eng = _engine(policy, prefix_caching=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def block(cached) -> int:
    return cached.transport.llm.llm_engine.vllm_config.cache_config.block_size


def _turns(engine, text: str, key: int):
    """Two calls as two agent turns: p1, then p2 = p1 + c1 + more tokens. Returns (p1, c1, c2)."""
    p1 = engine.encode(text)
    c1 = engine.continue_ids([p1], SP, stream=(key, 0))[0]
    p2 = p1 + c1.ids + engine.encode(" and then some more")[1:]
    c2 = engine.continue_ids([p2], SP, stream=(key + 1, 0))[0]
    return p1, c1, c2


def _expected(block: int, p1: list[int], c1) -> int:
    return block * ((len(p1) + len(c1.ids) - 1) // block)


def test_options_reach_vllm_and_the_server_flags():
    from credo.rollout.vllm_transport import VLLMOptions, cached_tokens, engine_kwargs, server_command

    assert engine_kwargs(VLLMOptions(), seed=0, cpu=True)["enable_prefix_caching"] is True
    off = server_command("/m", port=1, seed=0, opts=VLLMOptions(prefix_caching=False), cpu=True)
    on = server_command("/m", port=1, seed=0, opts=VLLMOptions(), cpu=True)
    assert "--no-enable-prefix-caching" in off and "--enable-prefix-caching" not in off
    assert "--enable-prefix-caching" in on and "--enable-prompt-tokens-details" in on
    assert cached_tokens({"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 128}}}) == 128
    assert cached_tokens({"usage": {"prompt_tokens": 9, "prompt_tokens_details": None}}) is None
    assert cached_tokens({}) is None


def test_the_second_turn_reads_its_history_from_the_cache(cached, uncached, block):
    text = "rev abcdefghij=" * 12  # 1 + 180 tokens (character tokenizer): more than one 128-token block
    p1, c1, c2 = _turns(cached, text, key=11)
    assert len(p1) > block and c1.cached_tokens == 0  # a prompt never seen before
    # e.g. len(p1) = 181, len(c1) = 20: 128 * floor(200 / 128) = 128
    assert c2.cached_tokens == _expected(block, p1, c1) > 0 and c2.cached_tokens % block == 0
    # the same first prompt again: its own full blocks, at most len(p1) - 1 tokens (the last is recomputed)
    again = cached.continue_ids([p1], SP, stream=(11, 0))[0]
    assert again.cached_tokens == block * ((len(p1) - 1) // block)
    q1, d1, d2 = _turns(uncached, text, key=11)
    assert (d1.cached_tokens, d2.cached_tokens) == (0, 0)
    # exactness: the same draws, the same tokens; the log-probs agree to float32 rounding
    assert q1 == p1 and d1.ids == c1.ids and d2.ids == c2.ids and again.ids == c1.ids
    for a, b in ((c1, d1), (c2, d2), (again, d1)):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=TOL, rtol=0)


def test_a_weight_sync_resets_the_cache(cached, block, policy):
    model, _ = policy
    text = "rev klmnopqrst=" * 12
    p1 = cached.encode(text)
    cached.continue_ids([p1], SP, stream=(21, 0))
    assert cached.continue_ids([p1], SP, stream=(21, 0))[0].cached_tokens == block * ((len(p1) - 1) // block) > 0
    cached.update_weights(model, version=1)  # the same weights, but the engine cannot know: everything goes
    assert cached.continue_ids([p1], SP, stream=(21, 0))[0].cached_tokens == 0


def _episodes(engine, tok, n: int = 6):
    from credo.envs import LocalEnvClient
    from credo.rollout.agent_loop import AgentLoop, plain_template

    assert engine.kv_sessions is False  # AgentLoop.kv_reuse stays off: vLLM's cache does the reuse
    loop = AgentLoop(engine, tok, plain_template(tok), max_turns=5, max_tokens_per_turn=10, max_response_tokens=300,
                     threads=1)
    examples = [Example(prompt="", answer="", uid=f"maze/{i}", meta={"env": "maze", "task_id": i}) for i in range(n)]
    return loop.run(examples, [LocalEnvClient("maze") for _ in examples], list(range(n)),
                    SamplingParams(temperature=1.0, seed=5))


def test_agent_loop_counts_the_cache_hits_and_samples_the_same(cached, uncached, policy, block):
    from credo.collect.agent import episode_metrics
    from credo.rollout.agent_loop import to_trajectory

    _, tok = policy
    hits, plain = _episodes(cached, tok), _episodes(uncached, tok)
    assert [e.response_ids for e in hits] == [e.response_ids for e in plain]
    for a, b in zip(hits, plain):
        lp_a = torch.tensor([x for x, m in zip(a.logprobs, a.mask) if m])
        lp_b = torch.tensor([x for x, m in zip(b.logprobs, b.mask) if m])
        torch.testing.assert_close(lp_a, lp_b, atol=TOL, rtol=0)
    # off: every turn prefills its whole prefix; on: the same prefixes, split into cached + prefilled
    assert all(e.reused_tokens == 0 and e.prefill_tokens > 0 for e in plain)
    assert [e.reused_tokens + e.prefill_tokens for e in hits] == [e.prefill_tokens for e in plain]
    assert all(e.reused_tokens % block == 0 for e in hits)
    assert sum(e.reused_tokens for e in hits) > 0
    pairs = [to_trajectory(e, tok) for e in hits]
    frac = episode_metrics([t for t, _ in pairs], [r for _, r in pairs], "agent")["agent/kv_reused_frac"]
    assert 0 < frac == sum(e.reused_tokens for e in hits) / sum(e.prefill_tokens for e in plain)


@pytest.fixture(scope="module")
def server(policy, tmp_path_factory):
    _need_vllm()
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    model, tok = policy
    eng = VLLMRolloutEngine.from_model(model, tok, seed=0, options=VLLMOptions(dtype="float32", mode="server"),
                                       log_dir=tmp_path_factory.mktemp("server"))
    yield eng
    eng.close()


def test_server_mode_reports_the_cached_tokens(server, block):
    # the server runs with --enable-prompt-tokens-details; same platform, so the in-process engine's block size
    p1, c1, c2 = _turns(server, "rev uvwxyzabcd=" * 12, key=31)
    assert c1.cached_tokens == 0
    assert c2.cached_tokens == _expected(block, p1, c1) > 0
