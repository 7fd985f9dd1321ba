"""Supervised fine-tuning on task demonstrations (``credo sft`` and the warm start of ``credo train``).

Loss: token-mean negative log-likelihood of the demonstration response (plus EOS) given the prompt.
"""
from __future__ import annotations

import random
from typing import Any, Callable

import torch

from credo.algo import agg_loss
from credo.models.tokenizer import encode_prompt, encode_response
from credo.models.batch import collate
from credo.train.forward import policy_logprobs
from credo.train.optim import build_optimizer, build_scheduler, clip_and_step
from credo.types import Example, RewardResult, Trajectory


def demonstration_batch(tokenizer, examples: list[Example], demonstration: Callable[[Example], str]):
    """A :class:`TrainBatch` whose responses are the demonstrations."""
    trajs = []
    for ex in examples:
        resp = encode_response(tokenizer, demonstration(ex))
        trajs.append(Trajectory(example=ex, group_id=0, prompt_ids=encode_prompt(tokenizer, ex.prompt),
                                response_ids=resp, rollout_logprobs=[0.0] * len(resp),
                                response_mask=[1] * len(resp), finish_reason="eos"))
    return collate(trajs, [RewardResult(score=0.0)] * len(trajs), pad_id=tokenizer.pad_token_id)


def sft_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    logprobs, _ = policy_logprobs(model, batch)  # (B, T)
    return agg_loss(-logprobs, batch.response_mask, "token-mean")


def run_sft(model, tokenizer, examples: list[Example], demonstration: Callable[[Example], str] | None = None, *,
            steps: int, batch_size: int, lr: float, warmup_steps: int = 0, seed: int = 0, grad_clip: float = 1.0,
            batch_fn: Callable[[list[Example]], Any] | None = None,
            on_step: Callable[[int, dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """Run ``steps`` SFT steps on random demonstrations; returns the per-step metrics.

    ``batch_fn(examples) -> TrainBatch`` builds the batches (multi-turn episodes, whose loss mask covers the
    model's turns only); by default the single-turn ``demonstration(example)`` responses.
    """
    if batch_fn is None:
        if demonstration is None:
            raise ValueError("run_sft needs demonstration or batch_fn")
        batch_fn = lambda exs: demonstration_batch(tokenizer, exs, demonstration)  # noqa: E731
    if not examples:
        raise ValueError("SFT needs at least one example")
    rng = random.Random(f"credo/sft/{seed}")
    optimizer = build_optimizer(model, lr=lr)
    scheduler = build_scheduler(optimizer, warmup_steps=warmup_steps, total_steps=steps)
    model.train()
    history = []
    for step in range(steps):
        batch = batch_fn(rng.choices(examples, k=batch_size))
        loss = sft_loss(model, batch)
        loss.backward()
        lr_now = scheduler.get_last_lr()[0]
        grad_norm = clip_and_step(model, optimizer, scheduler, grad_clip)
        metrics = {"sft/loss": float(loss.detach()), "sft/grad_norm": grad_norm, "sft/lr": lr_now}
        history.append(metrics)
        if on_step is not None:
            on_step(step + 1, metrics)
    return history
