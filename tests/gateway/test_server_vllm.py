"""The gateway (credo.gateway.server) in front of credo's vLLM engine (credo.rollout.vllm_engine), with the real
``openai`` client: chat, streaming, /v1/completions, token-exact capture, concurrent calls batched, stop strings, a
multi-turn episode stitched (its turns read from vLLM's prefix cache), the engine in server mode, and a
``credo train`` run with ``rollout.engine=vllm rollout.collector.type=gateway``.

Marker ``vllm`` (not in the default run; tests/rollout/test_vllm.py says how to run them): vLLM's CPU build here,
CUDA vLLM on a GPU machine; where vLLM cannot run these fail with the reason. The module shares one in-process
engine (20-50 s to start on a 2-core CPU, with load); the server-mode test and the train run start their own
(the whole module: 1.5-2 min there)."""
from __future__ import annotations

import asyncio
import math
import threading

import pytest
import torch

from credo.config import ModelConfig
from credo.gateway.server import Gateway, GatewayLimits, stitch
from credo.types import SamplingParams

pytestmark = pytest.mark.vllm

DEMO = ModelConfig()  # head_dim 32 (vLLM's CPU attention needs 32, 64, 80, ...), 512 positions: room for chat
MAX_NEW = 12
TOL = 1e-5  # float32 on both sides, as in tests/rollout/test_vllm.py and test_vllm_scoring.py


def _need_vllm():
    from credo.rollout.vllm_engine import vllm_problem

    problem = vllm_problem()
    assert problem is None, f"the vllm tests need vLLM: {problem}"


class Recording:
    """The vLLM engine, with every ``continue_ids`` call's prefixes and returned continuations kept (what the
    engine returned, to compare the gateway's records with); everything else is the engine's."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[tuple[list[list[int]], list]] = []
        self._lock = threading.Lock()

    def continue_ids(self, prefixes, sampling, **kw):
        out = self.engine.continue_ids(prefixes, sampling, **kw)
        with self._lock:
            self.calls.append(([list(p) for p in prefixes], out))
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def policy():
    from credo.models import build_model

    torch.manual_seed(0)
    return build_model(DEMO, seed=0)


@pytest.fixture(scope="module")
def engine(policy):
    _need_vllm()
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    model, tok = policy
    eng = VLLMRolloutEngine.from_model(model, tok, seed=0, options=VLLMOptions(dtype="float32"))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def served(engine, policy):
    """(gateway, recording engine, tokenizer): the gateway in front of the vLLM engine, no batching wait."""
    _, tok = policy
    rec = Recording(engine)
    gw = Gateway(rec, tok, sampling=SamplingParams(max_new_tokens=MAX_NEW), limits=GatewayLimits(batch_wait_s=0.0))
    gw.start()
    yield gw, rec, tok
    gw.stop()


def _the_engines(rec: Recording, prompt_ids: list[int]):
    """The continuation the engine returned for ``prompt_ids`` (the last batch that had it)."""
    for prefixes, out in reversed(rec.calls):
        for p, c in zip(prefixes, out):
            if p == prompt_ids:
                return c
    raise AssertionError("the engine never got this prompt")


def _assert_scored(engine, call):
    """The recorded log-probs are the served policy's (sampling at temperature 1, no top-k / top-p)."""
    [scored] = engine.score_ids([call.prompt_ids + call.completion_ids], [len(call.prompt_ids)])
    assert len(scored) == len(call.logprobs) and all(math.isfinite(x) for x in scored)
    assert max(abs(a - b) for a, b in zip(scored, call.logprobs)) < TOL


def _text(tok, ids):
    ended = bool(ids) and ids[-1] == tok.eos_token_id
    return tok.decode(ids[:-1] if ended else ids, skip_special_tokens=True)


def test_models_and_a_chat_call_record_the_engines_tokens(served, engine):
    gw, rec, tok = served
    c = gw.open_episode("chat")
    client = c.openai()
    assert [m.id for m in client.models.list().data] == ["credo-policy"]
    r = client.chat.completions.create(model=c.model, messages=[{"role": "user", "content": "rev abc="}],
                                       logprobs=True)
    [call] = gw.close_episode(c).calls
    cont = _the_engines(rec, call.prompt_ids)
    assert call.completion_ids == cont.ids and call.logprobs == [float(x) for x in cont.logprobs]
    assert 1 <= len(call.completion_ids) <= MAX_NEW and all(x <= 0 for x in call.logprobs)
    assert r.usage.completion_tokens == len(call.completion_ids)
    assert r.usage.prompt_tokens == len(call.prompt_ids)
    assert r.choices[0].message.content == _text(tok, call.completion_ids)
    assert [x.logprob for x in r.choices[0].logprobs.content] == call.logprobs
    assert r.choices[0].finish_reason == ("stop" if cont.finish_reason == "stop" else "length")
    if cont.finish_reason == "stop":
        assert call.completion_ids[-1] == tok.eos_token_id  # the end of turn stays in the recorded ids
    _assert_scored(engine, call)


