"""The ``weight_sync`` guard: after every sync the rollout engine serves the weights the trainer trained.

A fingerprint is a displacement check, per tensor of the state dict (LoRA adapter tensors included, they are
tensors of the policy's state dict): with x the tensor flattened (for more than :data:`SAMPLE` elements, every
s-th element from a fixed offset, s = ceil(numel / SAMPLE), so the cost is bounded per tensor) and r a fixed
standard-normal vector seeded by the tensor's name (crc32),

    p = sum_i r_i x_i        s = sum_i |r_i| |x_i|        (float64)

Two fingerprints agree when every tensor's |p_a - p_b| <= tol * max(s_a, s_b) (``guards.weight_tol``; the
relative size of a random projection's change, so an engine holding the weights in another dtype passes while a
tensor left stale — an adapter that never reached the engine — fails: its p moves by ~||dx|| while tol * s stays
~1e-5 ||x|| sqrt(n)). An engine that samples from the trainer's own module passes by construction (the same
tensors) and is counted as checked without computing anything.

An engine without a fingerprint but with ``score_ids`` (vLLM: its weights live in other processes under other
names) is checked by a probe instead: a fixed sequence of :data:`PROBE_LEN` token ids (seeded by
:data:`PROBE_SEED`, the same every sync and run) is scored by the engine and by a no-grad forward of the trained
module, both raw log-softmax (temperature 1), and

    d = mean_j |log p_engine(x_j | x_<j) - log p_trainer(x_j | x_<j)|,   j = 1 .. PROBE_LEN - 1

must be <= ``guards.probe_tol`` (null: by the engine's dtype, :func:`probe_tolerance`; a NaN from the engine
fails). The probe needs the trained weights as a module: a state dict (an FSDP2 policy's gathered weights, the
async pipeline's snapshots) is not probed. A pool of Ray rollout workers (``weight_sync_views()``) is checked worker
by worker: an HF worker sends its fingerprint, a vLLM worker scores the probe.
"""
from __future__ import annotations

import math
import zlib
from typing import Any

import torch

SAMPLE = 1 << 16  # elements per tensor that enter its fingerprint
PROBE_LEN = 32  # tokens of the weight_sync probe (engines without a fingerprint)
PROBE_SEED = 23  # its token ids' seed
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


def weights_digest(weights: torch.nn.Module | dict[str, torch.Tensor]) -> str:
    """A short hex digest of :func:`weights_fingerprint` (names and values to 12 significant digits): equal
    weights give equal digests; used to show that runs start from the same weights."""
    fp = weights_fingerprint(weights)
    text = ";".join(f"{k}:{p:.12g}:{s:.12g}" for k, (p, s) in fp.items())
    return f"{zlib.crc32(text.encode()):08x}{zlib.adler32(text.encode()):08x}"


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


