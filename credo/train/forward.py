"""Policy forward pass over a :class:`TrainBatch`: response log-probs (and entropy)."""
from __future__ import annotations

import torch

from credo.algo import entropy_from_logits, logprobs_from_logits
from credo.types import TrainBatch


def response_logits(model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """Temperature-scaled logits that predict each response token: (B, T, V)."""
    device = next(model.parameters()).device
    out = model(
        input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device),
        position_ids=batch.position_ids.to(device), use_cache=False,
    )
    p, t = batch.prompt_len, batch.responses.shape[1]
    logits = out.logits[:, p - 1 : p - 1 + t, :]  # (B, T, V)
    return logits / temperature if temperature not in (0.0, 1.0) else logits


def policy_logprobs(
    model: torch.nn.Module, batch: TrainBatch, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs (B, T), entropy (B, T) or None) of the batch's responses under ``model``."""
    logits = response_logits(model, batch, temperature)
    labels = batch.responses.to(logits.device)
    logprobs = logprobs_from_logits(logits, labels)  # (B, T)
    entropy = entropy_from_logits(logits) if with_entropy else None  # (B, T)
    return logprobs, entropy


@torch.no_grad()
def batched_logprobs(
    model: torch.nn.Module, batch: TrainBatch, *, micro_batch_size: int | None, temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """No-grad log-probs (and entropy) of the whole batch, in micro-batches. Outputs are on the CPU."""
    was_training = model.training
    model.eval()
    size = micro_batch_size or batch.batch_size
    lps, ents = [], []
    try:
        for start in range(0, batch.batch_size, size):
            mb = batch.select(torch.arange(start, min(start + size, batch.batch_size)))
            lp, ent = policy_logprobs(model, mb, temperature=temperature, with_entropy=with_entropy)
            lps.append(lp.cpu())
            if ent is not None:
                ents.append(ent.cpu())
    finally:
        model.train(was_training)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)
