"""The ``weight_sync`` guard: after every sync the rollout engine serves the weights the trainer trained.

A fingerprint is a displacement check, per tensor of the state dict (LoRA adapter tensors included, they are
tensors of the policy's state dict): with x the tensor flattened (for more than :data:`SAMPLE` elements, every
s-th element from a fixed offset, s = ceil(numel / SAMPLE), so the cost is bounded per tensor) and r a fixed
standard-normal vector seeded by the tensor's name (crc32),

    p = sum_i r_i x_i        s = sum_i |r_i| |x_i|        (float64)

Two fingerprints agree when every tensor's |p_a - p_b| <= tol * max(s_a, s_b) (``guards.weight_tol``; the
relative size of a random projection's change, so an engine holding the weights in another dtype passes while a
tensor left stale — an adapter that never reached the engine — fails: its p moves by ~||dx|| while tol * s stays
~1e-5 ||x|| sqrt(n)). An engine without a ``weights_fingerprint()`` (the Ray pool, vLLM: their weights live in
other processes under other names) is skipped; an engine that samples from the trainer's own module passes by
construction (the same tensors) and is counted as checked without computing anything.
"""
from __future__ import annotations

import math
import zlib
from typing import Any

import torch

SAMPLE = 1 << 16  # elements per tensor that enter its fingerprint
Fingerprint = dict[str, tuple[float, float]]  # name -> (projection p, scale s)


@torch.no_grad()
def weights_fingerprint(weights: torch.nn.Module | dict[str, torch.Tensor]) -> Fingerprint:
    """name -> (p, s) of every floating-point tensor of ``weights`` (a module's state dict, or a state dict)."""
    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
    out: Fingerprint = {}
    for name in sorted(state):
        t = state[name]
        if not torch.is_tensor(t) or not t.is_floating_point():
            continue
        seed = zlib.crc32(name.encode())
        flat = t.detach().reshape(-1)
        if flat.numel() > SAMPLE:
            stride = math.ceil(flat.numel() / SAMPLE)
            flat = flat[seed % stride :: stride]
        x = flat.to("cpu", torch.float64)  # (n,)
        r = torch.randn(x.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)  # (n,)
        out[name] = (float((r * x).sum()), float((r.abs() * x.abs()).sum()))
    return out


def fingerprint_mismatch(trained: Fingerprint, served: Fingerprint, tol: float) -> str | None:
    """The first disagreement of two fingerprints (a sentence), or None when they agree."""
    missing = sorted(trained.keys() - served.keys())
    if missing:
        return f"the engine has no tensor {missing[0]} ({len(missing)} missing)"
    for name, (p, s) in trained.items():
        q, u = served[name]
        if abs(p - q) > tol * max(s, u):
            return f"{name} differs (projection {p:.6g} trained vs {q:.6g} served)"
    return None


def check_weight_sync(guards: Any, trained: torch.nn.Module | dict[str, torch.Tensor], engine: Any,
                      version: int) -> None:
    """Run the ``weight_sync`` guard after ``engine`` was given ``trained`` as policy ``version``."""
    if guards is None or engine is None or not guards.enabled("weight_sync"):
        return
    fingerprint = getattr(engine, "weights_fingerprint", None)
    if fingerprint is None:  # no cheap fingerprint of this engine's weights: skipped (docs/lora.md)
        return
    if getattr(engine, "model", None) is trained:  # sampling from the trainer's own module: the same tensors
        guards.check("weight_sync", True, "")
        return
    problem = fingerprint_mismatch(weights_fingerprint(trained), fingerprint(), guards.cfg.weight_tol)
    guards.check("weight_sync", problem is None,
                 f"after the sync to policy {version} the rollout engine does not serve the trained weights: "
                 f"{problem}")
