"""Chunked log-probs / entropy and the padding-free forward equal the naive full-logits computation.

Equivalence tier: float64 so that any difference is a bug, not rounding; gradients included.
"""
from __future__ import annotations

import pytest
import torch

from credo.algo.chunked import chunked_logprobs_entropy, chunked_token_stats
from credo.algo.logprobs import entropy_direction_from_logits, entropy_from_logits, logprobs_from_logits
from credo.config import ModelConfig
from credo.models import build_model
from credo.models.batch import collate
from credo.train.forward import (NAIVE, ForwardOptions, batched_logprobs, micro_batches, policy_logprobs,
                                 shared_prompts, trim)
from credo.train.packing import first_fit, pack, token_budget_groups
from credo.types import Example, RewardResult, Trajectory

F64 = torch.float64


def _naive(h, w, b, y, tau):
    z = (h @ w.T + b) / tau  # (N, V)
    return logprobs_from_logits(z, y), entropy_from_logits(z)


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_chunked_values_and_gradients_equal_naive_float64(chunk_size):
    g = torch.Generator().manual_seed(0)
    n, hdim, v = 37, 16, 50
    h = torch.randn(n, hdim, dtype=F64, generator=g, requires_grad=True)
    w = torch.randn(v, hdim, dtype=F64, generator=g, requires_grad=True)
    b = torch.randn(v, dtype=F64, generator=g, requires_grad=True)
    y = torch.randint(0, v, (n,), generator=g)
    g_lp, g_ent = torch.randn(n, dtype=F64, generator=g), torch.randn(n, dtype=F64, generator=g)

    lp, ent = _naive(h, w, b, y, 0.7)
    (lp * g_lp + ent * g_ent).sum().backward()
    naive_grads = [t.grad.clone() for t in (h, w, b)]
    for t in (h, w, b):
        t.grad = None
    lp2, ent2 = chunked_logprobs_entropy(h, w, y, bias=b, temperature=0.7, chunk_size=chunk_size)
    (lp2 * g_lp + ent2 * g_ent).sum().backward()

    torch.testing.assert_close(lp2, lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent2, ent, rtol=0, atol=1e-12)
    for got, want in zip((h.grad, w.grad, b.grad), naive_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_chunked_passes_gradcheck_and_log_prob_only_mode():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(7, 4, dtype=F64, generator=g, requires_grad=True)
    w = torch.randn(9, 4, dtype=F64, generator=g, requires_grad=True)
    y = torch.randint(0, 9, (7,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: chunked_logprobs_entropy(h, w, y, chunk_size=3), (h, w))
    lp, ent = chunked_logprobs_entropy(h, w, y, chunk_size=2, with_entropy=False)
    assert ent is None
    lp.sum().backward()  # d/dz of sum log p_y = onehot - p, so each row's grad w.r.t. h is (onehot - p) @ W
    p = (h.detach() @ w.detach().T).softmax(-1)
    onehot = torch.nn.functional.one_hot(y, 9).to(F64)
    torch.testing.assert_close(h.grad, (onehot - p) @ w.detach(), rtol=0, atol=1e-12)


def test_chunked_token_stats_equal_naive():
    g = torch.Generator().manual_seed(2)
    h, w = torch.randn(11, 8, dtype=F64, generator=g), torch.randn(30, 8, dtype=F64, generator=g)
    y = torch.randint(0, 30, (11,), generator=g)
    z = h @ w.T / 1.3
    lp, stats = chunked_token_stats(h, w, y, ("entropy", "entropy_direction"), temperature=1.3, chunk_size=4)
    torch.testing.assert_close(lp, logprobs_from_logits(z, y), rtol=0, atol=1e-12)
    torch.testing.assert_close(stats["entropy"], entropy_from_logits(z), rtol=0, atol=1e-12)
    torch.testing.assert_close(stats["entropy_direction"], entropy_direction_from_logits(z, y), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="unknown token statistics"):
        chunked_token_stats(h, w, y, ("nope",))


def test_bfloat16_inputs_are_computed_in_float32():
    g = torch.Generator().manual_seed(3)
    h, w = torch.randn(5, 8, generator=g), torch.randn(20, 8, generator=g)
    y = torch.randint(0, 20, (5,), generator=g)
    lp, ent = chunked_logprobs_entropy(h.bfloat16(), w.bfloat16(), y, chunk_size=2)
    want_lp, want_ent = _naive(h.bfloat16().float(), w.bfloat16().float(), torch.zeros(20), y, 1.0)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, want_ent, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ model-level paths

def _model64():
    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      max_position_embeddings=128)
    model, tok = build_model(cfg, seed=0)
    return model.to(F64), tok


def _batch(tok, seed=0):
    """Prompts of different lengths (left padding) and responses of different lengths (right padding), one with a
    masked observation in the middle, as agent episodes have."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i, (p, r) in enumerate([(3, 9), (7, 2), (1, 5), (5, 12), (4, 1)]):
        prompt = torch.randint(4, len(tok), (p,), generator=g).tolist()
        resp = torch.randint(4, len(tok), (r,), generator=g).tolist()
        mask = [1] * r if i != 3 else [1] * 4 + [0] * 5 + [1] * 3
        trajs.append(Trajectory(example=Example(str(i), "", str(i)), group_id=i // 2, prompt_ids=prompt,
                                response_ids=resp, rollout_logprobs=[0.0] * r, response_mask=mask,
                                finish_reason="eos"))
    return collate(trajs, [RewardResult(float(i % 2)) for i in range(len(trajs))], pad_id=tok.pad_token_id)


def _values_and_grads(model, batch, opts, *, temperature, seed):
    """Log-probs, entropy and every parameter's gradient of a random weighting of both, under ``opts``."""
    weights = torch.randn(batch.responses.shape, dtype=F64, generator=torch.Generator().manual_seed(seed))
    model.zero_grad()
    lp, ent = policy_logprobs(model, batch, temperature=temperature, with_entropy=True, opts=opts)
    ((lp * weights + 0.1 * ent) * batch.response_mask).sum().backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("opts", [ForwardOptions(chunk_size=4, pack=False), ForwardOptions(chunk_size=0, pack=True),
                                  ForwardOptions(chunk_size=3, pack=True, row_tokens=16)])
def test_model_logprobs_entropy_and_loss_gradients_equal_naive(opts):
    model, tok = _model64()
    batch = _batch(tok)
    lp0, ent0, grads0 = _values_and_grads(model, batch, NAIVE, temperature=0.9, seed=4)
    lp1, ent1, grads1 = _values_and_grads(model, batch, opts, temperature=0.9, seed=4)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-10)
    assert (lp1[~batch.attention_mask[:, batch.prompt_len:].bool()] == 0).all()  # past a response's end: 0
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], rtol=0, atol=1e-9, msg=name)


