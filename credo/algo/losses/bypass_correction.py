"""verl's rollout-correction pieces for ``bypass_mode``: IS weights, rejection masks, ``rollout_corr/*`` metrics.

In bypass mode the anchor is the sampler itself, so the log-ratio is ``lr = logprobs - rollout_logprobs``
(current policy over sampler, detached). Follows verl 0.9.1 ``rollout_corr_helper``:

- IS weights (``compute_rollout_correction_weights``): token ``exp(clamp(lr, +-20))``; sequence
  ``exp(clamp(sum_t m lr, +-20))`` on every token of the row; times the mask; then TIS ``min(w, upper)`` or, with a
  lower bound, IcePop ``w 1[lower <= w <= upper]``; optional normalisation to mean 1 (token: over tokens; sequence:
  over the rows' per-row means).
- rejection (``compute_rollout_rejection_mask``): per-token divergences of ``lr_s = clamp(lr, +-20)``:
  k1 = -lr_s, k2 = lr_s^2 / 2, k3 = exp(lr_s) - 1 - lr_s, tested per token (``token_k*``) or as the row's masked sum,
  mean or max (``seq_sum_*``, ``seq_mean_*``, ``seq_max_*``). k1 keeps ``log(lower) <= k1 <= log(upper)`` (note the
  sign: a ratio ``lower_upper`` bound on ``-lr``, as verl); k2 / k3 keep ``stat <= upper``. Every option must pass.

Means use verl's ``masked_mean`` (``sum / (count + 1e-8)``) so the values equal verl's to the last digits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SAFETY_BOUND = 20.0  # verl's clamp on log-ratios before exp
MEAN_EPS = 1e-8  # verl_F.masked_mean's denominator epsilon
IS_LEVELS = ("token", "sequence", "none")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


@dataclass(frozen=True)
class RsOption:
    """One rejection criterion (``name`` in RS_OPTIONS): k1 bounds are ratios (lower, upper), k2 / k3 an upper."""

    name: str
    upper: float
    lower: float | None = None


def vmean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """verl's masked_mean: sum(x m) / (sum(m) + 1e-8), over everything or along ``dim``."""
    if dim is None:
        return (x * mask).sum() / (mask.sum() + MEAN_EPS)
    return (x * mask).sum(dim) / (mask.sum(dim) + MEAN_EPS)


def check_is_threshold(upper: float, lower: float | None) -> None:
    """verl's ``_parse_rollout_is_threshold`` checks: upper > 0; lower (IcePop) > 0 and <= upper."""
    if isinstance(upper, bool) or not isinstance(upper, (int, float)) or upper <= 0:
        raise ValueError(f"rollout_is_threshold must be a positive number, got {upper!r}")
    if lower is not None:
        if isinstance(lower, bool) or not isinstance(lower, (int, float)) or lower <= 0:
            raise ValueError(f"rollout_is_low must be None or a positive number, got {lower!r}")
        if lower > upper:
            raise ValueError(f"rollout_is_low ({lower}) must be <= rollout_is_threshold ({upper})")


def parse_rs(options: str, threshold: str | float | None) -> list[RsOption]:
    """``rollout_rs`` ("token_k1,seq_max_k2"; "" = off) and ``rollout_rs_threshold`` as verl parses them: one threshold
    per option or one shared; a k1 threshold is "lower_upper" or a float upper with lower = 1 / upper."""
    names = list(dict.fromkeys(o.strip() for o in options.split(",") if o.strip()))  # deduplicated, in order
    for n in names:
        if n not in RS_OPTIONS:
            raise ValueError(f"unknown rollout_rs option {n!r}; one of {', '.join(RS_OPTIONS)}")
    if not names:
        return []
    if threshold is None:
        raise ValueError("rollout_rs_threshold must be set when rollout_rs is on")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, str)):
        raise ValueError(f"rollout_rs_threshold must be a number or a string, got {threshold!r}")
    raw = threshold.split(",") if isinstance(threshold, str) else [str(threshold)]
    specs = [s.strip() for s in raw if s.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"rollout_rs_threshold has {len(specs)} entries; give 1 or {len(names)} (one per option)")
    specs = specs * len(names) if len(specs) == 1 else specs
    return [_rs_option(n, s) for n, s in zip(names, specs)]


