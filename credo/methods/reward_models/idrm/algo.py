"""Interaction Distillation's attention alignment: pure tensor functions (docs/reward_models.md, [derived]).

Objective (the teacher is frozen, only the student gets gradients; inference is the unchanged student)::

    L = L_BT + lambda_intra * L_intra + lambda_inter * L_inter

Block renormalisation over a set of columns::

    hat A_{i.} = A_{i.} * 1_cols / (sum_j A_{ij} 1_cols(j) + 1e-12)

Intra-sequence alignment, for each response s in {w, l} (the teacher's map gathered onto the student's row layout,
restricted to the causal set j <= i, renormalised; rows with fewer than 2 allowed columns are left out)::

    L_intra = 1/2 sum_s 1/|I_s| sum_{i in I_s} KL(hat A^T_{i, <=i} || A^S_{i, <=i})

Inter-sequence alignment: virtual attention from the student's own projections (VIRT-style), rows the chosen
response's tokens and columns the rejected one's (and the reverse)::

    tilde A^S_{w->l} = softmax(Q_w K_l^T / sqrt(d))        (KV heads repeated for GQA, head-mean)
    L_inter = 1/2 [ mean_rows KL(hat A^T_{y_w -> y_l} || tilde A^S_{w->l}) + mean_rows KL(... l -> w) ]

KL(t || s) = sum_j t_j (log t_j - log max(s_j, 1e-12)), with t log t = 0 where t = 0; ``mse`` is
mean_j (t_j - s_j)^2 over the allowed columns.
"""
from __future__ import annotations

import torch

EPS = 1e-12


