"""Held-out diagnostics for Interaction Distillation (docs/reward_models.md): pairwise accuracy by corruption kind,
for a student
or the teacher, and the accuracy against a masked prompt prefix (Figure 1's probe: how much the score still depends
on the early tokens)."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch

from credo.methods.reward_models.pairs import PreferencePair
from credo.methods.reward_models.train import margins

KINDS = ("swap", "replace", "drop", "add")


def corruption_kind(chosen: str, rejected: str) -> str:
    """How a generated rejected response differs from the chosen one (``pairs.corrupt``): one shorter = drop, one
    longer = add, same length with the same characters = swap (two exchanged), else replace."""
    if len(rejected) == len(chosen) - 1:
        return "drop"
    if len(rejected) == len(chosen) + 1:
        return "add"
    if len(rejected) == len(chosen):
        return "swap" if sorted(rejected) == sorted(chosen) else "replace"
    return "other"  # a file's pairs


def by_kind(pairs: list[PreferencePair], correct: list[float]) -> dict[str, float]:
    """Mean of ``correct`` (one value per pair) per corruption kind, plus ``same_length`` (swap + replace)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for p, c in zip(pairs, correct):
        kind = corruption_kind(p.chosen, p.rejected)
        groups[kind].append(c)
        if kind in ("swap", "replace"):
            groups["same_length"].append(c)
    return {k: sum(v) / len(v) for k, v in sorted(groups.items())}


def student_by_kind(rm, tokenizer, pairs: list[PreferencePair], pooling: str = "last") -> dict[str, float]:
    """A reward model's held-out pairwise accuracy per corruption kind (a tie counts as wrong)."""
    ok = (margins(rm, tokenizer, pairs, pooling=pooling) > 0).float().tolist()
    return by_kind(pairs, ok)


@torch.no_grad()
def masked_prefix_accuracy(rm, tokenizer, pairs: list[PreferencePair], fractions=(0.0, 0.2, 0.4, 0.6, 0.8),
                           pooling: str = "last") -> dict[str, float]:
    """Pairwise accuracy when the first ``f`` share of each row's real tokens (from <bos>) is hidden from attention
    (attention mask 0; position ids kept), per fraction ``f``."""
    from credo.rewards.rm_scoring import response_batch, rm_scores

    was = rm.training
    rm.eval()
    out = {}
    batch = response_batch(tokenizer, [p.prompt for p in pairs] * 2, [p.chosen for p in pairs] +
                           [p.rejected for p in pairs])
    for f in fractions:
        attn = batch.attention_mask.clone()
        rank = attn.cumsum(-1) - 1  # (2N, L) index among real tokens
        hide = (rank < (f * attn.sum(-1, keepdim=True)).floor()) & attn.bool()
        attn[hide] = 0
        masked = dataclasses.replace(batch, attention_mask=attn)
        s = rm_scores(rm, masked, pooling)
        n = len(pairs)
        out[f"{f:.1f}"] = float((s[:n] > s[n:]).float().mean())
    rm.train(was)
    return out
