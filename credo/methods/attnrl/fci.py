"""The FCI pass of AttnRL: a no-grad forward of the policy with eager attention, reduced to step scores.

The reference patches ``modeling_qwen2.py`` so that its attention module returns step-level scores in place of the
(H, S, S) weights. credo leaves the model alone: the policy is switched to transformers' ``eager`` attention for the
pass (``set_attn_implementation``, or the config attribute on older versions) and a forward hook on every attention
module reduces that layer's weights (B, H, S, S) to FCI scores (B, K) at once, so only one layer's weights are ever
held. Scores are the max over layers and heads (:func:`credo.methods.attnrl.algo.fci_from_step_attention`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from credo.methods.attnrl.algo import Span, fci_from_step_attention
from credo.models.batch import token_batch


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module) -> Iterator[None]:
    """The model runs transformers' eager attention (which returns its weights) inside the block."""
    config = model.config
    before = getattr(config, "_attn_implementation", None)
    if before == "eager":
        yield
        return
    switch = getattr(model, "set_attn_implementation", None)
    if switch is not None:
        switch("eager")
    else:
        config._attn_implementation = "eager"
    try:
        yield
    finally:
        if switch is not None:
            switch(before)
        else:
            config._attn_implementation = before


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention modules of a transformers decoder (those that carry a ``layer_idx``)."""
    return [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]


@torch.no_grad()
def fci_forward(model: torch.nn.Module, prompt_ids: Sequence[list[int]], response_ids: Sequence[list[int]],
                response_spans: Sequence[Sequence[Span]], *, pad_id: int, ignore: int = 4,
                stop_steps: Sequence[int | None] | None = None, micro_batch: int = 16) -> list[torch.Tensor]:
    """FCI score of every response step, (len(response_spans[i]),) per response (the prompt's step 0 dropped).

    ``response_spans`` are each response's steps in response coordinates; ``stop_steps[i]`` (sequence numbering,
    step 0 = the prompt) zeroes that step and the later ones.
    """
    layers = attention_modules(model)
    if not layers:
        raise NotImplementedError(f"attnrl: no attention modules with a layer_idx found in {type(model).__name__}; "
                                  "the FCI pass needs a transformers decoder")
    stops = list(stop_steps) if stop_steps is not None else [None] * len(response_ids)
    was_training = model.training
    model.eval()
    out: list[torch.Tensor] = []
    try:
        with eager_attention(model):
            for start in range(0, len(response_ids), micro_batch):
                end = start + micro_batch
                out += _fci_micro(model, layers, prompt_ids[start:end], response_ids[start:end],
                                  response_spans[start:end], stops[start:end], pad_id=pad_id, ignore=ignore)
    finally:
        model.train(was_training)
    return out


def _fci_micro(model, layers, prompt_ids, response_ids, response_spans, stops, *, pad_id: int,
               ignore: int) -> list[torch.Tensor]:
    batch = token_batch(list(prompt_ids), list(response_ids), pad_id=pad_id)
    p = batch.prompt_len
    seq = batch.input_ids.shape[1]
    k_max = 1 + max((len(s) for s in response_spans), default=0)
    weights = torch.zeros(len(response_ids), k_max, seq)  # (B, K, S) step-averaging rows, step 0 = the prompt
    for b, (prompt, spans) in enumerate(zip(prompt_ids, response_spans)):
        weights[b, 0, p - len(prompt):p] = 1.0 / max(len(prompt), 1)
        for k, (s, e) in enumerate(spans, start=1):
            weights[b, k, p + s:p + e] = 1.0 / max(e - s, 1)
    best = torch.zeros(len(response_ids), k_max)  # (B, K) running max over layers and heads

    def reduce(module, args, output) -> None:
        attn = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if attn is None:
            raise NotImplementedError("attnrl: the attention module returned no weights under eager attention")
        w = weights.to(attn.device).unsqueeze(1)  # (B, 1, K, S)
        alpha = w @ attn.float() @ w.transpose(-1, -2)  # (B, H, K, K)
        y = fci_from_step_attention(alpha, ignore=ignore).amax(1).cpu()  # (B, K)
        torch.maximum(best, y, out=best)

    hooks = [m.register_forward_hook(reduce) for m in layers]
    try:
        device = next(model.parameters()).device
        model(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device),
              position_ids=batch.position_ids.to(device), logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for b, spans in enumerate(response_spans):
        y = best[b, :1 + len(spans)].clone()
        if stops[b] is not None and stops[b] > 0:
            y[stops[b]:] = 0.0
        out.append(y[1:])
    return out
