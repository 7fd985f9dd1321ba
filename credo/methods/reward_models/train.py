"""Reward-model training: an outcome reward model (ORM) with the Bradley-Terry loss, and CRM's two peer-reviewing
models. The model is :class:`credo.models.ValueModel` (a causal-LM backbone with a scalar head); a response's
reward is the head's output at its last token (EOS) or the mean over its tokens (:func:`rm_scores`). Losses:
:mod:`credo.methods.reward_models.algo`.
"""
from __future__ import annotations

import random
from typing import Callable

import torch

from credo.methods.reward_models.algo import (bradley_terry_loss, curriculum_order, keep_ratio_schedule, peer_select)
from credo.methods.reward_models.pairs import PreferencePair
from credo.models import ValueModel
from credo.rewards.rm_scoring import response_batch, rm_scores
from credo.train.optim import build_optimizer, build_scheduler, clip_and_step

OnStep = Callable[[int, dict[str, float]], None]


def pair_scores(rm: ValueModel, tokenizer, pairs: list[PreferencePair],
                pooling: str = "last") -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen scores (B,), rejected scores (B,)), one forward over the 2B rows."""
    prompts = [p.prompt for p in pairs]
    scores = rm_scores(rm, response_batch(tokenizer, prompts * 2, [p.chosen for p in pairs] +
                                          [p.rejected for p in pairs]), pooling)
    return scores[: len(pairs)], scores[len(pairs):]


@torch.no_grad()
def margins(rm: ValueModel, tokenizer, pairs: list[PreferencePair], batch_size: int = 64,
            pooling: str = "last") -> torch.Tensor:
    """(N,) r(chosen) - r(rejected) of every pair."""
    was = rm.training
    rm.eval()
    out = []
    for i in range(0, len(pairs), batch_size):
        c, r = pair_scores(rm, tokenizer, pairs[i : i + batch_size], pooling)
        out.append((c - r).cpu())
    rm.train(was)
    return torch.cat(out) if out else torch.zeros(0)


def pairwise_accuracy(rm: ValueModel, tokenizer, pairs: list[PreferencePair], batch_size: int = 64,
                      pooling: str = "last") -> float:
    """Share of pairs whose chosen response scores higher (a tie counts as wrong)."""
    if not pairs:
        return float("nan")
    return float((margins(rm, tokenizer, pairs, batch_size, pooling) > 0).float().mean())


def train_bt(rm: ValueModel, tokenizer, pairs: list[PreferencePair], *, steps: int, batch_size: int, lr: float,
             margin: float = 0.0, warmup_steps: int = 0, grad_clip: float = 1.0, seed: int = 0,
             pooling: str = "last", on_step: OnStep | None = None) -> None:
    """Bradley-Terry training on random mini-batches of ``pairs``."""
    rng = random.Random(f"credo/rm/{seed}")
    opt = build_optimizer(rm, lr=lr)
    sched = build_scheduler(opt, warmup_steps=warmup_steps, total_steps=steps)
    rm.train()
    for step in range(steps):
        batch = rng.sample(pairs, min(batch_size, len(pairs)))
        chosen, rejected = pair_scores(rm, tokenizer, batch, pooling)
        loss, metrics = bradley_terry_loss(chosen, rejected, margin=margin)
        loss.backward()
        metrics |= {"rm/loss": float(loss.detach()), "rm/lr": sched.get_last_lr()[0],
                    "rm/grad_norm": clip_and_step(rm, opt, sched, grad_clip)}
        if on_step is not None:
            on_step(step + 1, metrics)


def train_crm(rms: tuple[ValueModel, ValueModel], tokenizer, pairs: list[PreferencePair], *, steps: int,
              batch_size: int, lr: float, keep_final: float, keep_warmup: float, curriculum: bool = True,
              margin: float = 0.0, warmup_steps: int = 0, grad_clip: float = 1.0, seed: int = 0,
              pooling: str = "last", on_step: OnStep | None = None) -> None:
    """CRM: each model draws its own mini-batch; its peer scores that batch (no gradient) and the model trains on
    the pairs the peer's margins rank highest (module docstring of :mod:`credo.methods.reward_models.algo`). With
    ``curriculum`` both walk the pairs easy to hard by the two models' mean margin, recomputed at the start of every
    pass over the data (the models then differ by their heads' initialisation and their selections); otherwise
    each model shuffles the pairs with its own stream."""
    rngs = [random.Random(f"credo/crm/{seed}/{k}") for k in range(2)]
    opts = [build_optimizer(m, lr=lr) for m in rms]
    scheds = [build_scheduler(o, warmup_steps=warmup_steps, total_steps=steps) for o in opts]
    orders: list[list[int]] = [[], []]
    for m in rms:
        m.train()
    for step in range(steps):
        if len(orders[0]) < batch_size:  # a new pass over the data (both models pass at the same steps)
            if curriculum:
                shared = curriculum_order(*(margins(m, tokenizer, pairs, pooling=pooling) for m in rms)).tolist()
                orders = [list(shared), list(shared)]
            else:
                orders = [r.sample(range(len(pairs)), len(pairs)) for r in rngs]
        ratio = keep_ratio_schedule(step, steps, final=keep_final, warmup=keep_warmup)
        metrics: dict[str, float] = {"crm/keep_ratio": ratio}
        for k, (m, opt, sched) in enumerate(zip(rms, opts, scheds)):
            idx, orders[k] = orders[k][:batch_size], orders[k][batch_size:]
            batch = [pairs[i] for i in idx]
            with torch.no_grad():  # the peer reviews this model's batch
                peer_c, peer_r = pair_scores(rms[1 - k], tokenizer, batch, pooling)
            keep = peer_select(peer_c - peer_r, ratio)
            loss, mm = bradley_terry_loss(*pair_scores(m, tokenizer, batch, pooling), margin=margin,
                                          weights=keep.float())
            loss.backward()
            name = "ab"[k]
            metrics |= {f"crm/loss_{name}": float(loss.detach()), f"crm/accuracy_{name}": mm["rm/accuracy"],
                        f"crm/grad_norm_{name}": clip_and_step(m, opt, sched, grad_clip)}
            noisy = torch.tensor([p.flipped for p in batch])
            if bool(noisy.any()) and bool((~keep).any()):  # share of the dropped pairs that were flipped labels
                metrics[f"crm/dropped_noisy_frac_{name}"] = float(noisy[~keep].float().mean())
        if on_step is not None:
            on_step(step + 1, metrics)
