"""Interaction Distillation training: Bradley-Terry plus the intra- and inter-sequence alignment terms
(:mod:`credo.methods.reward_models.idrm.algo`) on random mini-batches, the teacher frozen (no-grad maps), the student in eager
attention (:mod:`credo.methods.reward_models.idrm.student`).

Per step, for pairs (x, y_w, y_l)::

    student rows   <bos> x y_w <eos> | <bos> x y_l <eos>       one forward of 2B rows, hooks on the aligned layers
    teacher rows   [CLS] x [SEP] y_w [SEP] y_l [SEP]           (+ the swapped order with teacher_orders=both)
    loss           L_BT + intra_coef * L_intra + inter_coef * L_inter
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import torch

from credo.methods.reward_models.idrm.algo import (causal_allowed, gather_block, layer_pairs, masked_mean, row_divergence,
                                     virtual_attention)
from credo.methods.reward_models.idrm.config import IDRMConfig
from credo.methods.reward_models.idrm.student import Captured, capture, decoder_layers, head_shape, rotate
from credo.methods.reward_models.idrm.teacher import CrossEncoder, ordered, student_positions
from credo.methods.reward_models.algo import bradley_terry_loss
from credo.methods.reward_models.pairs import PreferencePair
from credo.rewards.rm_scoring import response_batch, rm_scores
from credo.train.optim import build_optimizer, build_scheduler, clip_and_step

OnStep = Callable[[int, dict[str, float]], None]


@dataclass
class Layout:
    """Where the student's tokens are, for the 2B rows (chosen rows first)."""

    valid: torch.Tensor  # (2B, L) bool real tokens
    response: torch.Tensor  # (2B, L) bool response characters (EOS excluded)
    eos: torch.Tensor  # (2B,) column of each row's EOS
    positions: list[torch.Tensor]  # per teacher order: (2B, L) teacher position of every column (-1 = padding)


def layout(batch, tokenizer, pairs: list[PreferencePair], teacher_rows: list, device="cpu") -> Layout:
    """The student batch's columns mapped onto each teacher input (:func:`student_positions`)."""
    valid = batch.attention_mask.bool()
    width, p = valid.shape[1], batch.prompt_len
    enc = lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    prompt_lens = [enc(x.prompt) + 1 for x in pairs] * 2  # + <bos>
    resp = [enc(x.chosen) for x in pairs] + [enc(x.rejected) for x in pairs]
    response = torch.zeros_like(valid)
    for b, r in enumerate(resp):
        response[b, p : p + r] = True
    positions = []
    for tb, chosen_first in teacher_rows:  # chosen rows sit in the first slot when chosen_first
        starts_c = tb.first_start if chosen_first else tb.second_start
        starts_r = tb.second_start if chosen_first else tb.first_start
        positions.append(student_positions(p, width, prompt_lens, [r + 1 for r in resp], starts_c + starts_r))
    eos = width - 1 - valid.flip(-1).long().argmax(-1)
    return Layout(valid.to(device), response.to(device), eos.to(device), [x.to(device) for x in positions])


def _heads(maps: torch.Tensor, per_head: bool) -> torch.Tensor:
    return maps if per_head else maps.float().mean(1)  # (B, [H,] L, L)


def intra_loss(student: torch.Tensor, teacher: list[torch.Tensor], lay: Layout, cfg: IDRMConfig) -> torch.Tensor:
    """L_intra (a scalar): ``student`` (2B, [H,] L, L) maps; ``teacher`` per order (B, [H,] Lt, Lt)."""
    n2 = student.shape[0]
    rows = torch.arange(n2, device=student.device)
    if cfg.intra_rows == "last":  # the EOS row against the teacher's [CLS] row over x and y_s
        blocks = [gather_block(torch.cat([t, t]), torch.zeros(n2, 1, dtype=torch.long, device=student.device), pos)
                  for t, pos in zip(teacher, lay.positions)]  # (2B, [H,] 1, L)
        s_rows = student[rows, ..., lay.eos, :].unsqueeze(-2)  # (2B, [H,] 1, L)
        allowed = lay.valid.unsqueeze(1)  # (2B, 1, L)
    else:
        blocks = [gather_block(torch.cat([t, t]), pos, pos) for t, pos in zip(teacher, lay.positions)]
        s_rows, allowed = student, causal_allowed(lay.valid)
    t_block = torch.stack(blocks).mean(0)  # the mean over teacher orders
    per_row, kept = row_divergence(t_block, s_rows, allowed, cfg.align_loss)
    return masked_mean(per_row, kept).mean()  # = 1/2 sum_s mean_pairs 1/|I_s| sum_i


