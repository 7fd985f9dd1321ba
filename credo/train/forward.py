"""Forward passes over a :class:`TrainBatch`: response log-probs, per-token statistics, critic values."""
from __future__ import annotations

import torch

from credo.algo import entropy_direction_from_logits, entropy_from_logits, logprobs_from_logits
from credo.types import TrainBatch

# Per-token statistics of the full next-token distribution that the no-grad pass can return.
TOKEN_STATS = ("entropy", "entropy_direction")


def _inputs(batch: TrainBatch, device: torch.device) -> dict[str, torch.Tensor]:
    return {"input_ids": batch.input_ids.to(device), "attention_mask": batch.attention_mask.to(device),
            "position_ids": batch.position_ids.to(device)}


def response_logits(model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """Temperature-scaled logits that predict each response token: (B, T, V)."""
    device = next(model.parameters()).device
    out = model(**_inputs(batch, device), use_cache=False)
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
    stats: tuple[str, ...] = (),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """No-grad log-probs of the whole batch plus the requested ``TOKEN_STATS``, in micro-batches, on the CPU."""
    unknown = set(stats) - set(TOKEN_STATS)
    if unknown:
        raise ValueError(f"unknown token statistics {sorted(unknown)}; available: {TOKEN_STATS}")
    was_training = model.training
    model.eval()
    size = micro_batch_size or batch.batch_size
    lps: list[torch.Tensor] = []
    out: dict[str, list[torch.Tensor]] = {name: [] for name in stats}
    try:
        for start in range(0, batch.batch_size, size):
            mb = batch.select(torch.arange(start, min(start + size, batch.batch_size)))
            logits = response_logits(model, mb, temperature)
            labels = mb.responses.to(logits.device)
            lps.append(logprobs_from_logits(logits, labels).cpu())
            if "entropy" in stats:
                out["entropy"].append(entropy_from_logits(logits).cpu())
            if "entropy_direction" in stats:
                out["entropy_direction"].append(entropy_direction_from_logits(logits, labels).cpu())
    finally:
        model.train(was_training)
    return torch.cat(lps), {name: torch.cat(parts) for name, parts in out.items()}


def response_values(critic: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
    """Critic values of the state before each response token: (B, T)."""
    device = next(critic.parameters()).device
    values = critic(**_inputs(batch, device))  # (B, L)
    p, t = batch.prompt_len, batch.responses.shape[1]
    return values[:, p - 1 : p - 1 + t]


@torch.no_grad()
def batched_values(critic: torch.nn.Module, batch: TrainBatch, *, micro_batch_size: int | None) -> torch.Tensor:
    was_training = critic.training
    critic.eval()
    size = micro_batch_size or batch.batch_size
    try:
        parts = [response_values(critic, batch.select(torch.arange(s, min(s + size, batch.batch_size)))).cpu()
                 for s in range(0, batch.batch_size, size)]
    finally:
        critic.train(was_training)
    return torch.cat(parts) * batch.response_mask
