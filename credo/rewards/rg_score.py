"""``rg_score``: a reasoning-gym dataset's own verifier, for ``task.name=rg:<dataset>`` (``docs/tasks.md``).

The example carries ``meta["rg"] = {"dataset", "config", "entry"}`` (:mod:`credo.data.reasoning_gym_task`); the
score is ``dataset.score_answer(answer=extracted, entry=entry)`` (a float in [0, 1]; 1 counts as correct). The
dataset object is rebuilt from its name and config once per worker process and cached.

What is passed as the answer (verifier keyword ``answer``, ``reward.kwargs.answer``):

- ``tag_or_text`` (default): the last ``<answer>...</answer>`` of the response (reasoning-gym's ``extract_answer``,
  stripped) when there is one, else the whole response stripped. Fits both credo's small models, which answer
  bare, and instruct models prompted with reasoning-gym's system prompts, which answer in tags.
- ``tag``: reasoning-gym's own evaluation: the last ``<answer>`` tag, None (score 0) without one.
- ``text``: the whole response, stripped.

``tag`` names another tag (``reward.kwargs.tag=final``). reasoning_gym is imported in the worker on first use.
"""
from __future__ import annotations

import json
from typing import Any

from credo.rewards.registry import register_reward
from credo.types import Example, RewardResult

ANSWER_MODES = ("tag_or_text", "tag", "text")


_DATASETS: dict[str, Any] = {}  # (dataset, config) key -> dataset object, per worker process
_MAX_CACHED = 64


def _dataset(name: str, config: dict[str, Any]):
    """The reasoning-gym dataset object that scores ``name`` entries generated with ``config`` (cached)."""
    from credo.data.reasoning_gym_task import _rg

    key = json.dumps([name, config], sort_keys=True, default=repr)
    if key not in _DATASETS:
        if len(_DATASETS) >= _MAX_CACHED:
            _DATASETS.clear()
        _DATASETS[key] = _rg().create_dataset(name, **config, seed=0, size=1)
    return _DATASETS[key]


def extract(response: str, mode: str = "tag_or_text", tag: str = "answer") -> str | None:
    """The answer text of ``response`` under ``mode`` (see the module docstring)."""
    if mode not in ANSWER_MODES:
        raise ValueError(f"rg_score: answer must be one of {', '.join(ANSWER_MODES)}, got {mode!r}")
    if mode == "text":
        return response.strip()
    from reasoning_gym.utils import extract_answer

    found = extract_answer(response, tag_name=tag)
    if found is None and mode == "tag_or_text":
        return response.strip()
    return found


@register_reward("rg_score")
def rg_score(response: str, example: Example, *, answer: str = "tag_or_text", tag: str = "answer") -> RewardResult:
    """reasoning-gym's ``score_answer`` of the extracted answer (``answer``: tag_or_text | tag | text)."""
    spec = example.meta.get("rg")
    if not isinstance(spec, dict) or not {"dataset", "config", "entry"} <= set(spec):
        raise ValueError("rg_score needs meta['rg'] = {dataset, config, entry} (a task.name=rg:<dataset> example)")
    extracted = extract(response, answer, tag)
    dataset = _dataset(spec["dataset"], spec["config"])
    score = float(dataset.score_answer(answer=extracted, entry=spec["entry"]))
    return RewardResult(score=score, correct=score >= 1.0, info={"extracted": (extracted or "")[:200]})
