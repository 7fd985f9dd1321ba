"""Turn trajectories and their rewards into a padded :class:`TrainBatch`, the layout a model's forward pass reads
(trainer, reward models, scoring); below the packages that build batches (rewards, train, methods)."""
from __future__ import annotations

import torch

from credo.models.vision import example_pixels
from credo.types import Example, RewardResult, TrainBatch, Trajectory, declare_extra

SAMPLED = declare_extra("sampled", "collate (credo.models.batch): (B,) bool, False for the rows the engine did not "
                        "sample (info['replay']: answers replayed from a pool); every collated batch has it",
                        per_token=False)
PIXEL_VALUES = declare_extra("pixel_values", "collate (credo.models.batch), vision-language policies: (B, 3, H, W) "
                             "float, each row's image normalised (credo.models.vision); absent for text-only batches",
                             per_token=False)


def collate(trajs: list[Trajectory], rewards: list[RewardResult], *, pad_id: int, temperature: float = 1.0
            ) -> TrainBatch:
    """Left-pad prompts to P, right-pad responses to T (see :class:`TrainBatch` for the layout). The batch records
    how it was sampled: ``temperature`` (the rollouts' sampling temperature) and the extra ``sampled``, False for
    the rows the engine did not generate (``info["replay"]``: answers replayed from a pool), and the extra
    ``pixel_values`` when the rows' examples carry images (``meta["image"]``, credo.models.vision).

    Behaviour log-probs are never zero-filled: a sampled row's loss token whose log-prob the engine did not return
    (a list shorter than the response, a None or NaN entry) is NaN in ``rollout_logprobs``, for the
    ``finite_logprobs`` guard (credo.guards.logprobs) to see; positions outside the loss and rows the engine did not
    sample (their behaviour log-probs are the trainer's) hold 0.0."""
    if len(trajs) != len(rewards):
        raise ValueError(f"{len(trajs)} trajectories but {len(rewards)} rewards")
    batch = len(trajs)
    plen = max(len(t.prompt_ids) for t in trajs)
    rlen = max(max(len(t.response_ids) for t in trajs), 1)
    input_ids = torch.full((batch, plen + rlen), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, plen + rlen), dtype=torch.long)
    responses = torch.full((batch, rlen), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, rlen))
    rollout_lp = torch.full((batch, rlen), float("nan"))  # NaN = no log-prob from the engine
    for i, t in enumerate(trajs):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, plen - p : plen] = torch.tensor(t.prompt_ids)
        attention[i, plen - p : plen + r] = 1
        if r:
            input_ids[i, plen : plen + r] = torch.tensor(t.response_ids)
            responses[i, :r] = torch.tensor(t.response_ids)
            mask[i, :r] = torch.tensor(t.response_mask, dtype=torch.float32)
            rollout_lp[i, :r] = behaviour_logprobs(t.rollout_logprobs, r)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    sampled = torch.tensor(["replay" not in t.info for t in trajs], dtype=torch.bool)
    rollout_lp = rollout_lp.masked_fill(~(mask.bool() & sampled[:, None]), 0.0)  # only the guard's tokens keep NaN
    pixels = example_pixels([t.example for t in trajs])  # None unless the rows carry images
    return TrainBatch(
        input_ids=input_ids, attention_mask=attention, position_ids=positions, responses=responses,
        response_mask=mask, prompt_len=plen, rollout_logprobs=rollout_lp,
        scores=torch.tensor([r.score for r in rewards], dtype=torch.float32),
        group_ids=torch.tensor([t.group_id for t in trajs], dtype=torch.long), temperature=temperature,
        extras={SAMPLED: sampled} | ({} if pixels is None else {PIXEL_VALUES: pixels}),
    )


def behaviour_logprobs(logprobs: list[float | None], length: int) -> torch.Tensor:
    """(length,) float: the engine's log-probs of one response, NaN where it gave none (None entries, or a list
    shorter than the response); a list longer than the response is an engine bug and raises."""
    if len(logprobs) > length:
        raise ValueError(f"{len(logprobs)} rollout log-probs for a response of {length} tokens")
    out = torch.full((length,), float("nan"))
    given = logprobs if None not in logprobs else [float("nan") if x is None else x for x in logprobs]
    out[: len(given)] = torch.tensor(given, dtype=torch.float32)
    return out


def token_batch(prompt_ids: list[list[int]], response_ids: list[list[int]], *, pad_id: int) -> TrainBatch:
    """Prompt + response token-id rows (every response token in the loss) in the :class:`TrainBatch` layout, for
    scoring models (reward models, BiRM) outside a rollout."""
    trajs = [Trajectory(example=Example("", ""), group_id=0, prompt_ids=p, response_ids=r,
                        rollout_logprobs=[0.0] * len(r), response_mask=[1] * len(r), finish_reason="eos")
             for p, r in zip(prompt_ids, response_ids)]
    return collate(trajs, [RewardResult(0.0)] * len(trajs), pad_id=pad_id)
