"""KV sessions: an agent episode's keys and values kept across turns, so a turn prefills only its new tokens.

Without them, every turn of the multi-turn loop (:mod:`credo.rollout.agent_loop`) hands the engine the episode's
whole history (prompt, earlier turns, observations) and the engine prefills all of it again. With a
:class:`KVSession` per episode, :meth:`HFRolloutEngine.continue_ids` (``sessions=``) keeps, when a row leaves the
decode batch, the keys and values of every token it fed (prefix + generated tokens but the last, which was
sampled and never fed); the next call with a prefix that extends those tokens feeds only the rest (the last
sampled token, the template's closing tokens, the observation, the assistant prefix) on top of the cached ones.

Batch layout of a session prefill (row i holds c_i cached tokens and n_i new ones; Wc = max c_i, N = max n_i)::

    cache block (Wc columns)         new block (N columns, fed to the model)
    [0 .. 0][K/V of c_i tokens]      [pad .. pad][n_i new tokens]       attention mask 1 on the real columns
                                                                        positions c_i .. c_i + n_i - 1

A session is used only when its tokens are a proper prefix of the row's new prefix and it was computed by the
served policy version; otherwise the row is prefilled from scratch (cached length 0) and the session replaced.

Exactness: a cached key equals the key a full prefill would compute up to float rounding (the same weights and
positions, another matrix shape), so the sampled tokens are the same for the same draws and the log-probs agree
to float tolerance (tests/rollout/test_kv_reuse.py: same tokens, log-probs within 1e-5 in float32).

Memory bound: a session holds 2 x layers x kv_heads x head_dim x dtype bytes per token of its episode (at most
prompt + ``max_response_tokens`` tokens), and lives until its episode ends. Together the sessions hold what the
decode batch of one turn already held (every active row's history); a call holds both the sessions and the
batch's copy, so the KV memory peak is about twice the batch cache of a turn. ``rollout.collector.kv_reuse=false``
turns them off (every turn re-prefilled, the behaviour before sessions).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class KVSession:
    """One episode's cache: ``kv`` (layers, 2, kv_heads, len(ids), head_dim) holds keys and values of ``ids``,
    computed by policy ``version``. Reassigned (never written in place) by the engine, so a shallow copy (a
    branched episode) shares tensors safely."""

    ids: list[int] = field(default_factory=list)
    kv: torch.Tensor | None = None
    version: int = -1
    reused_tokens: int = 0  # over this session's calls: prefix tokens read from the cache
    prefilled_tokens: int = 0  # ... and tokens run through a prefill

    def cached_length(self, prefix: list[int], version: int) -> int:
        """How many leading tokens of ``prefix`` this session holds (0 when it cannot serve it: another policy
        version, not a prefix, or nothing left to feed)."""
        n = len(self.ids)
        if self.kv is None or version != self.version or n >= len(prefix) or prefix[:n] != self.ids:
            return 0
        return n

    def clear(self) -> None:
        self.ids, self.kv, self.version = [], None, -1


def assemble(sessions: list[KVSession], cached: list[int], prefixes: list[list[int]], pad_id: int):
    """The batch of a session prefill (module docstring): (past keys / values (layers, 2, B, kv_heads, Wc, hd) or
    None when no row has a cache, new token ids (B, N), attention mask (B, Wc + N), positions (B, N))."""
    b = len(prefixes)
    wc = max(cached)
    new = [p[c:] for p, c in zip(prefixes, cached)]
    n = max(len(x) for x in new)
    past = None
    if wc:
        ref = next(s.kv for s, c in zip(sessions, cached) if c)
        layers, _, heads, _, hd = ref.shape
        past = ref.new_zeros(layers, 2, b, heads, wc, hd)
        for i, (s, c) in enumerate(zip(sessions, cached)):
            if c:
                past[:, :, i, :, wc - c:] = s.kv
    ids = torch.full((b, n), pad_id, dtype=torch.long)
    attn = torch.zeros((b, wc + n), dtype=torch.long)
    pos = torch.zeros((b, n), dtype=torch.long)
    for i, (x, c) in enumerate(zip(new, cached)):
        ids[i, n - len(x):] = torch.tensor(x, dtype=torch.long)
        attn[i, wc - c: wc] = 1
        attn[i, wc + n - len(x):] = 1
        pos[i, n - len(x):] = torch.arange(c, c + len(x))
    return past, ids, attn, pos


def save_rows(sessions: list[KVSession], layers_kv: list[tuple[torch.Tensor, torch.Tensor]], positions: list[int],
              rows: list[int], prefix_mask: torch.Tensor, width: int, prefixes: list[list[int]],
              tokens: torch.Tensor, lengths: torch.Tensor, version: int) -> None:
    """Store rows leaving the decode batch. ``layers_kv``: per layer (keys, values), (A, kv_heads, C, hd) with the
    prefill's ``width`` columns first and then one column per decode step; ``positions[j]`` is the batch position of
    original row ``rows[j]``; ``prefix_mask`` (A, width) marks the prefill's real columns. A row that generated
    ``g`` tokens fed the first ``g - 1`` of them (columns width .. width + g - 2)."""
    for j, r in zip(positions, rows):
        fed = max(int(lengths[r]) - 1, 0)
        dev = prefix_mask.device
        cols = torch.cat([prefix_mask[j].nonzero().flatten(), torch.arange(width, width + fed, device=dev)])
        kv = torch.stack([torch.stack((k[j].index_select(1, cols), v[j].index_select(1, cols)))
                          for k, v in layers_kv])  # (layers, 2, kv_heads, L, hd)
        s = sessions[r]
        s.ids, s.kv, s.version = prefixes[r] + tokens[r, :fed].tolist(), kv, version
