"""Rollout dumps: what the policy was trained on, one JSON row per sample (``log.rollouts_every``).

Each row holds the token ids exactly as they entered the batch (prompt without its left padding,
response up to its length), the loss mask and advantages of the response tokens, the turn spans of agent
episodes, the decoded text and the reward. It is what a person reads to see what the model does, and
what the agent end-to-end test checks token by token.
"""
from __future__ import annotations

from typing import Any

from credo.types import RewardResult, TrainBatch, Trajectory


def rollout_records(batch: TrainBatch, trajs: list[Trajectory], results: list[RewardResult],
                    tokenizer) -> list[dict[str, Any]]:
    rows = []
    for i, (traj, res) in enumerate(zip(trajs, results)):
        n = len(traj.response_ids)
        keep = batch.attention_mask[i, :batch.prompt_len].bool()  # (P,) drop the left padding
        row = {
            "uid": traj.example.uid, "group": int(batch.group_ids[i]), "score": float(batch.scores[i]),
            "correct": bool(res.correct), "failed": bool(res.failed), "error": res.error,
            "prompt_ids": batch.input_ids[i, :batch.prompt_len][keep].tolist(),
            "response_ids": batch.responses[i, :n].tolist(),
            "response_mask": [int(m) for m in batch.response_mask[i, :n].tolist()],
            "advantages": [round(a, 5) for a in batch.advantages[i, :n].tolist()] if batch.advantages is not None
            else None,
            "turns": [list(t) for t in traj.turns],
            "prompt": tokenizer.decode(traj.prompt_ids, skip_special_tokens=True),
            "response": traj.response_text,
            "info": {k: v for k, v in traj.info.items() if isinstance(v, (str, int, float, bool, type(None)))},
        }
        rows.append(row)
    return rows
