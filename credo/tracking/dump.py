"""Rollout dumps: what the policy was trained on, one JSON row per sample (``log.rollouts_every``).

Each row holds the token ids exactly as they entered the batch (prompt without its left padding,
response up to its length), the loss mask and advantages of the response tokens, the turn spans of agent
episodes, the decoded text and the reward. It is what a person reads to see what the model does, and
what the agent end-to-end test checks token by token.

Format 2 (``"format": 2``) adds what a replay of the step needs (``credo inspect``, :mod:`credo.inspect`): the
sampler's log-probs (``rollout_logprobs``), the behaviour policy's recomputed log-probs (``old_logprobs``, None
when the old-log-prob pass was fused into the update) and entropy (``entropy``, None likewise), the token rewards
the estimator saw (``token_rewards``), the critic's values at collection (``values``, None without a critic) and
the sampling ``temperature``. Rows without ``format`` are format 1 (the
keys above absent); readers treat every added key as optional.
"""
from __future__ import annotations

from typing import Any

import torch

from credo.types import RewardResult, TrainBatch, Trajectory

DUMP_FORMAT = 2
DIGITS = 5  # rounding of the per-token floats (advantages, log-probs, entropy, rewards)


def _row_floats(x: torch.Tensor | None, i: int, n: int) -> list[float] | None:
    """Row ``i`` of a (B, T) tensor, its first ``n`` values rounded; None when the tensor is absent."""
    return None if x is None else [round(float(v), DIGITS) for v in x[i, :n].tolist()]


def rollout_records(batch: TrainBatch, trajs: list[Trajectory], results: list[RewardResult],
                    tokenizer) -> list[dict[str, Any]]:
    rows = []
    for i, (traj, res) in enumerate(zip(trajs, results)):
        n = len(traj.response_ids)
        keep = batch.attention_mask[i, :batch.prompt_len].bool()  # (P,) drop the left padding
        row = {
            "format": DUMP_FORMAT,
            "uid": traj.example.uid, "group": int(batch.group_ids[i]), "score": float(batch.scores[i]),
            "correct": bool(res.correct), "failed": bool(res.failed), "error": res.error,
            "prompt_ids": batch.input_ids[i, :batch.prompt_len][keep].tolist(),
            "response_ids": batch.responses[i, :n].tolist(),
            "response_mask": [int(m) for m in batch.response_mask[i, :n].tolist()],
            "advantages": _row_floats(batch.advantages, i, n),
            "rollout_logprobs": _row_floats(batch.rollout_logprobs, i, n),
            "old_logprobs": _row_floats(batch.old_logprobs, i, n),
            "entropy": _row_floats(batch.entropy, i, n),
            "token_rewards": _row_floats(batch.extras.get("token_rewards"), i, n),  # the step's extra
            "values": _row_floats(batch.values, i, n),
            "temperature": float(batch.temperature),
            "policy_version": traj.policy_version,  # the sampler's policy (the first, under partial rollouts)
            "token_versions": list(traj.token_versions) if traj.token_versions else None,  # partial rollouts
            "turns": [list(t) for t in traj.turns],
            "prompt": tokenizer.decode(traj.prompt_ids, skip_special_tokens=True),
            "response": traj.response_text,
            "info": {k: v for k, v in traj.info.items() if isinstance(v, (str, int, float, bool, type(None)))},
        }
        rows.append(row)
    return rows
