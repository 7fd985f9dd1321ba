"""Shared prompts, packed responses: the training forward without response padding (``train.pack_responses``).

:func:`credo.train.forward.shared_prompt_hidden` runs each distinct prompt once and the B responses on top as a
padded (B, T) block: every row pays for the longest response of the micro-batch. Here the responses are packed
instead. The fed tokens of row b are its response's first ``len_b - 1`` tokens (token t predicts token t + 1; the
prompt's last hidden state predicts token 0). They are packed first-fit into rows of at most ``capacity`` tokens
(default: the longest fed response). Each packed row carries, as its key / value cache, the real columns of the
distinct prompts of its members (a differentiable gather of the prompts' keys and values: a prompt's gradient is
the sum over the rows that read it), and one additive mask (R, 1, Q, Kc + Q) says who attends to what::

    query (row r, member m, offset j) attends to:  cache columns of m's prompt        (any; the prompt is before it)
                                                   packed columns of m at offsets <= j (causal within its response)
    (a padding query: itself only, so no row of the mask is empty)

Positions continue each sequence's own count (the batch's position ids), so each token sees exactly the keys and
positions of the padded forward: the hidden states equal it up to float rounding (tests/train/test_forward.py,
float64, values and every parameter gradient). Cost: the real tokens only, plus attention over Q x (Kc + Q) per
packed row, which is why rows stay short (one longest response by default) instead of one row per micro-batch.
"""
from __future__ import annotations

import torch

from credo.models.batch import PIXEL_VALUES
from credo.models.compat import cache_kwargs, output_cache
from credo.train.packing import first_fit