def inter_loss(q: torch.Tensor, k: torch.Tensor, teacher: list[torch.Tensor], lay: Layout, cfg: IDRMConfig,
               shape: tuple[int, int, int], rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """L_inter (a scalar) from the 2B rows' projections ``q`` (2B, L, H d), ``k`` (2B, L, H_kv d)."""
    heads, kv, d = shape
    n = q.shape[0] // 2
    if rope is not None:  # own_positions: each sequence's RoPE at its own position ids
        q, k = rotate(q, *rope, heads, d), rotate(k, *rope, kv, d)
    total = q.new_zeros((), dtype=torch.float32)
    for rows_of, cols_of in ((slice(0, n), slice(n, 2 * n)), (slice(n, 2 * n), slice(0, n))):  # w -> l, l -> w
        cols = lay.response[cols_of]
        s = _heads(virtual_attention(q[rows_of], k[cols_of], cols, num_heads=heads, num_kv_heads=kv, head_dim=d),
                   cfg.heads == "per_head")  # (B, [H,] L, L)
        blocks = [gather_block(t, pos[rows_of].masked_fill(~lay.response[rows_of], -1),
                               pos[cols_of].masked_fill(~cols, -1)) for t, pos in zip(teacher, lay.positions)]
        allowed = lay.response[rows_of].unsqueeze(-1) & cols.unsqueeze(-2)  # (B, L, L)
        per_row, kept = row_divergence(torch.stack(blocks).mean(0), s, allowed, cfg.align_loss)
        total = total + masked_mean(per_row, kept).mean() / 2
    return total


def alignment(rm, teacher: CrossEncoder, tokenizer, pairs: list[PreferencePair], batch, cap: Captured,
              cfg: IDRMConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """(lambda_intra L_intra + lambda_inter L_inter, metrics) averaged over the mapped layer pairs."""
    orders = [True] if cfg.teacher_orders == "chosen_first" else [True, False]
    rows = [(ordered(pairs, [o] * len(pairs), tokenizer), o) for o in orders]
    with torch.no_grad():
        t_maps = [teacher(tb, output_attentions=True)[1] for tb, _ in rows]  # per order: per layer (B, H, Lt, Lt)
    device = next(iter(cap.attn.values())).device
    lay = layout(batch, tokenizer, pairs, rows, device)
    per_head = cfg.heads == "per_head"
    pairs_ls = layer_pairs(cfg.layers, len(decoder_layers(rm.backbone)), len(t_maps[0]))
    shape = head_shape(rm.backbone)
    rope = None
    if cfg.inter_coef > 0 and cfg.inter_rope == "own_positions":
        ref = next(iter(cap.q.values()))
        rope = rm.backbone.rotary_emb(ref, batch.position_ids.to(ref.device))
    intra = inter = torch.zeros((), device=device)
    for ls, lt in pairs_ls:
        teacher_l = [_heads(m[lt].to(device, torch.float32), per_head) for m in t_maps]
        if cfg.intra_coef > 0:
            intra = intra + intra_loss(_heads(cap.attn[ls].float(), per_head), teacher_l, lay, cfg)
        if cfg.inter_coef > 0:
            inter = inter + inter_loss(cap.q[ls], cap.k[ls], teacher_l, lay, cfg, shape, rope)
    intra, inter = intra / len(pairs_ls), inter / len(pairs_ls)
    return cfg.intra_coef * intra + cfg.inter_coef * inter, {"idrm/intra_kl": float(intra.detach()),
                                                              "idrm/inter_kl": float(inter.detach())}


def train_idrm(rm, teacher: CrossEncoder | None, tokenizer, pairs: list[PreferencePair], cfg: IDRMConfig, *,
               steps: int, batch_size: int, lr: float, margin: float = 0.0, warmup_steps: int = 0,
               grad_clip: float = 1.0, seed: int = 0, pooling: str = "last", on_step: OnStep | None = None) -> None:
    """Bradley-Terry + alignment on random mini-batches (the same stream as ``train_bt``); the student's backbone
    must run eager attention. ``teacher`` None (or both coefficients 0) leaves plain BT through the same path."""
    rng = random.Random(f"credo/rm/{seed}")
    opt = build_optimizer(rm, lr=lr)
    sched = build_scheduler(opt, warmup_steps=warmup_steps, total_steps=steps)
    align = teacher is not None and (cfg.intra_coef > 0 or cfg.inter_coef > 0)
    n_layers = len(decoder_layers(rm.backbone))
    hooked = sorted({ls for ls, _ in layer_pairs(cfg.layers, n_layers, teacher.bert.config.num_hidden_layers)}) \
        if align else []
    if teacher is not None:
        teacher.eval().requires_grad_(False)  # frozen: only the student gets gradients
    rm.train()
    for step in range(steps):
        batch_pairs = rng.sample(pairs, min(batch_size, len(pairs)))
        batch = response_batch(tokenizer, [p.prompt for p in batch_pairs] * 2,
                               [p.chosen for p in batch_pairs] + [p.rejected for p in batch_pairs])
        with capture(rm.backbone, hooked, qk=cfg.inter_coef > 0) as cap:
            scores = rm_scores(rm, batch, pooling)  # the unchanged inference path
        n = len(batch_pairs)
        loss, metrics = bradley_terry_loss(scores[:n], scores[n:], margin=margin)
        metrics["idrm/bt_loss"] = float(loss.detach())
        if align:
            extra, m = alignment(rm, teacher, tokenizer, batch_pairs, batch, cap, cfg)
            loss = loss + extra.to(loss.device)
            metrics |= m
        loss.backward()
        metrics |= {"rm/loss": float(loss.detach()), "rm/lr": sched.get_last_lr()[0],
                    "rm/grad_norm": clip_and_step(rm, opt, sched, grad_clip)}
        if on_step is not None:
            on_step(step + 1, metrics)