def _group_batch(tok, seed=1):
    """Three groups sharing a prompt each (lengths 6, 2, 9: left padding differs between groups) and one lone
    prompt; responses of lengths 1-11, one with a masked observation in the middle."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, len(tok), (n,), generator=g).tolist() for n in (6, 2, 9, 4)]
    trajs = []
    for i, (gid, r) in enumerate([(0, 5), (0, 1), (0, 11), (1, 3), (1, 7), (2, 2), (2, 9), (2, 4), (3, 6)]):
        resp = torch.randint(4, len(tok), (r,), generator=g).tolist()
        mask = [1] * r if i != 2 else [1] * 4 + [0] * 4 + [1] * 3
        trajs.append(Trajectory(example=Example(str(gid), "", "0"), group_id=gid, prompt_ids=prompts[gid],
                                response_ids=resp, rollout_logprobs=[0.0] * r, response_mask=mask,
                                finish_reason="eos"))
    return collate(trajs, [RewardResult(float(i % 2)) for i in range(len(trajs))], pad_id=tok.pad_token_id)


def rmsnorm_in_input_dtype(self, hidden_states):
    """Qwen2RMSNorm.forward computed in the input's dtype. transformers computes it in float32 whatever the input
    dtype, which leaves ~1e-8 relative rounding in a float64 model's gradients (different summation orders then
    differ by that much); with this, float64 comparisons are exact to ~1e-15."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture
def float64_norms(monkeypatch):
    from transformers.models.qwen2 import modeling_qwen2

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", rmsnorm_in_input_dtype)