def _rs_option(name: str, spec: str) -> RsOption:
    if not name.endswith("k1") and "_" in spec:
        raise ValueError(f"rollout_rs_threshold for {name} takes one upper bound, got {spec!r}")
    low_s, up_s = spec.split("_", 1) if "_" in spec else (None, spec)
    try:
        upper = float(up_s)
        lower = None if not name.endswith("k1") else float(low_s) if low_s is not None else 1.0 / upper
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"invalid rollout_rs_threshold {spec!r} for {name}") from None
    if upper <= 0 or (lower is not None and lower <= 0):
        raise ValueError(f"rollout_rs_threshold for {name} must be positive, got {spec!r}")
    if lower is not None and lower > upper:
        raise ValueError(f"rollout_rs_threshold for {name} needs lower <= upper, got {spec!r}")
    return RsOption(name, upper, lower)


def is_weights(lr: torch.Tensor, mask: torch.Tensor, *, level: str, upper: float, lower: float | None,
               batch_normalize: bool) -> tuple[torch.Tensor, dict[str, float]]:
    """Detached IS weights (B, T), 0 off the mask, and verl's ``rollout_is_*`` metrics (before normalisation; none
    when the mask has no token: there is nothing to summarise, and a max over no token would raise)."""
    lr = lr.detach()  # (B, T)
    if level == "token":
        raw = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() * mask  # (B, T)
    else:
        seq = (lr * mask).sum(-1, keepdim=True)  # (B, 1) summed, then clamped before exp, as verl
        raw = seq.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().expand_as(lr) * mask  # (B, T)
    if lower is None:
        w = raw.clamp(max=upper)
    else:
        w = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    has_tokens = bool(mask.sum() > 0)
    metrics = _is_metrics(w, raw, lr, mask, level, upper, lower) if has_tokens else {}
    if batch_normalize:
        if level == "token":
            mean = vmean(w, mask)
        else:
            row = (mask.sum(-1) > 0).to(w.dtype)  # (B,)
            mean = (vmean(w, mask, -1) * row).sum() / row.sum().clamp(min=1e-8)
        if has_tokens:
            metrics["rollout_is_batch_norm_factor"] = float(mean) if mean > 1e-8 else 1.0
        w = w / mean if mean > 1e-8 else w
    return w, metrics


def _is_metrics(w: torch.Tensor, raw: torch.Tensor, lr: torch.Tensor, mask: torch.Tensor, level: str,
                upper: float, lower: float | None) -> dict[str, float]:
    valid = mask.bool()
    low = lower if lower is not None else 1.0 / upper
    out = {"rollout_is_mean": float(vmean(w, mask))}
    if level == "sequence":
        seq = (lr * mask).sum(-1)  # (B,) every row, as verl (rows without tokens count as log-ratio 0)
        out["rollout_is_max"] = math.exp(min(float(seq.max()), SAFETY_BOUND))
        out["rollout_is_min"] = math.exp(float(seq.min()))
        out["rollout_is_ratio_fraction_high"] = float((seq > math.log(upper)).to(w.dtype).mean())
        out["rollout_is_ratio_fraction_low"] = float((seq < math.log(low)).to(w.dtype).mean())
    else:
        out["rollout_is_max"] = float(w[valid].max())
        out["rollout_is_min"] = float(w[valid].min())
        out["rollout_is_ratio_fraction_high"] = float(vmean((raw > upper).to(w.dtype), mask))
        out["rollout_is_ratio_fraction_low"] = float(vmean((raw < low).to(w.dtype), mask))
    wc = w.clamp(0.0, upper)
    out["rollout_is_eff_sample_size"] = float(1.0 / vmean((wc / (vmean(wc, mask) + MEAN_EPS)) ** 2, mask))
    if lower is not None:
        out["rollout_is_oob_ratio"] = float(vmean(((raw < lower) | (raw > upper)).to(w.dtype), mask))
    return out


