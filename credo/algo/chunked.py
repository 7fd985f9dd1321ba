"""Log-probs and entropy from hidden states without materialising (N, V) logits.

With hidden states h_n (N, H), the output projection W (V, H) (bias b, optional) and temperature tau:

    z_n        = (W h_n + b) / tau                              # (V,) logits of position n
    logprob_n  = z_n[y_n] - logsumexp(z_n)
    entropy_n  = logsumexp(z_n) - sum_v p_nv z_nv,  p_n = softmax(z_n)

A naive computation holds the (N, V) logits, their log-softmax and, under autograd, the saved softmax: at
V = 151,936 and N = 8,192 that is 5 GB per float32 copy. Here rows are processed in chunks of ``chunk_size``:
the forward keeps only (N,) results plus logsumexp, and the backward recomputes each chunk's logits and uses

    d logprob_n / d z_n = onehot(y_n) - p_n
    d entropy_n / d z_n = -p_n * (log p_n + entropy_n)

so peak memory is O(chunk_size * V) whatever N is. Logits are computed in float32 (float64 inputs stay float64).
Gradients reach ``hidden``, ``weight`` and ``bias``; a weight tied to the input embedding accumulates both.
"""
from __future__ import annotations

import torch

from credo.algo.logprobs import check_token_stats, logprobs_from_logits, token_stats_from_logits

CHUNK_ELEMENTS = 2**26  # default chunk: this many logits (256 MB in float32), i.e. 441 rows at V = 151,936


def auto_chunk_size(vocab_size: int) -> int:
    """Rows per chunk so that one (rows, V) float32 block holds ``CHUNK_ELEMENTS`` logits."""
    return max(1, CHUNK_ELEMENTS // max(vocab_size, 1))


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float):
    dtype = torch.float64 if h.dtype == torch.float64 else torch.float32
    z = h.to(dtype) @ weight.to(dtype).T  # (n, V)
    if bias is not None:
        z = z + bias.to(dtype)
    return z / temperature if temperature != 1.0 else z


class _ChunkedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_size, with_entropy):
        n = hidden.shape[0]
        dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        logprobs = torch.empty(n, dtype=dtype, device=hidden.device)
        entropy = torch.zeros(n, dtype=dtype, device=hidden.device)
        lse = torch.empty(n, dtype=dtype, device=hidden.device)
        for s in range(0, n, chunk_size):
            z = _chunk_logits(hidden[s : s + chunk_size], weight, bias, temperature)  # (n_c, V)
            lse_c = torch.logsumexp(z, -1)  # (n_c,)
            lse[s : s + chunk_size] = lse_c
            logprobs[s : s + chunk_size] = z.gather(-1, labels[s : s + chunk_size, None]).squeeze(-1) - lse_c
            if with_entropy:
                entropy[s : s + chunk_size] = lse_c - (z.softmax(-1) * z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        tau, size = ctx.temperature, ctx.chunk_size
        dtype = lse.dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_w else None
        grad_b = (torch.zeros(weight.shape[0], dtype=dtype, device=weight.device)
                  if need_b and bias is not None else None)
        for s in range(0, hidden.shape[0], size):
            h = hidden[s : s + size]
            logp = _chunk_logits(h, weight, bias, tau) - lse[s : s + size, None]  # (n_c, V)
            p = logp.exp()
            # d logprob / dz = onehot - p ; d entropy / dz = -p (log p + H)
            g_z = -p * grad_logprobs[s : s + size, None].to(dtype)
            g_z.scatter_add_(-1, labels[s : s + size, None], grad_logprobs[s : s + size, None].to(dtype))
            if ctx.with_entropy and grad_entropy is not None:
                g_z -= p * (logp + entropy[s : s + size, None]) * grad_entropy[s : s + size, None].to(dtype)
            g_z /= tau  # (n_c, V): gradient w.r.t. the untempered projection W h + b
            if grad_h is not None:
                grad_h[s : s + size] = (g_z @ weight.to(dtype)).to(hidden.dtype)
            if grad_w is not None:
                grad_w += g_z.T @ h.to(dtype)
            if grad_b is not None:
                grad_b += g_z.sum(0)
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_logprobs_entropy(
    hidden: torch.Tensor,  # (N, H)
    weight: torch.Tensor,  # (V, H)
    labels: torch.Tensor,  # (N,) int64
    *,
    bias: torch.Tensor | None = None,  # (V,)
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs (N,), entropy (N,) or None) of ``labels`` under softmax((hidden @ weight.T + bias) / temperature),
    differentiable, with peak memory O(chunk_size * V); ``chunk_size`` None = :func:`auto_chunk_size`."""
    chunk_size = auto_chunk_size(weight.shape[0]) if chunk_size is None else chunk_size
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.dim() != 2 or labels.shape != hidden.shape[:1]:
        raise ValueError(f"expected hidden (N, H) and labels (N,), got {tuple(hidden.shape)} and {tuple(labels.shape)}")
    logprobs, entropy = _ChunkedLogprobEntropy.apply(hidden, weight, bias, labels.long(), float(temperature),
                                                     int(chunk_size), bool(with_entropy))
    return logprobs, (entropy if with_entropy else None)


@torch.no_grad()
def chunked_token_stats(
    hidden: torch.Tensor,  # (N, H)
    weight: torch.Tensor,  # (V, H)
    labels: torch.Tensor,  # (N,)
    stats: tuple[str, ...],
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """No-grad log-probs plus per-position statistics of the full distribution, chunk by chunk:
    ``entropy``, ``entropy_direction`` (PAPO's S_k - C, see :func:`entropy_direction_from_logits`) and
    ``sum_pi_squared`` (the Optimal Token Baseline's sum_v pi^2)."""
    chunk_size = auto_chunk_size(weight.shape[0]) if chunk_size is None else chunk_size
    check_token_stats(stats)
    lps, out = [], {name: [] for name in stats}
    for s in range(0, hidden.shape[0], chunk_size):
        z = _chunk_logits(hidden[s : s + chunk_size], weight, bias, temperature)  # (n_c, V)
        y = labels[s : s + chunk_size]
        lps.append(logprobs_from_logits(z, y))
        for name, value in token_stats_from_logits(z, y, stats).items():
            out[name].append(value)
    empty = hidden.new_zeros(0, dtype=torch.float64 if hidden.dtype == torch.float64 else torch.float32)
    return (torch.cat(lps) if lps else empty), {k: (torch.cat(v) if v else empty) for k, v in out.items()}