@pytest.mark.parametrize("chunk_size", [0, 5])
def test_shared_prompt_forward_equals_the_full_forward(chunk_size, float64_norms):
    """Each distinct prompt run once, its keys / values gathered to the rows: log-probs, entropy and every
    parameter gradient equal the full padded forward's (float64)."""
    model, tok = _model64()
    batch = _group_batch(tok)
    first, inverse = shared_prompts(batch)
    assert inverse.tolist() == [inverse[0]] * 3 + [inverse[3]] * 2 + [inverse[5]] * 3 + [inverse[8]]
    assert len(first) == 4 and (inverse[first] == torch.arange(4)).all()  # first[u] is a row of prompt u
    lp0, ent0, grads0 = _values_and_grads(model, batch, NAIVE, temperature=0.7, seed=5)
    lp1, ent1, grads1 = _values_and_grads(model, batch, ForwardOptions(chunk_size=chunk_size or None,
                                                                       share_prompt=True), temperature=0.7, seed=5)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-10)
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], rtol=0, atol=1e-12, msg=name)
    # no-grad statistics through micro-batches of any size (a micro-batch may split a group)
    want, want_st = batched_logprobs(model, batch, micro_batch_size=None, stats=("entropy",), opts=NAIVE)
    got, st = batched_logprobs(model, batch, micro_batch_size=4, stats=("entropy",),
                               opts=ForwardOptions(share_prompt=True))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(st["entropy"], want_st["entropy"], rtol=0, atol=1e-10)


def test_shared_prompts_is_none_without_repeats():
    _, tok = _model64()
    assert shared_prompts(_batch(tok)) is None


def test_packing_puts_several_sequences_in_a_row_and_restarts_positions():
    _, tok = _model64()
    batch = _batch(tok)
    packed = pack(batch, row_tokens=16)
    lengths = batch.attention_mask.sum(-1).tolist()  # [12, 9, 6, 17, 5]
    assert packed.input_ids.shape[0] < batch.batch_size  # fewer rows than sequences
    assert int((packed.position_ids == 0).sum()) >= batch.batch_size  # one restart per sequence (+ padding tails)
    assert packed.labels.tolist() == batch.responses[batch.attention_mask[:, batch.prompt_len:].bool()].tolist()
    assert sum(lengths) <= packed.input_ids.numel() < batch.input_ids.numel()


def test_no_grad_pass_equals_naive_with_token_budget_micro_batches():
    model, tok = _model64()
    batch = _batch(tok)
    want, want_stats = batched_logprobs(model, batch, micro_batch_size=None, stats=("entropy", "entropy_direction"),
                                        opts=NAIVE)
    for kwargs in ({"micro_batch_size": 1}, {"micro_batch_size": None, "micro_batch_tokens": 20}):
        got, stats = batched_logprobs(model, batch, stats=("entropy", "entropy_direction"),
                                      opts=ForwardOptions(chunk_size=5, pack=True, row_tokens=20), **kwargs)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
        for name in want_stats:
            torch.testing.assert_close(stats[name], want_stats[name], rtol=0, atol=1e-10)


def test_trim_drops_padding_columns_and_keeps_the_layout():
    model, tok = _model64()
    batch = _batch(tok)
    micro = micro_batches(batch, size=2)[0]  # rows 0, 1: prompts 3 and 7 tokens, responses 9 and 2
    small = trim(micro)
    assert small.prompt_len == 7 and small.responses.shape[1] == 9
    assert small.input_ids.shape[1] < micro.input_ids.shape[1]
    lp_full, _ = policy_logprobs(model, micro, opts=NAIVE)
    lp_small, _ = policy_logprobs(model, small, opts=NAIVE)
    torch.testing.assert_close(lp_small, lp_full[:, :9], rtol=0, atol=1e-10)