def _row_stat(x: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """(B,) masked sum, verl mean or max (0 for a row without tokens) of the per-token statistic x (B, T)."""
    if how == "sum":
        return (x * mask).sum(-1)
    if how == "mean":
        return vmean(x, mask, -1)
    top = x.masked_fill(~mask.bool(), float("-inf")).max(-1).values
    return torch.where(torch.isinf(top), torch.zeros_like(top), top)


def rejection_mask(lr: torch.Tensor, mask: torch.Tensor,
                   options: list[RsOption]) -> tuple[torch.Tensor, dict[str, float]]:
    """(B, T) keep mask (1 kept, 0 rejected; detached) where every option passes, and ``rollout_rs_*`` metrics
    (none when the mask has no token: nothing to summarise, and a max over no token would raise)."""
    lr_s = lr.detach().clamp(-SAFETY_BOUND, SAFETY_BOUND)  # (B, T)
    stats = {"k1": -lr_s, "k2": 0.5 * lr_s**2, "k3": lr_s.exp() - 1.0 - lr_s}
    keep_all = torch.ones_like(lr_s)
    has_tokens = bool(mask.sum() > 0)
    metrics: dict[str, float] = {}
    for opt in options:
        level, kind = opt.name.rsplit("_", 1)  # "token" | "seq_sum" | "seq_mean" | "seq_max", "k1" | "k2" | "k3"
        tok = stats[kind]  # (B, T)
        stat = tok if level == "token" else _row_stat(tok, mask, level[4:]).unsqueeze(-1).expand_as(tok)  # (B, T)
        if kind == "k1":
            keep = (stat >= math.log(opt.lower)) & (stat <= math.log(opt.upper))
        else:
            keep = stat <= opt.upper
        keep_all = keep_all * keep.to(lr_s.dtype)
        if has_tokens:
            metrics.update(_rs_option_metrics(f"rollout_rs_{opt.name}", stat, keep, mask, level == "token"))
    if has_tokens:
        metrics["rollout_rs_masked_fraction"] = float(vmean(1.0 - keep_all, mask))
        hit = ((keep_all <= 0.5) & mask.bool()).any(-1)  # (B,) rows with a rejected token
        metrics["rollout_rs_seq_masked_fraction"] = float(hit.to(lr_s.dtype).mean())  # over every row, as verl
    return keep_all, metrics


def _rs_option_metrics(p: str, stat: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor,
                       per_token: bool) -> dict[str, float]:
    """One option's ``{p}_mean / _max / _min / _masked_fraction / _seq_masked_fraction`` over a mask with at least
    one token: the statistic (B, T) over the tokens (``per_token``) or over the rows with tokens (its column 0)."""
    rows = mask.sum(-1) > 0  # (B,)
    keep_f = keep.to(stat.dtype)
    seq_kept = (keep | ~mask.bool()).all(-1)  # (B,)
    vals = stat[mask.bool()] if per_token else stat[:, 0][rows]
    return {f"{p}_mean": float(vmean(stat, mask)), f"{p}_max": float(vals.max()), f"{p}_min": float(vals.min()),
            f"{p}_masked_fraction": float(vmean(1.0 - keep_f, mask)),
            f"{p}_seq_masked_fraction": float((~seq_kept[rows]).to(stat.dtype).mean())}


def offpolicy_metrics(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """verl's ``compute_offpolicy_metrics`` with the current policy as the "training" policy (bypass mode)."""
    lp, ro = logprobs.detach(), rollout_logprobs.detach()
    lr = lp - ro  # (B, T)
    lp_row, ro_row = vmean(lp, mask, -1), vmean(ro, mask, -1)  # (B,)
    seq = (lr * mask).sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # (B,)
    return {
        "kl": float(vmean(ro - lp, mask)),
        "k3_kl": float(vmean(lr.exp() - lr - 1.0, mask)),
        "training_ppl": float((-lp_row).exp().mean()),
        "rollout_ppl": float((-ro_row).exp().mean()),
        "log_ppl_diff": float((ro_row - lp_row).mean()),
        "chi2_token": float(vmean(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() ** 2, mask) - 1.0),
        "chi2_seq": float((2.0 * seq).exp().mean() - 1.0),
    }