def renormalise(maps: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """hat A = A * 1_cols / (sum_j A 1_cols + 1e-12). ``maps`` (..., R, C); ``cols`` bool, broadcastable to it."""
    kept = maps * cols.to(maps.dtype)
    return kept / (kept.sum(-1, keepdim=True) + EPS)


def gather_block(maps: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The block ``maps[b, ..., rows[b, r], cols[b, c]]`` (B, [H,] R, C), 0 where an index is -1.

    ``maps`` (B, [H,] Lt, Lt) teacher attention; ``rows`` (B, R), ``cols`` (B, C) long teacher positions."""
    lead = maps.shape[1:-2]  # () or (H,)
    b, lt = maps.shape[0], maps.shape[-1]
    r_ok, c_ok = rows >= 0, cols >= 0
    r_idx, c_idx = rows.clamp(min=0), cols.clamp(min=0)
    view = (b,) + (1,) * len(lead)
    r_sel = r_idx.view(*view, -1, 1).expand(b, *lead, -1, lt)  # (B, [H,] R, Lt)
    picked = maps.gather(-2, r_sel)  # (B, [H,] R, Lt)
    c_sel = c_idx.view(*view, 1, -1).expand(b, *lead, picked.shape[-2], -1)  # (B, [H,] R, C)
    block = picked.gather(-1, c_sel)
    ok = (r_ok.unsqueeze(-1) & c_ok.unsqueeze(-2)).view(*view, rows.shape[1], cols.shape[1])
    return block * ok.to(block.dtype)


def causal_allowed(valid: torch.Tensor) -> torch.Tensor:
    """(B, L, L) bool: row i and column j both real tokens and j <= i (columns in sequence order). ``valid`` (B, L)."""
    n = valid.shape[-1]
    tri = torch.ones(n, n, dtype=torch.bool, device=valid.device).tril()
    return valid.unsqueeze(-1) & valid.unsqueeze(-2) & tri


def row_divergence(teacher: torch.Tensor, student: torch.Tensor, allowed: torch.Tensor,
                   loss: str = "kl") -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row loss (B, [H,] R), row mask (B, R)): the teacher rows renormalised over ``allowed`` against the
    student's rows; rows with fewer than 2 allowed columns are masked out (a single column is no signal).

    ``teacher``, ``student`` (B, [H,] R, C) probabilities; ``allowed`` (B, R, C) bool."""
    extra = teacher.dim() - allowed.dim()
    cols = allowed.view(allowed.shape[0], *(1,) * extra, *allowed.shape[1:])
    t = renormalise(teacher, cols)
    m = cols.to(t.dtype)
    if loss == "kl":
        log_t = torch.where(t > 0, t, torch.ones_like(t)).log()  # t log t = 0 where t = 0
        per_row = (m * t * (log_t - student.clamp(min=EPS).log())).sum(-1)
    elif loss == "mse":
        per_row = (m * (t - student).square()).sum(-1) / m.sum(-1).clamp(min=1.0)
    else:
        raise ValueError(f"unknown alignment loss {loss!r}; choose kl or mse")
    return per_row, allowed.sum(-1) >= 2


def masked_mean(per_row: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(B,) mean over each item's kept rows (heads averaged first); an item without kept rows gives 0.

    ``per_row`` (B, [H,] R); ``rows`` (B, R) bool."""
    while per_row.dim() > rows.dim():
        per_row = per_row.mean(1)
    w = rows.to(per_row.dtype)
    return (per_row * w).sum(-1) / w.sum(-1).clamp(min=1.0)


def virtual_attention(q: torch.Tensor, k: torch.Tensor, cols: torch.Tensor, *, num_heads: int, num_kv_heads: int,
                      head_dim: int) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) per head over the allowed columns, (B, H, Lq, Lk); rows with no allowed column are 0.

    ``q`` (B, Lq, H * d) and ``k`` (B, Lk, H_kv * d) projections of two different sequences; ``cols`` (B, Lk) bool.
    KV head j serves query heads j * g .. (j + 1) * g - 1, g = H / H_kv (transformers' ``repeat_kv``)."""
    b, lq, lk = q.shape[0], q.shape[1], k.shape[1]
    qh = q.view(b, lq, num_heads, head_dim).transpose(1, 2)  # (B, H, Lq, d)
    kh = k.view(b, lk, num_kv_heads, head_dim).transpose(1, 2)  # (B, H_kv, Lk, d)
    kh = kh.repeat_interleave(num_heads // num_kv_heads, dim=1)  # (B, H, Lk, d)
    logits = qh @ kh.transpose(-1, -2) / head_dim ** 0.5  # (B, H, Lq, Lk)
    mask = cols.view(b, 1, 1, lk)
    logits = logits.float().masked_fill(~mask, torch.finfo(torch.float32).min)  # finite: no NaN in the backward
    return torch.softmax(logits, dim=-1) * mask  # a row with every column masked is 0


def layer_pairs(mode: str, student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """0-based (student layer, teacher layer) pairs: ``last`` = the two last layers (MiniLM); ``uniform`` = student
    layer l (1-based) against teacher layer round(l * L_T / L_S), at least 1."""
    if mode == "last":
        return [(student_layers - 1, teacher_layers - 1)]
    if mode == "uniform":
        return [(l - 1, max(1, round(l * teacher_layers / student_layers)) - 1) for l in range(1, student_layers + 1)]
    raise ValueError(f"unknown layer mapping {mode!r}; choose last or uniform")


def attention_mass_fifths(row: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, 5): a row's attention mass per fifth of its sequence (token k of n real tokens is in fifth floor(5k/n)).

    ``row`` (B, L) attention of one query (e.g. EOS) over the columns; ``valid`` (B, L) bool real tokens."""
    rank = valid.long().cumsum(-1) - 1  # (B, L) index among real tokens
    n = valid.sum(-1, keepdim=True).clamp(min=1)
    fifth = (5 * rank.clamp(min=0)) // n  # (B, L) in 0..4
    out = torch.zeros(row.shape[0], 5, dtype=row.dtype, device=row.device)
    return out.scatter_add(1, fifth, row * valid.to(row.dtype))
