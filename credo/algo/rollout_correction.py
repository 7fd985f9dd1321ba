"""Rollout correction: importance weights for the training-inference mismatch
(docs/algorithms/recipe_pieces.md#rollout-correction).

The rollout engine samples from pi_roll (vLLM's kernels, another precision, an older policy in async modes); the
loss is computed against pi_old. Per token, w = exp(old_logprobs - rollout_logprobs); per sequence,
w_seq = exp(sum_t (old_logprobs - rollout_logprobs)) over the row's loss tokens, broadcast to its tokens.

    token_truncate     w clipped to [low, high]                       (verl rollout_is=token with a float threshold:
                                                                      min(w, high) only; OpenRLHF tis)
    token_mask         w, zeroed outside [low, high]                  (TRL token_mask, OpenRLHF icepop)
    sequence_truncate  w_seq clipped to [low, high]                   (verl rollout_is=sequence, min(w, high))
    sequence_mask      w_seq, zeroed outside [low, high]              (TRL sequence_mask)

``low`` None means no lower bound. The weights are detached and multiply the per-token policy loss before
aggregation. verl's default threshold is 2.0, TRL's C_max 3.0; credo's default high is 2.0.
"""
from __future__ import annotations

import torch

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def rollout_is_weights(
    old_logprobs: torch.Tensor,  # (B, T)
    rollout_logprobs: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    *,
    mode: str = "token_truncate",
    low: float | None = None,
    high: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(weights (B, T), detached, 0 off the mask; metrics: mean / max / min raw weight over loss tokens, effective
    sample size (sum w)^2 / (N sum w^2) of the final weights, fraction of tokens whose weight was clipped or masked)."""
    if mode not in MODES:
        raise ValueError(f"unknown rollout correction mode {mode!r}; one of {', '.join(MODES)}")
    mask = response_mask.to(old_logprobs.dtype)  # (B, T)
    diff = ((old_logprobs - rollout_logprobs).detach() * mask).clamp(-20.0, 20.0)  # (B, T)
    if mode.startswith("sequence"):
        raw = (diff.sum(-1, keepdim=True).clamp(-20.0, 20.0).exp() * torch.ones_like(diff))  # (B, T)
    else:
        raw = diff.exp()  # (B, T)
    lo = low if low is not None else 0.0
    if mode.endswith("truncate"):
        w = raw.clamp(min=lo, max=high)
    else:
        w = torch.where((raw >= lo) & (raw <= high), raw, torch.zeros_like(raw))
    w = w * mask
    valid = mask.bool()
    n = valid.sum().clamp(min=1)
    rw, fw = raw[valid], w[valid]
    metrics = {}
    if rw.numel():
        metrics = {"rollout_corr/is_mean": float(rw.mean()), "rollout_corr/is_max": float(rw.max()),
                   "rollout_corr/is_min": float(rw.min()),
                   "rollout_corr/eff_sample_size": float(fw.sum() ** 2 / (n * (fw**2).sum()).clamp(min=1e-30)),
                   "rollout_corr/adjusted_frac": float((fw != rw).float().mean())}
    return w, metrics
