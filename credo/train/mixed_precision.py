"""Mixed precision (``train.mixed_precision``): bf16 compute with float32 master weights
(docs/performance.md, "Mixed precision").

The policy's parameters, gradients and optimizer state stay float32 (``model.dtype=float32``). Without FSDP2 the
policy's backbone runs under ``torch.autocast(device_type, bfloat16)`` (:func:`compute`); with
``distributed.strategy=fsdp2`` FSDP2 itself casts the gathered parameters to bfloat16 and reduces the gradients in
float32 (:func:`fsdp_policy`, ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)``), and no autocast
is used. Either way the output head's log-probs are computed in float32 from float32 hidden states
(:func:`full_precision`, used by credo.train.forward), so the importance ratios and the loss stay float32.
``fp16`` adds loss scaling: one ``torch.amp.GradScaler`` per optimizer (:func:`loss_scaler`) scales each
backward's loss and unscales the gradients before clipping (credo.train.optim.clip_and_step); its scale is not
checkpointed (a resumed run starts again at 2^16). fp16 is refused with FSDP2 by the config check
(credo.config.validate). The critic computes in float32 either way."""
from __future__ import annotations

import contextlib
import weakref

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(mode: str | None) -> torch.dtype | None:
    """The autocast / FSDP2 parameter dtype of a ``train.mixed_precision`` value (None for ``none``)."""
    if mode in (None, "none"):
        return None
    if mode not in DTYPES:
        raise ValueError(f"train.mixed_precision: {mode!r} is not one of none, bf16, fp16")
    return DTYPES[mode]


def compute(model: torch.nn.Module, mode: str | None):
    """A context in which ``model``'s forward computes in the mixed-precision dtype (autocast on its device), or
    a no-op context for ``none``."""
    dtype = compute_dtype(mode)
    if dtype is None:
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=dtype)


def full_precision(*tensors: torch.Tensor | None):
    """The tensors, bf16 / fp16 ones cast to float32 (float32 / float64 and None as they are), for a region run with
    autocast disabled (:func:`no_autocast`): the output head's log-probs and entropies."""
    return tuple(t.float() if t is not None and t.dtype in (torch.bfloat16, torch.float16) else t for t in tensors)


def no_autocast(like: torch.Tensor):
    """A context with autocast off on ``like``'s device (a no-op outside autocast)."""
    return torch.autocast(device_type=like.device.type, enabled=False)


def fsdp_policy(mode: str | None):
    """FSDP2's ``MixedPrecisionPolicy`` for ``train.mixed_precision`` (parameters cast to the compute dtype for
    the forward and backward, gradients reduced in float32), or None for ``none``."""
    dtype = compute_dtype(mode)
    if dtype is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


_SCALERS: "weakref.WeakKeyDictionary[torch.optim.Optimizer, torch.amp.GradScaler]" = weakref.WeakKeyDictionary()


def loss_scaler(optimizer: torch.optim.Optimizer, mode: str | None,
                device: str = "cpu") -> "torch.amp.GradScaler | None":
    """The GradScaler of ``optimizer``'s updates under fp16 (made on first use, kept across steps), else None."""
    if mode != "fp16":
        return None
    if optimizer not in _SCALERS:
        scaler = torch.amp.GradScaler(device)
        # materialise its scale now: GradScaler makes it lazily in the first scale(), and an update whose rows were
        # all skipped (tied groups) runs no backward, so unscale_ would fail on an unset scale (a crash of fp16 runs
        # whose first step trained nothing)
        scaler.scale(torch.zeros((), device=device))
        _SCALERS[optimizer] = scaler
    return _SCALERS[optimizer]


def scaler_state(optimizer: torch.optim.Optimizer) -> "dict | None":
    """The state of ``optimizer``'s fp16 GradScaler (scale, growth tracker, factors) for a checkpoint, or None when it
    has none (bf16 / none, or fp16 before its first update). Plain numbers: JSON in ``trainer_state.json``."""
    scaler = _SCALERS.get(optimizer)
    if scaler is None:
        return None
    return {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in scaler.state_dict().items()}


def load_scaler_state(optimizer: torch.optim.Optimizer, state: dict, device: str = "cpu") -> None:
    """Give ``optimizer`` the fp16 GradScaler a checkpoint recorded (:func:`scaler_state`), so a resumed fp16 run
    goes on at the scale and growth count the uninterrupted run had instead of starting again at 2^16."""
    loss_scaler(optimizer, "fp16", device).load_state_dict(dict(state))
