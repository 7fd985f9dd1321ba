"""Per-layer hidden states for ``credo parity``: where two forwards of the same tokens start to differ.

Trainer side (:func:`trainer_layer_states`): the trainer's own :func:`credo.train.forward.response_hidden` runs
with forward hooks that record each call's embedding output and every decoder layer's output, and a hook on the
final norm that returns them concatenated along the hidden dimension with the norm's own output. Whatever layout
the variant uses (padded rows, packed rows, a shared-prompt forward in two calls, packed responses on a prompt
cache), its own gather then picks exactly the positions that predict the response tokens, for every layer at
once: (N, L + 2, H), row-major over the real response tokens (embedding, layers 0 .. L-1, final norm).

Engine side (:func:`engine_layer_states`, credo's HF engine): the engine decodes one row per call (so no row
leaves the batch mid-way) with hooks that keep the last position of every call (the prefill's last prompt
token, then one decode step per further token). Its lean decode (credo.rollout.lean) does not call the decoder
layer modules, only their submodules, so a layer's output is read as its post-attention residual (the input of
``post_attention_layernorm``) plus its MLP's output, which is the layer's output in the Llama family
(credo.rollout.lean.SUPPORTED). vLLM exposes no per-layer states: its side is not localised (docs/parity.md).

:func:`compare_layers` reports per layer max |a - b| and its ratio to max |a|, and the first layer whose ratio
exceeds ``tol`` (default :data:`LAYER_TOL`, about a thousand float32 roundings; docs/parity.md).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

LAYER_TOL = 1e-4  # relative max |difference| of a layer's states above float32 rounding noise (docs/parity.md)


def decoder_layers(model: torch.nn.Module) -> tuple[torch.nn.Module, list[torch.nn.Module], torch.nn.Module]:
    """(embedding, decoder layers, final norm) of a Hugging Face causal LM's backbone."""
    base = model.base_model
    base = getattr(base, "language_model", base)  # a vision-language model's text backbone
    layers, norm, embed = getattr(base, "layers", None), getattr(base, "norm", None), getattr(base, "embed_tokens", None)
    if layers is None or norm is None or embed is None:
        raise NotImplementedError(f"{type(model).__name__}: per-layer states need a backbone with embed_tokens, "
                                  "layers and norm (the Llama / Qwen2 family layout)")
    return embed, list(layers), norm


def layer_names(n_layers: int) -> list[str]:
    return ["embed", *(f"layer.{i}" for i in range(n_layers)), "final_norm"]


def _first(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x


@contextlib.contextmanager
def stacked_norm_output(model: torch.nn.Module):
    """While active, the backbone's final norm returns cat([embedding, layer 0, ..., layer L-1, norm], -1) of the
    same call (module docstring); yields the hidden size."""
    embed, layers, norm = decoder_layers(model)
    seen: dict[int, torch.Tensor] = {}
    handles = [embed.register_forward_hook(lambda m, a, out: seen.__setitem__(-1, _first(out)))]
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, _first(out))))

    def stack(module, args, out):
        parts = [seen[-1], *(seen[i] for i in range(len(layers))), out]
        dtype = out.dtype
        return torch.cat([p.to(dtype) for p in parts], dim=-1)

    handles.append(norm.register_forward_hook(stack))
    try:
        yield norm.weight.shape[-1]
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def trainer_layer_states(model: torch.nn.Module, batch, opts, *, one_row: bool = False) -> torch.Tensor:
    """(N, L + 2, H) float32 states predicting the batch's real response tokens under the trainer's forward with
    ``opts`` (credo.train.forward.ForwardOptions; its autocast applies); ``one_row``: each row alone, trimmed as a
    micro-batch of one (credo.train.forward.trim)."""
    from credo.train.forward import response_hidden, trim
    from credo.train.mixed_precision import compute

    was_training = model.training
    model.eval()
    try:
        rows = [trim(batch.select(torch.tensor([i]))) for i in range(batch.batch_size)] if one_row else [batch]
        out = []
        with stacked_norm_output(model) as h:
            for mb in rows:
                with compute(model, opts.autocast):
                    hidden, _, _ = response_hidden(model, mb, opts)
                out.append(hidden.float().reshape(hidden.shape[0], -1, h))
    finally:
        model.train(was_training)
    return torch.cat(out).cpu()


