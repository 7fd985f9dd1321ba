"""Rollout: sampling, stopping, log-probs that agree with the trainer, seeded reproducibility."""
from __future__ import annotations

import pytest
import torch

from credo.rollout import HFRolloutEngine, RolloutEngine, filter_logits
from credo.models.batch import collate
from credo.train.forward import batched_logprobs
from credo.types import Example, RewardResult, SamplingParams, Trajectory

PROMPTS = [Example("rev abc=", "cba", "a"), Example("rev hgfedc=", "cdefgh", "b"), Example("12+3=", "15", "c")]


def test_engine_satisfies_protocol(tiny_model):
    assert isinstance(HFRolloutEngine(*tiny_model), RolloutEngine)


def test_groups_lengths_and_finish_reasons(tiny_model):
    model, tok = tiny_model
    engine = HFRolloutEngine(model, tok, seed=0)
    trajs = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=6))
    assert [t.group_id for t in trajs] == [0] * 4 + [1] * 4 + [2] * 4
    for t in trajs:
        assert t.prompt_ids == engine.encode(t.example.prompt)
        assert 1 <= len(t.response_ids) <= 6
        assert len(t.rollout_logprobs) == len(t.response_ids) == len(t.response_mask)
        assert all(lp <= 0 for lp in t.rollout_logprobs)
        if t.finish_reason == "eos":
            assert t.response_ids[-1] == tok.eos_token_id and tok.eos_token_id not in t.response_ids[:-1]
        else:
            assert len(t.response_ids) == 6 and tok.eos_token_id not in t.response_ids


def test_eos_stops_a_row(tiny_model):
    model, tok = tiny_model
    with torch.no_grad():  # make EOS overwhelmingly likely
        model.lm_head.weight.data[tok.eos_token_id] *= 0
        model.model.norm.weight.data.fill_(0.0)
        model.lm_head.bias = None
    engine = HFRolloutEngine(model, tok, seed=0)
    bias = torch.full((len(tok),), -50.0)
    bias[tok.eos_token_id] = 50.0
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    try:
        trajs = engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=5))
    finally:
        handle.remove()
    assert all(t.finish_reason == "eos" and t.response_ids == [tok.eos_token_id] for t in trajs)
    assert all(t.response_text == "" for t in trajs)


