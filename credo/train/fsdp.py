"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the policy: ``distributed.strategy=fsdp2``.

Parameters, gradients and optimizer state are sharded over the ranks (each decoder layer one FSDP unit, the
embeddings / final norm / output head the root unit); a unit's full parameters exist only while it runs.
Two things differ from wrapping the Hugging Face module as the root:

- credo's forward calls the backbone and then the output head's weight (chunked log-probs), not the model's own
  ``forward``, so the root is :class:`ShardedPolicy`, whose ``forward(fn, ...)`` runs ``fn(policy, ...)``: the root's
  parameters are gathered around whatever credo computes (``credo.train.forward`` routes through it);
- FSDP2 averages the gradients over the ranks, while each rank's loss is its share of the global loss (whose sum
  is the gradient wanted), so the backward is scaled by ``world_size`` (:meth:`DataParallel.backward_factor`).

Every backward is a collective (reduce-scatter), so the update loop runs the same number of micro-batch
backwards on every rank (zero-weighted ones where a rank has fewer rows). Whole weights for the rollout engine and
for checkpoints are gathered by :func:`full_state_dict`, a collective every rank calls.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

_ROOTS: "weakref.WeakKeyDictionary[torch.nn.Module, ShardedPolicy]" = weakref.WeakKeyDictionary()


class ShardedPolicy(torch.nn.Module):
    """The FSDP2 root around a policy: ``root(fn, *args)`` returns ``fn(policy, *args)`` with the root's
    parameters gathered (and their gradients reduce-scattered in the backward)."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.policy, *args, **kwargs)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers FSDP2 shards one unit each. A LoRA'd policy (credo.models.lora injects PEFT's layers in
    place) has them where the plain model has; a ``peft.PeftModel`` wrapper is looked through."""
    if callable(getattr(model, "get_base_model", None)):  # a PeftModel: base_model is PEFT's LoraModel
        model = model.get_base_model()
    layers = getattr(getattr(model, "base_model", None), "layers", None)
    if layers is None:
        raise ValueError(f"distributed.strategy=fsdp2: {type(model).__name__} has no base_model.layers to shard")
    return list(layers)


def shard_policy(model: torch.nn.Module, world_size: int, mixed_precision: str = "none",
                 offload: bool = False) -> ShardedPolicy:
    """Shard ``model`` in place over the default process group (its parameters become DTensors).
    ``mixed_precision`` (``train.mixed_precision``): bf16 compute on the gathered parameters, float32 shards and
    float32 gradient reduction (credo.train.mixed_precision.fsdp_policy). ``offload``
    (``train.optimizer_offload``): FSDP2's ``CPUOffloadPolicy``, the sharded parameters, their gradients and so the
    optimizer state and its step on the host (a no-op placement on a CPU model; never run on a GPU)."""
    from credo.train.mixed_precision import fsdp_policy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (world_size,))
    policy = fsdp_policy(mixed_precision)
    mp = {} if policy is None else {"mp_policy": policy}
    if offload:  # pinned host memory for the copies only where there is a GPU to copy to
        mp["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, **mp)
    root = ShardedPolicy(model)
    # the root too gives its parameters back after the forward: a no-grad pass (old log-probs) has no backward
    # that would reshard them, and the next step's clip / optimizer must see shards only
    fully_shard(root, mesh=mesh, reshard_after_forward=True, **mp)
    _ROOTS[model] = root
    return root


def sharded_root(model: torch.nn.Module) -> ShardedPolicy | None:
    """The FSDP2 root of a policy sharded by :func:`shard_policy`, else None."""
    return _ROOTS.get(model)


def is_sharded(model: torch.nn.Module) -> bool:
    return model in _ROOTS


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a (possibly sharded) module, on every rank. A collective when sharded: every rank
    calls it at the same point."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach()
            for k, v in model.state_dict().items()}


def full_adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole LoRA adapter tensors of a (possibly sharded) LoRA'd policy (credo.models.lora.adapter_state's
    names), gathered alone: the frozen base is never sent again. A collective when sharded (every rank gathers
    the same keys in the same order)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach()
            for k, v in model.state_dict().items() if "lora_" in k}


def plain_norm(norm: torch.Tensor) -> float:
    """A gradient norm as a float (``clip_grad_norm_`` returns a replicated DTensor for sharded gradients)."""
    from torch.distributed.tensor import DTensor

    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