@contextlib.contextmanager
def last_position_taps(model: torch.nn.Module, lean: bool):
    """Record, per forward call of the engine, the last position's states of every layer: yields a list that gets
    one (rows, L + 2, H) tensor per call. ``lean``: a layer's output is read as post-attention residual + MLP output
    (module docstring); else the decoder layer's own output."""
    embed, layers, norm = decoder_layers(model)
    calls: list[torch.Tensor] = []
    seen: dict[Any, torch.Tensor] = {}

    def keep(key):
        return lambda m, a, out: seen.__setitem__(key, _first(out)[:, -1].float())

    handles = [embed.register_forward_hook(keep("embed"))]
    for i, layer in enumerate(layers):
        if lean:
            handles.append(layer.post_attention_layernorm.register_forward_pre_hook(
                lambda m, a, i=i: seen.__setitem__(("mid", i), _first(a)[:, -1].float())))
            handles.append(layer.mlp.register_forward_hook(keep(("mlp", i))))
        else:
            handles.append(layer.register_forward_hook(keep(i)))

    def close(module, args, out):
        per_layer = [seen[("mid", i)] + seen[("mlp", i)] if lean else seen[i] for i in range(len(layers))]
        calls.append(torch.stack([seen["embed"], *per_layer, _first(out)[:, -1].float()], dim=1).cpu())

    handles.append(norm.register_forward_hook(close))
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def engine_layer_states(engine, prefixes: list[list[int]], sampling, key: int) -> tuple[list, torch.Tensor]:
    """(continuations, (N, L + 2, H) states) of credo's HF engine decoding each prefix alone as row i of the call
    keyed ``key`` (the same draws as row i of one batched call), states row-major over the sampled tokens."""
    lean = engine.lean is not None
    if lean and not all(hasattr(layer, "post_attention_layernorm") and hasattr(layer, "mlp")
                        for layer in decoder_layers(engine.model)[1]):
        raise NotImplementedError("the lean decode's layers have no post_attention_layernorm / mlp")
    conts, states = [], []
    with last_position_taps(engine.model, lean) as calls:
        for i, prefix in enumerate(prefixes):
            calls.clear()
            [cont] = engine.continue_ids([prefix], sampling, stream=(key, i))
            conts.append(cont)
            states.append(torch.cat(calls[: len(cont.ids)]))  # prefill, then one decode step per further token
    return conts, torch.cat(states)


def compare_layers(a: torch.Tensor, b: torch.Tensor, names: list[str], *, tol: float = LAYER_TOL) -> dict:
    """Per layer max |a - b| over tokens and features, its ratio to max |a|, and the first layer past ``tol``."""
    if a.shape != b.shape:
        raise ValueError(f"layer states of different shapes {tuple(a.shape)} and {tuple(b.shape)}")
    diff = (a.double() - b.double()).abs().flatten(2).amax(dim=(0, 2))  # (L + 2,)
    ref = a.double().abs().flatten(2).amax(dim=(0, 2)).clamp(min=1e-30)
    rows = [{"layer": n, "max_abs": float(d), "ref_max_abs": float(r), "rel": float(d / r)}
            for n, d, r in zip(names, diff, ref)]
    first = next((r["layer"] for r in rows if r["rel"] > tol), None)
    return {"per_layer": rows, "first_diverging": first, "tol": tol}


def localise(name_a: str, name_b: str, states: Callable[[], tuple[torch.Tensor, torch.Tensor]], names: list[str],
             tol: float) -> dict:
    """:func:`compare_layers` of two sides' states, labelled; a side that cannot give per-layer states is reported
    with the reason instead."""
    try:
        a, b = states()
    except NotImplementedError as e:
        return {"a": name_a, "b": name_b, "skipped": str(e)}
    return {"a": name_a, "b": name_b, **compare_layers(a, b, names, tol=tol)}


def diverging_layer(model_a: torch.nn.Module, model_b: torch.nn.Module, batch, opts_a, opts_b=None, *,
                    tol: float = LAYER_TOL) -> dict:
    """:func:`compare_layers` of two models' (or two layouts') trainer forwards of the same batch: e.g. a policy
    and its copy with one layer changed, or a float32 policy and its bfloat16 copy."""
    a = trainer_layer_states(model_a, batch, opts_a)
    b = trainer_layer_states(model_b, batch, opts_b or opts_a)
    return compare_layers(a, b, layer_names(len(decoder_layers(model_a)[1])), tol=tol)