def packed_shared_hidden(model: torch.nn.Module, batch, first: torch.Tensor, inverse: torch.Tensor,
                         valid: torch.Tensor, capacity: int | None = None) -> torch.Tensor:
    """Final hidden states predicting every real response token, row-major over ``valid`` (B, T): (N, H).
    ``first`` (U,): a row of each distinct prompt; ``inverse`` (B,): each row's prompt index."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    p = batch.prompt_len
    ids, attn, pos = (x.to(device) for x in (batch.input_ids, batch.attention_mask, batch.position_ids))
    rows, index = first.to(device), inverse.to(device)
    pixels = batch.extras.get(PIXEL_VALUES)  # (B, 3, H, W) or None
    images = {} if pixels is None else {"pixel_values": pixels.to(device)[rows]}
    cache = DynamicCache(config=model.config)
    out = model.base_model(input_ids=ids[rows, :p], attention_mask=attn[rows, :p], position_ids=pos[rows, :p],
                           **cache_kwargs(model.base_model, cache), use_cache=True, **images)
    last = out.last_hidden_state[:, -1]  # (U, H): predicts each row's response token 0
    lengths = valid.sum(-1).cpu()  # (B,)
    fed = (lengths - 1).clamp(min=0).tolist()
    feeders = [b for b, n in enumerate(fed) if n > 0]
    if not feeders:
        return last[index][valid[:, 0]]
    plan = _plan(lengths.tolist(), feeders, inverse.tolist(), attn[rows, :p].cpu(), p, capacity or max(fed))
    cache = _gather_cache(output_cache(out), plan["cache_src"], model.config)
    q_ids = ids[plan["q_row"], plan["q_col"]]  # (R, Q) the fed tokens at columns p + j of their rows
    q_pos = pos[plan["q_row"], plan["q_col"]]
    mask = plan["allowed"].to(device)  # sdpa reads a boolean mask (True = attend); eager adds a float one
    if getattr(model.config, "_attn_implementation", "sdpa") != "sdpa":
        dtype = out.last_hidden_state.dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, torch.finfo(dtype).min)
    hidden = model.base_model(input_ids=q_ids, position_ids=q_pos, attention_mask=mask,
                              **cache_kwargs(model.base_model, cache), use_cache=True).last_hidden_state  # (R, Q, H)
    src = torch.cat([last, hidden.reshape(-1, hidden.shape[-1])])  # (U + R Q, H)
    return src[plan["out_index"].to(device)]  # (N, H)


def _plan(lengths: list[int], feeders: list[int], prompt_of: list[int], prompt_attn: torch.Tensor, p: int,
          capacity: int) -> dict[str, torch.Tensor]:
    """Index tensors of the packed forward (CPU): which row / column each query token comes from (R, Q), the
    flat prompt columns each packed row's cache gathers (R, Kc; -1 = padding), the mask's allowed pairs
    (R, 1, Q, Kc + Q; a padding query attends to itself only) and, for each real response token (row-major), its
    hidden state's index in cat([prompt last states (U), packed states (R Q)])."""
    fed = [max(n - 1, 0) for n in lengths]  # row b feeds its first len_b - 1 response tokens
    bins = [[feeders[i] for i in b] for b in first_fit([fed[b] for b in feeders], capacity)]
    width = max(sum(fed[b] for b in members) for members in bins)
    prompt_cols = [prompt_attn[u].nonzero().flatten() for u in range(prompt_attn.shape[0])]  # real columns
    row_prompts = [sorted({prompt_of[b] for b in members}) for members in bins]
    kc = max(sum(len(prompt_cols[u]) for u in us) for us in row_prompts)
    r = len(bins)
    q_row = torch.zeros(r, width, dtype=torch.long)
    q_col = torch.full((r, width), p, dtype=torch.long)  # padding queries read column p of row 0 (masked out)
    q_member = torch.full((r, width), -1, dtype=torch.long)
    q_off = torch.zeros(r, width, dtype=torch.long)
    cache_src = torch.full((r, kc), -1, dtype=torch.long)
    cache_prompt = torch.full((r, kc), -1, dtype=torch.long)
    packed_at: dict[int, tuple[int, int]] = {}  # row b -> (packed row, first column)
    for k, (members, us) in enumerate(zip(bins, row_prompts)):
        col = 0
        for b in members:
            n = fed[b]
            q_row[k, col: col + n], q_col[k, col: col + n] = b, p + torch.arange(n)
            q_member[k, col: col + n], q_off[k, col: col + n] = b, torch.arange(n)
            packed_at[b] = (k, col)
            col += n
        c = 0
        for u in us:
            cols = prompt_cols[u]
            cache_src[k, c: c + len(cols)] = u * p + cols
            cache_prompt[k, c: c + len(cols)] = u
            c += len(cols)
    q_prompt = torch.where(q_member >= 0, torch.tensor(prompt_of)[q_member.clamp(min=0)], -2)  # (R, Q)
    to_cache = q_prompt[:, :, None] == cache_prompt[:, None, :]  # (R, Q, Kc)
    to_self = (q_member[:, :, None] == q_member[:, None, :]) & (q_off[:, None, :] <= q_off[:, :, None]) \
        & (q_member >= 0)[:, :, None]  # (R, Q, Q)
    pad = torch.eye(width, dtype=torch.bool) & (q_member < 0)[:, :, None]  # (R, Q, Q): a padding query sees itself
    allowed = torch.cat([to_cache, to_self | pad], dim=-1).unsqueeze(1)  # (R, 1, Q, Kc + Q)
    # (no query row is all False: a fully masked row would give NaN in sdpa, and 0 * NaN in the backward)
    u_count = prompt_attn.shape[0]
    out_index = []
    for b, n in enumerate(fed):
        if lengths[b]:
            out_index.append(prompt_of[b])  # token 0: the prompt's last state
        if n:
            k, col = packed_at[b]
            out_index.extend(u_count + k * width + col + j for j in range(n))
    return {"q_row": q_row, "q_col": q_col, "cache_src": cache_src, "allowed": allowed,
            "out_index": torch.tensor(out_index, dtype=torch.long)}


def _gather_cache(prompts, cache_src: torch.Tensor, config):
    """A cache of R rows whose row k holds the prompts' key / value columns ``cache_src[k]`` (flat u * p + column
    indices into the (U, heads, p, hd) prompt cache; -1 = a padding column, masked out): differentiable."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for i, layer in enumerate(prompts.layers):
        keys, values = layer.keys, layer.values  # (U, kv_heads, p, hd)
        idx = cache_src.clamp(min=0).to(keys.device)  # (R, Kc)

        def gather(x: torch.Tensor) -> torch.Tensor:
            flat = x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3])  # (U p, kv_heads, hd)
            return flat[idx].transpose(1, 2)  # (R, kv_heads, Kc, hd)

        cache.update(gather(keys), gather(values), i)
    return cache
