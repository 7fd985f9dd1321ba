"""Padding-free forward inputs: pack the real tokens of a padded :class:`TrainBatch` into a few dense rows.

A :class:`TrainBatch` row is ``[left-padded prompt (P) | right-padded response (T)]``; its real tokens
(attention 1) are contiguous. Packing concatenates the real tokens of several rows into one row of at most
``row_tokens`` tokens, with position ids restarting at 0 for each sequence. Hugging Face models read a position-id
restart with no attention mask as a sequence boundary (block-diagonal causal attention: transformers'
``find_packed_sequence_indices``), so each sequence sees exactly the tokens it sees in the padded batch. The tail
of a row is filled with a padding segment that restarts its own positions (its outputs are never read).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from credo.types import TrainBatch


@dataclass
class Packed:
    input_ids: torch.Tensor  # (R, S) long
    position_ids: torch.Tensor  # (R, S) long
    response_index: torch.Tensor  # (N,) long: flat index into (R * S) of the hidden state predicting each label
    labels: torch.Tensor  # (N,) long: the response tokens, row-major over the batch
    valid: torch.Tensor  # (B, T) bool: which response positions the N labels fill


def valid_responses(batch: TrainBatch) -> torch.Tensor:
    """(B, T) bool: real response tokens (model tokens and observations alike; padding excluded)."""
    return batch.attention_mask[:, batch.prompt_len:].bool()


def first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, longest first into the first bin with room (an item longer than ``capacity``
    gets a bin of its own). Deterministic: ties keep index order."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        for b, left in enumerate(room):
            if lengths[i] <= left:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def token_budget_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive groups of indices whose lengths sum to at most ``budget`` (a longer item is a group alone)."""
    groups: list[list[int]] = []
    used = budget + 1
    for i, n in enumerate(lengths):
        if used + n > budget:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups


def pack(batch: TrainBatch, row_tokens: int, pad_id: int = 0) -> Packed:
    """Pack the batch's real tokens into rows of at most ``max(row_tokens, longest sequence)`` tokens
    (``row_tokens=0``: rows as long as the longest sequence, so no row costs more attention than padding would)."""
    attn = batch.attention_mask.bool()  # (B, L)
    lengths = attn.sum(-1).tolist()
    bins = first_fit(lengths, max(row_tokens, max(lengths)))
    width = max(sum(lengths[i] for i in b) for b in bins)
    input_ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(bins), width), dtype=torch.long)
    start = torch.zeros(batch.batch_size, dtype=torch.long)  # flat offset of each sequence's first real token
    for r, members in enumerate(bins):
        col = 0
        for i in members:
            n = lengths[i]
            input_ids[r, col : col + n] = batch.input_ids[i][attn[i]]
            positions[r, col : col + n] = torch.arange(n)
            start[i] = r * width + col
            col += n
        positions[r, col:] = torch.arange(width - col)  # padding segment restarts its positions
    valid = valid_responses(batch)  # (B, T)
    rows, cols = valid.nonzero(as_tuple=True)
    first_real = batch.prompt_len - attn[:, : batch.prompt_len].sum(-1)  # (B,) column of the first real token
    # response token (i, j) is predicted by input column P - 1 + j, i.e. real-token offset P - 1 + j - first_real
    offset = batch.prompt_len - 1 + cols - first_real[rows]
    return Packed(input_ids=input_ids, position_ids=positions, response_index=start[rows] + offset,
                  labels=batch.responses[rows, cols], valid=valid)