def test_trim_cuts_the_columns_of_per_token_extras_only():
    """Extras declared per token, (B, T, ...), lose the trimmed response columns with the core (B, T) fields; per-row
    ones keep every dimension, even one as long as T (images, the sampled flags)."""
    _, tok = _model64()
    micro = micro_batches(_batch(tok), size=2)[0]  # rows 0, 1: responses 9 and 2 of T = 12 columns
    b, t = micro.responses.shape
    rewards = torch.arange(b * t, dtype=torch.float32).view(b, t)  # (B, T)
    quantiles = torch.randn(b, t, 3)  # (B, T, M)
    pixels = torch.randn(b, 3, t, t)  # (B, 3, H, W) with H = W = T
    micro.set_extra("token_rewards", rewards)
    micro.set_extra("value_quantiles", quantiles)
    micro.set_extra("pixel_values", pixels)
    small = trim(micro)
    assert small.responses.shape[1] == 9 < t
    assert torch.equal(small.extra("token_rewards"), rewards[:, :9])
    assert torch.equal(small.extra("value_quantiles"), quantiles[:, :9])
    assert torch.equal(small.extra("pixel_values"), pixels)
    assert torch.equal(small.extra("sampled"), micro.extra("sampled"))  # (B,): collate's


def test_token_budget_groups_and_first_fit():
    # budget 10: [4, 5] = 9 fits, + 3 would be 12 -> new group; 12 alone (longer than the budget); [2, 2]
    assert token_budget_groups([4, 5, 3, 12, 2, 2], 10) == [[0, 1], [2], [3], [4, 5]]
    # capacity 10, longest first: 7 -> bin 0 (room 3); 6 -> bin 1 (room 4); 3 -> bin 0; 4 -> bin 1; 1 -> bin 2
    assert first_fit([3, 7, 4, 6, 1], 10) == [[1, 0], [3, 2], [4]]


def test_fused_old_logprobs_give_the_same_update_as_a_separate_pass():
    """With one optimizer step per batch, skipping the no-grad pass (old = current log-probs, detached) must leave
    the policy exactly where the separate pass leaves it (ratio 1 either way), and report the same entropy."""
    import copy

    from credo.config import load_config
    from credo.train.optim import build_optimizer, build_scheduler
    from credo.train.update import UpdateOptions, update_policy

    cfg = load_config(None, ["train.warmup_steps=0", "train.lr=0.01"])
    model, tok = _model64()
    batch = _batch(tok)
    batch.advantages = torch.randn(batch.responses.shape, dtype=F64,
                                   generator=torch.Generator().manual_seed(5)) * batch.response_mask
    results = []
    for fused in (False, True):
        m = copy.deepcopy(model)
        b = copy.copy(batch)
        if not fused:
            b.old_logprobs, stats = batched_logprobs(m, b, micro_batch_size=2, stats=("entropy",))
        opt = build_optimizer(m, lr=0.01)
        sched = build_scheduler(opt, warmup_steps=0, total_steps=1)
        metrics = update_policy(UpdateOptions.of(cfg), m, b, opt, sched, step=0)
        results.append((m, metrics, None if fused else stats["entropy"]))
    (m0, _, entropy), (m1, metrics1, _) = results
    for (name, p0), p1 in zip(m0.named_parameters(), m1.parameters()):
        torch.testing.assert_close(p1, p0, rtol=0, atol=1e-12, msg=name)
    want = float((entropy * batch.response_mask).sum() / batch.response_mask.sum())
    assert abs(metrics1["actor/entropy"] - want) < 1e-9 and metrics1["rollout/logprob_abs_diff"] > 0