def test_rollout_logprobs_match_trainer_recompute(tiny_model):
    """The sampler's log-probs (left-padded, KV cache) equal the trainer's full forward on the batch."""
    model, tok = tiny_model
    engine = HFRolloutEngine(model, tok, seed=1)
    for temperature in (1.0, 0.7):
        trajs = engine.generate(PROMPTS, 3, SamplingParams(max_new_tokens=7, temperature=temperature, top_k=20))
        batch = collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id)
        old, _ = batched_logprobs(model, batch, micro_batch_size=4, temperature=temperature)
        mask = batch.response_mask.bool()
        torch.testing.assert_close(old[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=1e-4)


def test_sampling_is_reproducible_by_seed_and_state(tiny_model):
    model, tok = tiny_model
    sp = SamplingParams(max_new_tokens=6)
    a = HFRolloutEngine(model, tok, seed=5)
    b = HFRolloutEngine(model, tok, seed=5)
    first = [t.response_ids for t in a.generate(PROMPTS, 2, sp)]
    assert first == [t.response_ids for t in b.generate(PROMPTS, 2, sp)]
    state = a.state_dict()
    nxt = [t.response_ids for t in a.generate(PROMPTS, 2, sp)]
    a.load_state_dict(state)
    assert nxt == [t.response_ids for t in a.generate(PROMPTS, 2, sp)]
    # a per-call seed neither depends on nor moves the engine's stream
    seeded = SamplingParams(max_new_tokens=6, seed=123)
    s1 = [t.response_ids for t in a.generate(PROMPTS, 2, seeded)]
    state = a.state_dict()
    s2 = [t.response_ids for t in b.generate(PROMPTS, 2, seeded)]
    assert s1 == s2 and torch.equal(a.state_dict()["generator"], state["generator"])


def test_chunking_does_not_change_greedy_output(tiny_model):
    model, tok = tiny_model
    sp = SamplingParams(greedy=True, max_new_tokens=6)
    whole = HFRolloutEngine(model, tok, max_batch_size=64).generate(PROMPTS, 2, sp)
    chunked = HFRolloutEngine(model, tok, max_batch_size=2).generate(PROMPTS, 2, sp)
    assert [t.response_ids for t in whole] == [t.response_ids for t in chunked]
    assert whole[0].response_ids == whole[1].response_ids  # greedy: both samples of a prompt agree


def test_split_rows_sample_exactly_what_one_call_samples(tiny_model):
    """A worker given (key, first_row) samples the rows a single engine call would: the pool's split over workers
    and the engine's max_batch_size chunks do not change any token."""
    from credo.rollout.hf import draw_key

    model, tok = tiny_model
    sp = SamplingParams(max_new_tokens=6, temperature=1.5)
    whole = HFRolloutEngine(model, tok, seed=3).generate(PROMPTS, 4, sp)  # 12 rows
    key = draw_key(torch.Generator().manual_seed(3))  # the key the seed-3 engine drew for its first call
    worker = HFRolloutEngine(model, tok, seed=99, max_batch_size=3)
    first = worker.generate(PROMPTS[:2], 4, sp, stream=(key, 0))  # rows 0..7
    second = worker.generate(PROMPTS[2:], 4, sp, stream=(key, 8))  # rows 8..11
    assert [t.response_ids for t in first + second] == [t.response_ids for t in whole]
    other = worker.generate(PROMPTS[2:], 4, sp, stream=(key, 0))  # same prompt, other rows: other draws
    assert [t.response_ids for t in other] != [t.response_ids for t in second]


def test_uniform_draws_are_uniform_and_independent_of_batching():
    from credo.rollout.hf import uniform_draws

    u = torch.cat([uniform_draws(12345, torch.arange(2000), t) for t in range(50)])  # 100k draws
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    counts = torch.histc(u, 10, 0, 1)  # each decile holds 10k +- a few hundred
    assert float((counts - 10_000).abs().max()) < 500
    rows = torch.tensor([5, 1, 9])
    assert torch.equal(uniform_draws(7, rows, 4), uniform_draws(7, torch.arange(10), 4)[rows])
    assert not torch.equal(uniform_draws(7, rows, 4), uniform_draws(8, rows, 4))
    grid = uniform_draws(7, rows, torch.arange(6))  # (3, 6): all steps at once, as the decode loop draws them
    assert grid.shape == (3, 6) and torch.equal(grid[:, 4], uniform_draws(7, rows, 4))


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    k2 = filter_logits(logits, top_k=2)
    assert torch.isfinite(k2).tolist() == [[True, True, False, False]]
    # top_p=0.7: keep the smallest prefix whose mass reaches 0.7 -> {0.5, 0.3}
    p = filter_logits(logits, top_p=0.7)
    assert torch.isfinite(p).tolist() == [[True, True, False, False]]
    p = filter_logits(logits, top_p=0.5)  # 0.5 alone reaches 0.5
    assert torch.isfinite(p).tolist() == [[True, False, False, False]]
    assert torch.equal(filter_logits(logits), logits)


def test_stop_sequences_end_a_row_after_the_sequence(tiny_model):
    model, tok = tiny_model
    engine = HFRolloutEngine(model, tok, seed=0)
    prefixes = [engine.encode("abc"), engine.encode("hello world")]
    sp = SamplingParams(greedy=True, max_new_tokens=10)
    free = engine.continue_ids(prefixes, sp)
    assert all(len(c.ids) >= 4 for c in free), "the tiny greedy model should run on for a few tokens"
    # stop at row 0's tokens 1..2: each row ends right after the first occurrence of them (kept), if any
    seq = tuple(free[0].ids[1:3])

    def expected(ids):
        first = next((i for i in range(len(seq), len(ids) + 1) if tuple(ids[i - len(seq):i]) == seq), None)
        return (ids[:first], "stop") if first else (ids, free[1].finish_reason)

    cut = engine.continue_ids(prefixes, sp, stop_sequences=(seq,))
    assert (cut[0].ids, cut[0].finish_reason) == expected(free[0].ids) and len(cut[0].ids) <= 3
    assert cut[0].logprobs == free[0].logprobs[:len(cut[0].ids)]
    assert (cut[1].ids, cut[1].finish_reason) == expected(free[1].ids)


def test_compaction_and_shared_prefill_keep_every_row_exact(tiny_model):
    """Rows that stop early leave the batch (KV cache compacted) and identical prompts share one prefill; the
    surviving rows' tokens and log-probs must still equal the trainer's full forward, and a row's greedy
    continuation must not depend on its batch companions."""
    model, tok = tiny_model
    engine = HFRolloutEngine(model, tok, seed=3)
    stop_ids = tuple(range(4, len(tok), 3))  # a third of the vocabulary stops a row: rows end at many steps
    prefixes = [engine.encode(p.prompt) for p in PROMPTS for _ in range(4)]
    outs = engine.continue_ids(prefixes, SamplingParams(max_new_tokens=12, temperature=1.3), stop_ids=stop_ids)
    lengths = [len(c.ids) for c in outs]
    assert len(set(lengths)) >= 3 and min(lengths) < 12 / 4  # compaction happened at several points
    trajs = [Trajectory(example=PROMPTS[i // 4], group_id=i // 4, prompt_ids=prefixes[i], response_ids=c.ids,
                        rollout_logprobs=c.logprobs, response_mask=[1] * len(c.ids), finish_reason="eos")
             for i, c in enumerate(outs)]
    batch = collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=tok.pad_token_id)
    old, _ = batched_logprobs(model, batch, micro_batch_size=None, temperature=1.3)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(old[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=1e-4)
    greedy = SamplingParams(greedy=True, max_new_tokens=8)
    together = engine.continue_ids(prefixes, greedy, stop_ids=stop_ids)
    alone = [engine.continue_ids([p], greedy, stop_ids=stop_ids)[0] for p in prefixes[::4]]
    assert [c.ids for c in together[::4]] == [c.ids for c in alone]


def test_inverse_cdf_sampling_draws_from_the_filtered_distribution(tiny_model):
    model, tok = tiny_model
    engine = HFRolloutEngine(model, tok)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0 + 1e-30]]))
    sp = SamplingParams(temperature=1.0, top_k=2)
    # cdf over the top-2 mass {0.5, 0.3} renormalised: [0.625, 1.0, 1.0, 1.0]
    picks = [int(engine._sample(logits, sp, torch.tensor([u]))[0]) for u in (0.0, 0.3, 0.624, 0.626, 0.999)]
    assert picks == [0, 0, 0, 1, 1]