def probe_ids(vocab: int, length: int = PROBE_LEN, seed: int = PROBE_SEED) -> list[int]:
    """The probe: ``length`` token ids drawn uniformly from ``range(vocab)`` with a fixed seed."""
    return torch.randint(vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def model_token_logprobs(model: torch.nn.Module, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
    """``score_ids`` for a module: row i's log_softmax(logits)[j - 1, ids[j]] for j >= starts[i] (temperature 1,
    float32, one unpadded forward per row, eval mode); NaN at j = 0 (no context)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        out = []
        for ids, start in zip(sequences, starts):
            if not ids:
                out.append([])
                continue
            x = torch.tensor([list(ids)], device=device)  # (1, L)
            lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), dim=-1)  # (L - 1, V)
            picked = lp.gather(-1, x[0, 1:, None])[:, 0].cpu().tolist()  # (L - 1,): token j given ids[:j]
            out.append(([float("nan")] + picked)[start:])
    finally:
        model.train(was_training)
    return out


PROBE_TOL_FP32, PROBE_TOL_16BIT = 1e-3, 1e-2  # guards.probe_tol=null (docs/guards.md: the measured d)


def probe_tolerance(engine: Any, configured: float | None) -> float:
    """``guards.probe_tol``, or when null: :data:`PROBE_TOL_FP32` for an engine whose ``options.dtype`` is float32,
    else :data:`PROBE_TOL_16BIT` (bfloat16 / float16, and ``auto``, which vLLM may run in bfloat16)."""
    if configured is not None:
        return configured
    dtype = str(getattr(getattr(engine, "options", None), "dtype", "auto"))
    return PROBE_TOL_FP32 if dtype in ("float32", "float", "fp32") else PROBE_TOL_16BIT


def probe_mismatch(trained: torch.nn.Module, engine: Any, tol: float) -> str | None:
    """The probe's disagreement of ``engine.score_ids`` and ``trained`` (a sentence), or None (module
    docstring)."""
    tokenizer = getattr(engine, "tokenizer", None)  # ids past the tokenizer's are refused by vLLM
    sizes = [n for n in (getattr(getattr(trained, "config", None), "vocab_size", None),
                         len(tokenizer) if tokenizer is not None else None) if n]
    if not sizes:
        raise ValueError("weight_sync probe: neither the trained model's config nor the engine's tokenizer gives a "
                         "vocabulary size")
    ids = probe_ids(min(sizes))
    served = torch.tensor(engine.score_ids([ids], [1])[0], dtype=torch.float64)  # (PROBE_LEN - 1,)
    local = torch.tensor(model_token_logprobs(trained, [ids], [1])[0], dtype=torch.float64)  # (PROBE_LEN - 1,)
    if served.shape != local.shape or not torch.isfinite(served).all():
        return f"the engine scored the {len(ids)}-token probe with missing or non-finite log-probs"
    diff = float((served - local).abs().mean())
    if diff > tol:
        return f"the probe's log-probs differ by {diff:.3g} on average (tolerance guards.probe_tol={tol:g})"
    return None


SKIPPED = "skipped"  # served_problem: no check applies


def served_problem(guards: Any, trained: torch.nn.Module | dict[str, torch.Tensor], engine: Any) -> str | None:
    """Why ``engine`` does not serve ``trained`` (a sentence), None when it does, :data:`SKIPPED` when neither the
    fingerprint nor the probe applies (module docstring)."""
    fingerprint = getattr(engine, "weights_fingerprint", None)
    probe = fingerprint is None and getattr(engine, "score_ids", None) is not None
    if fingerprint is None and not (probe and isinstance(trained, torch.nn.Module)):
        return SKIPPED
    if getattr(engine, "model", None) is trained:  # sampling from the trainer's own module: the same tensors
        return None
    if probe:
        return probe_mismatch(trained, engine, probe_tolerance(engine, guards.cfg.probe_tol))
    return fingerprint_mismatch(weights_fingerprint(trained), fingerprint(), guards.cfg.weight_tol)


def check_weight_sync(guards: Any, trained: torch.nn.Module | dict[str, torch.Tensor], engine: Any,
                      version: int) -> None:
    """Run the ``weight_sync`` guard after ``engine`` was given ``trained`` as policy ``version``."""
    if guards is None or engine is None or not guards.enabled("weight_sync"):
        return
    # a pool of Ray rollout workers: every worker is checked
    views = engine.weight_sync_views() if hasattr(engine, "weight_sync_views") else [engine]
    problem, checked = None, False
    for i, view in enumerate(views):
        found = served_problem(guards, trained, view)
        checked = checked or found is not SKIPPED
        if found not in (None, SKIPPED):
            problem = found if len(views) == 1 else f"rollout worker {i}: {found}"
            break
    if not checked:
        return  # no check applies (a state dict for a probed engine): skipped (docs/guards.md)
    guards.check("weight_sync", problem is None,
                 f"after the sync to policy {version} the rollout engine does not serve the trained weights: "
                 f"{problem}")