@pytest.mark.parametrize("zero_rows", [[1, 4], [0, 1, 2, 3, 4, 5, 6, 7, 8]])
def test_skipping_zero_advantage_rows_gives_the_same_update(zero_rows, float64_norms):
    """Rows whose advantages are all zero leave the forward / backward; the normalisers still count them, so the
    parameters land where the whole batch puts them. With no live row the optimizer still steps (weight decay,
    Adam's step count), on zero gradients. With an entropy bonus nothing is skipped."""
    import copy

    from credo.config import load_config
    from credo.train.optim import build_optimizer, build_scheduler
    from credo.train.update import UpdateOptions, update_policy, zero_advantage_rows_inert

    model, tok = _model64()
    batch = _group_batch(tok)
    batch.advantages = torch.randn(batch.responses.shape, dtype=F64,
                                   generator=torch.Generator().manual_seed(6)) * batch.response_mask
    batch.advantages[zero_rows] = 0.0
    results = []
    for skip in (False, True):
        cfg = load_config(None, ["train.warmup_steps=0", "train.weight_decay=0.1", "train.micro_batch_size=4",
                                 f"train.skip_zero_advantage={str(skip).lower()}"])
        assert zero_advantage_rows_inert(UpdateOptions.of(cfg)) == skip
        m = copy.deepcopy(model)
        opt = build_optimizer(m, lr=0.01, weight_decay=0.1)
        metrics = update_policy(UpdateOptions.of(cfg), m, batch, opt,
                                build_scheduler(opt, warmup_steps=0, total_steps=1), step=0)
        results.append((m, metrics))
    (m0, metrics0), (m1, metrics1) = results
    moved = False
    for (name, p0), p1, p in zip(m0.named_parameters(), m1.parameters(), model.parameters()):
        torch.testing.assert_close(p1, p0, rtol=0, atol=1e-12, msg=name)
        moved |= not torch.equal(p1, p)
    assert moved  # weight decay at least
    assert metrics0["actor/skipped_rows_frac"] == 0.0
    assert metrics1["actor/skipped_rows_frac"] == pytest.approx(len(zero_rows) / batch.batch_size)
    assert not zero_advantage_rows_inert(UpdateOptions.of(load_config(None, ["algo.entropy_coef=0.01"])))
    assert not zero_advantage_rows_inert(UpdateOptions.of(load_config(None, ["algo.policy_loss=kl_cov"])))


@pytest.mark.parametrize("row_tokens", [None, 4, 30])
def test_packed_responses_on_shared_prompts_equal_the_full_forward(row_tokens, float64_norms):
    """Responses packed into rows (one longest response by default; 4 tokens: most rows hold one response; 30: several
    prompts in a row's cache) on their prompts' gathered keys / values: log-probs, entropy and every parameter
    gradient equal the full padded forward's (float64), and the same no-grad statistics through micro-batches."""
    from credo.train.shared_pack import _plan

    model, tok = _model64()
    batch = _group_batch(tok)
    opts = ForwardOptions(chunk_size=5, share_prompt=True, pack_responses=True, row_tokens=row_tokens)
    lp0, ent0, grads0 = _values_and_grads(model, batch, NAIVE, temperature=0.7, seed=5)
    lp1, ent1, grads1 = _values_and_grads(model, batch, opts, temperature=0.7, seed=5)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-10)
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], rtol=0, atol=1e-12, msg=name)
    want, _ = batched_logprobs(model, batch, micro_batch_size=None, opts=NAIVE)
    got, _ = batched_logprobs(model, batch, micro_batch_size=4, opts=opts)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    # the packing itself: responses 5, 1, 11, 3, 7, 2, 9, 4, 6 feed 4, 0, 10, 2, 6, 1, 8, 3, 5 tokens = 39, no padding
    # beyond each row's tail; with rows of 30 they fit in 2 rows (first-fit, longest first: 10+8+6+5 = 29, then 4
    # and 3 and 2 do not fit the 1 left, 1 does: 30; the second row 4+3+2 = 9)
    first, inverse = shared_prompts(batch)
    lengths = [5, 1, 11, 3, 7, 2, 9, 4, 6]
    plan = _plan(lengths, [b for b, n in enumerate(lengths) if n > 1], inverse.tolist(),
                 batch.attention_mask[first, :batch.prompt_len], batch.prompt_len, 30)
    assert plan["q_row"].shape == (2, 30)
    pads = plan["allowed"][1, 0, 9:]  # padding queries of row 1 attend to themselves only (no empty mask row)
    assert (plan["q_row"][1, 9:] == 0).all() and (pads.sum(-1) == 1).all()
    assert pads[:, -21:].diagonal().all()  # their own packed columns (the last 21 of 30 of the packed block)
    assert len(plan["out_index"]) == sum(lengths)  # one hidden state per real response token


def test_packed_responses_with_eager_attention():
    """Eager attention adds the block mask as a float mask (sdpa reads it as a boolean one). float32: transformers'
    eager path gives NaN on left-padded float64 rows even in the naive forward, so this compares in float32."""
    model, tok = _model64()
    model = model.float()
    model.config._attn_implementation = "eager"
    batch = _group_batch(tok)
    lp0, _ = policy_logprobs(model, batch, opts=NAIVE)
    lp1, _ = policy_logprobs(model, batch, opts=ForwardOptions(share_prompt=True, pack_responses=True, row_tokens=30))
    assert not lp1.isnan().any()
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