def _tiny_llama(tok):
    """SmolLM2's architecture in miniature: Llama, grouped-query attention, tied embeddings, no biases."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, rope_theta=10000.0, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_lean_decode_equals_the_generic_forward(tiny_model, arch):
    """credo's lean decode loop (preallocated cache, in-place writes) against transformers' forward: the same
    tokens with the same draws (greedy and sampled) and log-probs equal to 1e-5, with rows leaving mid-way
    (compaction) and prompts of different lengths (left padding)."""
    from credo.rollout.lean import lean_decoder

    model, tok = tiny_model
    if arch == "llama":
        model = _tiny_llama(tok)
    assert lean_decoder(model) is not None
    lean, generic = HFRolloutEngine(model, tok, seed=3), HFRolloutEngine(model, tok, seed=3, lean=False)
    assert generic.lean is None
    stop_ids = tuple(range(4, len(tok), 3))  # a third of the vocabulary stops a row: rows end at many steps
    prefixes = [lean.encode(p.prompt) for p in PROMPTS for _ in range(4)]
    for sp in (SamplingParams(max_new_tokens=12, greedy=True), SamplingParams(max_new_tokens=12, temperature=1.3)):
        a = lean.continue_ids(prefixes, sp, stop_ids=stop_ids, top_logprobs=3)
        b = generic.continue_ids(prefixes, sp, stop_ids=stop_ids, top_logprobs=3)
        assert [c.ids for c in a] == [c.ids for c in b]
        if not sp.greedy:
            assert len({len(c.ids) for c in a}) >= 3  # compaction happened at several points
        assert max(len(c.ids) for c in a) > 4  # several lean steps were taken
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


def test_lean_decoder_declines_other_architectures(tiny_model):
    from credo.rollout.lean import lean_decoder

    model, tok = tiny_model
    model.config.model_type = "gpt2"
    try:
        assert lean_decoder(model) is None and HFRolloutEngine(model, tok).lean is None
    finally:
        model.config.model_type = "qwen2"
