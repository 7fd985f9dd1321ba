"""Which response tokens the policy loss credits: all of them, the top-q entropy "forking" tokens
(``algo.top_entropy_quantile``), or VEPO's grounding-sensitive ones (``vepo.enabled``, :mod:`credo.methods.vepo.select`)."""
from __future__ import annotations

import dataclasses

import torch

from credo.config import RunConfig
from credo.train.forward import ForwardOptions
from credo.methods.vepo.grounding import prompt_offset
from credo.train.stats import Timer
from credo.methods.vepo.select import vepo_step
from credo.types import TrainBatch


def select_tokens(cfg: RunConfig, batch: TrainBatch, metrics: dict) -> TrainBatch:
    """Restrict the policy loss to the top-q entropy tokens ("forking tokens") when configured."""
    q = cfg.algo.top_entropy_quantile
    if q >= 1.0:
        return batch
    valid = batch.response_mask.bool()
    threshold = torch.quantile(batch.entropy[valid].double(), 1.0 - q) if valid.any() else 0.0
    keep = valid & (batch.entropy >= threshold)
    metrics["token_select/frac"] = float(keep.sum()) / max(float(valid.sum()), 1.0)
    return dataclasses.replace(batch, response_mask=keep.float())


def vepo_select(cfg: RunConfig, model, tokenizer, batch: TrainBatch, trajs, metrics: dict, timer: Timer, *,
                step: int) -> TrainBatch:
    """VEPO (``vepo.enabled``): gradient credit only for the grounding-sensitive tokens, from a second no-grad
    forward with each prompt's grounding span perturbed (credo.methods.vepo.select)."""
    if not cfg.vepo.enabled:
        return batch
    with timer("vepo"):
        offset = prompt_offset(cfg.task.prompt_template, chat=cfg.task.chat_template, tokenizer=tokenizer)
        out, vepo_metrics = vepo_step(cfg.vepo, model, tokenizer, batch, trajs, seed=cfg.seed, step=step,
                                      temperature=cfg.rollout.temperature, micro_batch_size=cfg.train.micro_batch_size,
                                      opts=ForwardOptions.of(cfg), offset=offset)
    metrics.update(vepo_metrics)
    return out
