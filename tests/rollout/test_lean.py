"""The lean decode step's prepared pieces (credo.rollout.lean): the rotary table, the stacked projection weights,
their refresh after new weights, and the fallback to the model's own modules where a hook or adapter sits on one.
The whole loop against transformers' forward is tests/rollout/test_hf.py::test_lean_decode_equals_the_generic_forward
(it runs the stacked path: the tiny models are below FUSE_MAX_HIDDEN)."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from credo.rollout.lean import FUSE_MAX_HIDDEN, fuse_layer, lean_decoder


def _prefilled(model, batch: int = 3, prompt: int = 5):
    """A prefilled transformers cache and mask for `batch` rows of `prompt` random tokens."""
    torch.manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt))
    attn = torch.ones(batch, prompt, dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=torch.arange(prompt).expand(batch, prompt),
                    cache=DynamicCache(config=model.config), use_cache=True)
    return out.cache, attn, ids[:, -1]


def _steps(lean, model, n: int = 4, fuse: bool = True, mutate=None) -> list[torch.Tensor]:
    """Logits of `n` lean decode steps from a fresh prefill (each feeding the argmax); `mutate(state)` runs before
    the third step."""
    lean.fuse = fuse
    cache, attn, nxt = _prefilled(model)
    state = lean.start(cache, attn, n)
    pos = attn.sum(-1, keepdim=True) - 1
    out = []
    for t in range(n):
        if mutate is not None and t == 2:
            mutate(state)
        pos = pos + 1
        logits = lean.step(state, nxt, pos)
        out.append(logits)
        nxt = logits.argmax(-1)
    return out


def test_small_models_stack_their_projections_and_agree_with_the_unstacked_step(tiny_model):
    model, _ = tiny_model
    lean = lean_decoder(model)
    assert model.config.hidden_size <= FUSE_MAX_HIDDEN and lean.fuse
    cache, attn, _ = _prefilled(model)
    state = lean.start(cache, attn, 4)
    assert all(f is not None for f in state.fused)
    a0 = model.model.layers[0].self_attn
    assert torch.equal(state.fused[0].qkv_weight, torch.cat([a0.q_proj.weight, a0.k_proj.weight, a0.v_proj.weight]))
    for x, y in zip(_steps(lean, model, fuse=True), _steps(lean, model, fuse=False)):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)  # another matmul blocking: float rounding only


def test_rotary_table_equals_the_rotary_module_bit_for_bit(tiny_model):
    model, _ = tiny_model
    lean = lean_decoder(model)
    cache, attn, _ = _prefilled(model)
    state = lean.start(cache, attn, 7)
    positions = torch.tensor([[0], [5], [11]])  # (B, 1), up to P + new_tokens - 1
    cos, sin = lean.rotary(state.keys[0], positions)
    assert torch.equal(state.rope[0][positions.view(-1)], cos[:, 0])
    assert torch.equal(state.rope[1][positions.view(-1)], sin[:, 0])


def test_new_weights_mid_continuation_are_read_after_refresh(tiny_model):
    """A partial rollout's hook may change the weights between decode steps without a fresh prefill: the stacked
    copies must then be re-read (HFRolloutEngine._keeps_kv calls refresh). Without it the step would use the old
    weights; after it, the stacked step equals the unstacked one, which reads the live modules."""
    model, _ = tiny_model
    lean = lean_decoder(model)
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    def change(state, refresh):
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(1.5)
                layer.mlp.up_proj.weight.mul_(-1.0)
        if refresh:
            lean.refresh(state)

    try:
        stale = _steps(lean, model, mutate=lambda s: change(s, False))
        model.load_state_dict(saved)
        fresh = _steps(lean, model, mutate=lambda s: change(s, True))
        model.load_state_dict(saved)
        live = _steps(lean, model, fuse=False, mutate=lambda s: change(s, False))
    finally:
        model.load_state_dict(saved)
    torch.testing.assert_close(fresh[2], live[2], atol=1e-5, rtol=0)
    assert (stale[2] - live[2]).abs().max() > 1e-3  # the copies are real copies: refresh is what reads new weights


def test_a_hooked_projection_runs_through_its_module(tiny_model):
    model, _ = tiny_model
    lean = lean_decoder(model)
    calls = []
    handle = model.model.layers[1].self_attn.k_proj.register_forward_hook(lambda m, i, o: calls.append(1))
    try:
        assert fuse_layer(model.model.layers[1]) is None and fuse_layer(model.model.layers[0]) is not None
        _steps(lean, model, n=3)
    finally:
        handle.remove()
    assert len(calls) == 1 + 3  # the prefill (transformers' forward) and each lean step


def test_large_models_keep_their_own_projections(tiny_model):
    model, _ = tiny_model
    hidden = model.config.hidden_size
    model.config.hidden_size = FUSE_MAX_HIDDEN + 1
    try:
        lean = lean_decoder(model)
    finally:
        model.config.hidden_size = hidden
    cache, attn, _ = _prefilled(model)
    assert not lean.fuse and lean.start(cache, attn, 2).fused == [None] * len(model.model.layers)