def test_a_streamed_chat_call_sends_the_recorded_completion(served):
    gw, rec, tok = served
    c = gw.open_episode("stream")
    chunks = list(c.openai().chat.completions.create(
        model=c.model, messages=[{"role": "user", "content": "12+3="}], stream=True,
        stream_options={"include_usage": True}))
    [call] = gw.close_episode(c).calls
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == call.text == _text(tok, call.completion_ids)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
        [call.finish_reason]
    assert chunks[-1].usage.completion_tokens == len(call.completion_ids)
    assert call.completion_ids == _the_engines(rec, call.prompt_ids).ids


def test_completions_with_text_and_token_ids(served, engine):
    gw, rec, tok = served
    c = gw.open_episode("completions")
    client = c.openai()
    r = client.completions.create(model=c.model, prompt="rev hgfedc=", logprobs=0)
    ids = engine.encode("rev hgfedc=")
    r2 = client.completions.create(model=c.model, prompt=ids, logprobs=0, max_tokens=5)
    first, second = gw.close_episode(c).calls
    assert first.prompt_ids == ids and second.prompt_ids == ids  # token ids are used as they are
    engine_calls = rec.calls[-2:]  # one engine call each (sequential calls), the same prompt
    assert [prefixes for prefixes, _ in engine_calls] == [[ids], [ids]]
    for resp, call, (_, [cont]) in zip((r, r2), (first, second), engine_calls):
        assert call.completion_ids == cont.ids[: len(call.completion_ids)]
        assert resp.choices[0].logprobs.token_logprobs == call.logprobs == \
            [float(x) for x in cont.logprobs[: len(call.logprobs)]]
        assert resp.choices[0].text == call.text and resp.usage.completion_tokens == len(call.completion_ids)
        _assert_scored(engine, call)
    assert len(second.completion_ids) <= 5


def test_stop_strings_cut_the_answer_and_the_recorded_ids(served, engine):
    """vLLM gets the stop string (and the engine cuts on its token ids): a call replayed from the same generator
    state samples the same row up to the stop, and stops right after it."""
    gw, rec, tok = served
    c = gw.open_episode("stop")
    client = c.openai()
    for prompt in ("rev abc=", "rev qrstu=", "12+3=", "rev hgfedc=", "rev xyz="):
        state = engine.state_dict()  # the generator the call key is drawn from
        free = client.completions.create(model=c.model, prompt=prompt, max_tokens=MAX_NEW)
        if len(free.choices[0].text) >= 4:
            break
    else:
        raise AssertionError("no free completion of 4 characters or more to cut")
    text = free.choices[0].text
    stop = text[2:4]
    engine.load_state_dict(state)
    cut = client.completions.create(model=c.model, prompt=prompt, max_tokens=MAX_NEW, stop=[stop])
    record = gw.close_episode(c)
    free_call, cut_call = record.calls[-2:]
    end = text.index(stop)
    assert cut.choices[0].text == text[:end] and cut.choices[0].finish_reason == "stop"
    assert cut_call.completion_ids == free_call.completion_ids[: end + len(stop)]  # one token a character
    # the same samples, the second prefill partly read from vLLM's prefix cache: the same log-probs
    assert max(abs(a - b) for a, b in zip(cut_call.logprobs, free_call.logprobs)) < TOL


