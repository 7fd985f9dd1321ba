"""Activation checkpointing (``train.activation_checkpointing``): each decoder layer's activations are recomputed
in the backward pass instead of kept from the forward (docs/performance.md, "Activation checkpointing").

transformers' own per-layer checkpointing (``gradient_checkpointing_enable``, non-reentrant
``torch.utils.checkpoint``): it wraps each decoder layer's ``forward`` (not ``__call__``, so FSDP2's hooks stay
outside the recompute), works with LoRA injected in place (non-reentrant checkpointing needs no input that
requires grad, so ``enable_input_require_grads`` is not needed) and with the padding-free packed forward. It
drops a layer's KV cache while training with gradients, so the shared-prompt forward (which runs the responses on
their prompts' cached keys and values) is not used then: :func:`recomputing` tells credo.train.forward to run
the full forward instead. Gradients are those of the plain forward (tested in float64 to 1e-6,
tests/train/test_activation_checkpointing.py)."""
from __future__ import annotations

import torch


def _backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model to checkpoint: a critic's (credo.models.value.ValueModel) backbone, else the model."""
    return getattr(model, "backbone", model)


def enable_activation_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Recompute each decoder layer's activations in the backward pass (in place; returns ``model``)."""
    target = _backbone(model)
    if not getattr(target, "supports_gradient_checkpointing", False):
        raise ValueError(f"train.activation_checkpointing: {type(target).__name__} does not support transformers' "
                         "gradient checkpointing; set train.activation_checkpointing=false")
    kwargs = {"use_reentrant": False}
    if hasattr(target, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns there
        target.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def recomputing(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` now checkpoints its layers (training mode, gradients on, enabled): then
    transformers drops the KV cache inside the layers, and a forward that relies on one must not be used."""
    target = _backbone(model)
    name = "is_activation_checkpointing" if hasattr(target, "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return bool(getattr(target, name, False)) and target.training and torch.is_grad_enabled()
