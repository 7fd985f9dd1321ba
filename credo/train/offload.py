"""Optimizer-state CPU offload without FSDP2 (``train.optimizer_offload``; docs/performance.md, "Optimizer
offload").

ZeRO-Offload's split (Ren et al. 2021), for one process or DDP: the model's parameters and gradients stay on its
device; a master copy of every trainable parameter and AdamW's two moments live in host memory. Each step copies
the gradients to the host, runs AdamW there (torch's fused CPU kernel) and copies the updated masters back into
the device parameters. The device then holds no optimizer state (8 bytes per float32 parameter less).

- The master copy has the parameter's dtype: with ``train.mixed_precision`` the parameters are float32
  (credo.config.validate refuses other weights), so the host holds float32 masters and float32 moments, and the
  device's float32 parameters are what bf16 autocast computes from. Updates therefore equal the non-offloaded
  AdamW's bit for bit (the same fused kernel on the same values; tests/train/test_offload.py).
- The wrapper is a ``torch.optim.Optimizer`` over the device parameters: clipping, ``zero_grad``, the lr schedule
  and fp16's GradScaler act on them as on a plain optimizer; ``step`` hands the current hyperparameters to the
  host AdamW. ``state_dict`` is the host AdamW's, in plain AdamW's layout (a checkpoint loads with or without
  offload).
- The parameters may be written by something else before the first step (the SFT warm start trains the policy
  after the run's optimizer is built): the masters are copied from the parameters at the first step, and again
  for a parameter whose version counter (torch's count of in-place writes: ``load_state_dict``, ``copy_``) moved
  since the last step. Another fused optimizer stepping the same parameters between steps is not seen (fused
  kernels do not count their writes); credo's runs have none.
- With ``distributed.strategy=fsdp2`` this class is not used: FSDP2's ``CPUOffloadPolicy`` keeps the sharded
  parameters, gradients and optimizer state on the host (credo.train.fsdp.shard_policy).

On a CPU-only machine the copies move nothing anywhere: the code path runs and its results are checked there; the
CUDA transfers have never run on a GPU.
"""
from __future__ import annotations

from typing import Iterable

import torch


class OffloadedAdamW(torch.optim.Optimizer):
    """AdamW whose state and master weights live on the CPU (module docstring). ``params``: the trainable device
    parameters (one group)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.99)) -> None:
        params = list(params)
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "betas": tuple(betas)})
        # host masters: fresh copies even when the parameter is already on the CPU (the same code path everywhere)
        pin = torch.cuda.is_available() and any(p.device.type == "cuda" for p in params)
        self.masters = [_host_copy(p.detach(), pin) for p in params]
        fused = all(m.is_floating_point() for m in self.masters)
        self.inner = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay, betas=tuple(betas),
                                       **({"fused": True} if fused else {"foreach": False}))
        self._pin = pin
        self._versions = [-1] * len(params)  # the parameters' versions the masters hold (-1: copy at the first step)

    def _sync_groups(self) -> None:
        """The device-side groups' hyperparameters (the lr schedule writes there) into the host AdamW's groups."""
        for group, inner in zip(self.param_groups, self.inner.param_groups):
            inner.update({k: v for k, v in group.items() if k != "params"})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 (torch's signature)
        if closure is not None:
            raise NotImplementedError("OffloadedAdamW.step(closure) is not implemented (credo never passes one)")
        self._sync_groups()
        params = [p for group in self.param_groups for p in group["params"]]
        for i, (p, m) in enumerate(zip(params, self.masters)):
            if p._version != self._versions[i]:  # the first step, or written since the last (a weight load)
                m.copy_(p.detach())
            m.grad = None if p.grad is None else _host_copy(p.grad.detach(), self._pin, dtype=m.dtype)
        self.inner.step()
        for i, (p, m) in enumerate(zip(params, self.masters)):
            if m.grad is not None:
                p.copy_(m, non_blocking=False)
                m.grad = None
            self._versions[i] = p._version

    def state_dict(self) -> dict:
        self._sync_groups()
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict)
        for group, inner in zip(self.param_groups, self.inner.param_groups):
            group.update({k: v for k, v in inner.items() if k in group and k != "params"})

    def state_devices(self) -> set[str]:
        """The device types of every optimizer-state tensor and master (``{"cpu"}`` once a step has run)."""
        tensors = [v for s in self.inner.state.values() for v in s.values() if torch.is_tensor(v)]
        return {t.device.type for t in [*tensors, *self.masters]}


def _host_copy(t: torch.Tensor, pin: bool, dtype: torch.dtype | None = None) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=dtype or t.dtype, device="cpu", pin_memory=pin)
    out.copy_(t)
    return out