def test_a_multi_turn_episode_stitches_into_one_trajectory(served, engine):
    gw, rec, tok = served
    c = gw.open_episode("turns")
    client = c.openai()
    msgs = [{"role": "user", "content": "rev abcdefghij=" * 10}]  # 150 characters: past one 128-token KV block
    for turn in range(3):
        r = client.chat.completions.create(model="m", messages=msgs)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": f"again {turn}"}]
    record = gw.close_episode(c)
    [seg] = stitch(record.calls)
    assert seg.calls == [0, 1, 2] and [x.reused_call for x in record.calls] == [None, 0, 1]
    ones = [lp for lp, m in zip(seg.logprobs, seg.response_mask) if m]
    assert ones == [lp for x in record.calls for lp in x.logprobs]
    # each later turn re-sends the history token for token, so vLLM's prefix cache serves the full KV blocks
    # (128 tokens on CPU) of the turn before: its prompt and completion but the last sampled token (never computed)
    size = engine.transport.llm.llm_engine.vllm_config.cache_config.block_size
    for before, call in zip(record.calls, record.calls[1:]):
        cont = _the_engines(rec, call.prompt_ids)
        computed = len(before.prompt_ids) + len(before.completion_ids) - 1
        assert cont.cached_tokens == size * (computed // size) > 0, (cont.cached_tokens, computed, size)


def test_concurrent_calls_share_an_engine_batch(engine, policy):
    _, tok = policy
    rec = Recording(engine)
    prompts = ["rev abc=", "12+3=", "rev qrstu=", "rev hgfedc="]
    with Gateway(rec, tok, sampling=SamplingParams(max_new_tokens=MAX_NEW),
                 limits=GatewayLimits(batch_wait_s=1.0, concurrency=3)) as gw:
        clients = [gw.open_episode(f"e{i}") for i in range(4)]

        async def all_calls():
            return await asyncio.gather(*[c.async_openai().chat.completions.create(
                model="m", messages=[{"role": "user", "content": p}]) for p, c in zip(prompts, clients)])

        answers = asyncio.run(all_calls())
        records = [gw.close_episode(c) for c in clients]
    sizes = [len(prefixes) for prefixes, _ in rec.calls]
    # 4 calls, at most 3 a batch: (3, 1) when they arrive within the scheduler's 1 s wait
    assert sum(sizes) == 4 and 2 <= max(sizes) <= 3, sizes
    for a, record, p in zip(answers, records, prompts):
        [call] = record.calls
        assert call.messages[0]["content"] == p
        cont = _the_engines(rec, call.prompt_ids)
        assert call.completion_ids == cont.ids and call.logprobs == [float(x) for x in cont.logprobs]
        assert a.choices[0].message.content == _text(tok, call.completion_ids)
    # a batch samples each row from its own seed: the rows of one batch are not copies of each other
    assert len({tuple(r.calls[0].completion_ids) for r in records}) > 1


def test_a_server_mode_engine_behind_the_gateway(policy, tmp_path):
    """rollout.vllm.mode=server: the engine's rows go to a vLLM server it started as concurrent /v1/completions
    requests; the gateway's records are still exactly what the engine returned, and the served policy's."""
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    model, tok = policy
    engine = VLLMRolloutEngine.from_model(model, tok, seed=0, options=VLLMOptions(dtype="float32", mode="server"),
                                          log_dir=tmp_path)
    try:
        rec = Recording(engine)
        with Gateway(rec, tok, sampling=SamplingParams(max_new_tokens=MAX_NEW),
                     limits=GatewayLimits(batch_wait_s=1.0)) as gw:
            clients = [gw.open_episode(f"s{i}") for i in range(3)]

            async def all_calls():
                return await asyncio.gather(*[c.async_openai().chat.completions.create(
                    model="m", messages=[{"role": "user", "content": p}], stream=i == 0)
                    for i, (p, c) in enumerate(zip(["rev abc=", "12+3=", "rev qrstu="], clients))])

            asyncio.run(all_calls())
            calls = [gw.close_episode(c).calls[0] for c in clients]
        assert max(len(prefixes) for prefixes, _ in rec.calls) >= 2  # batched into one continue_ids call
        for call in calls:
            cont = _the_engines(rec, call.prompt_ids)
            assert call.completion_ids == cont.ids and call.logprobs == [float(x) for x in cont.logprobs]
            _assert_scored(engine, call)
    finally:
        engine.close()


def test_credo_train_with_the_gateway_collector_on_vllm(tmp_path):
    """A tiny ``credo train`` (2 steps) with the plain ``openai`` client's tool agent, sampled by vLLM through the
    gateway: the trainer's first mini-batch matches the sampler's log-probs (no first_ratio or finite_logprobs
    trips) and vLLM served each step's synced weights."""
    _need_vllm()
    from tests.collect.test_gateway import assert_trained_on_policy, train

    code, run = train(tmp_path, "vllm", "rollout.collector.agent=tests.collect.gateway_agents:openai_tools",
                      "rollout.engine=vllm", "rollout.vllm.dtype=float32", "model.num_heads=1",
                      "model.num_kv_heads=1", "train.steps=2")  # hidden 32, one head: head_dim 32
    assert code == 0
    rows = assert_trained_on_policy(run, 2)
    assert all(r.get("guard/weight_sync_trips") == 0.0 for r in rows)  # vLLM's probe after each sync passed
    assert all(r["rollout/logprob_abs_diff"] < TOL for r in rows)  # vLLM's log-probs are the trainer's
    assert [r["rollout/policy_version"] for r in rows] == [0, 1]  # step 2 sampled the synced weights
