"""RLEP experience replay (docs/algorithms/rlep.md): a pool of verified answers and its mixing into groups.

    entries = collect_pool(engine, runner, examples, samples=16, sampling=..., min_correct=2)  # credo rlep collect
    pool    = ReplayPool(entries)                 # or ReplayPool.load("pool.jsonl")
    rollouts = mix_replay(rollouts, pool, tokenizer, runner, num=2, rng=...)  # every step, after generation

Collection samples ``samples`` answers per training prompt from a checkpoint, keeps the verified-correct ones and
stores a prompt only when at least ``min_correct`` of its samples are correct (samples, not distinct texts: a task
with one right answer, like string reversal, stores the same text several times). Each stored answer is a JSONL
row with its provenance (the model, sampling settings, the sample's index, the time).

Mixing: each prompt's group of ``n`` fresh samples gets up to ``num`` (M) stored answers of that prompt, drawn
without replacement, re-tokenised with EOS and truncated to the response budget, scored by the same verifier;
the group's advantages are then normalised over all ``n + M'`` samples by the unchanged estimator. [derived]
The reference fills the slots of a prompt with fewer than M answers with empty responses that enter the group
as failures; credo's default adds only the answers that exist (``M' = min(M, stored)``), ``fill_missing=True``
reproduces the reference. Replayed rows are marked ``info["replay"]`` ("positive", "negative", "empty"); the
trainer recomputes their old log-probs with the current policy (ratio 1 at the first update), as the reference.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from credo.models.tokenizer import encode_response
from credo.types import Example, SamplingParams, Trajectory

log = logging.getLogger(__name__)

@dataclass
class ReplayEntry:
    """One stored answer of a training prompt."""

    uid: str  # the example's uid (the pool's key; the prompt text when the example has none)
    prompt: str
    response: str
    correct: bool
    score: float
    source: dict[str, Any] = field(default_factory=dict)  # provenance: model, sampling, sample index, time

    @property
    def key(self) -> str:
        return self.uid or self.prompt


def example_key(example: Example) -> str:
    return example.uid or example.prompt


class ReplayPool:
    """Stored answers per prompt, positives and negatives apart. ``max_per_prompt`` caps each list when answers
    are added during training (the oldest leave first)."""

    def __init__(self, entries: list[ReplayEntry] = (), *, max_per_prompt: int | None = None) -> None:
        self.max_per_prompt = max_per_prompt
        self._lists: dict[bool, dict[str, list[ReplayEntry]]] = {True: defaultdict(list), False: defaultdict(list)}
        self.added: list[ReplayEntry] = []  # entries added after construction (saved with checkpoints)
        self.bad_rows = 0  # malformed rows skipped by load()
        for e in entries:
            self._lists[e.correct][e.key].append(e)

    def __len__(self) -> int:
        return sum(len(v) for lists in self._lists.values() for v in lists.values())

    def prompts(self, *, correct: bool = True) -> int:
        return sum(1 for v in self._lists[correct].values() if v)

    def entries(self) -> list[ReplayEntry]:
        return [e for lists in self._lists.values() for v in lists.values() for e in v]

    def stored(self, key: str, *, correct: bool = True) -> list[ReplayEntry]:
        return list(self._lists[correct].get(key, ()))

    def draw(self, key: str, m: int, rng: random.Random, *, correct: bool = True) -> list[ReplayEntry]:
        """Up to ``m`` stored answers of the prompt, without replacement (all of them when there are at most m)."""
        stored = self._lists[correct].get(key, [])
        if m <= 0 or not stored:
            return []
        return list(stored) if len(stored) <= m else rng.sample(stored, m)

    def add(self, entries: list[ReplayEntry]) -> int:
        """Add answers (refresh during training); returns how many were added."""
        for e in entries:
            stored = self._lists[e.correct][e.key]
            stored.append(e)
            if self.max_per_prompt is not None and len(stored) > self.max_per_prompt:
                del stored[: len(stored) - self.max_per_prompt]
        self.added += entries
        return len(entries)

    # ------------------------------------------------------------------ files and checkpoints

    @classmethod
    def load(cls, path: str | Path, *, max_per_prompt: int | None = None) -> "ReplayPool":
        """Read a pool JSONL; malformed rows are skipped with a warning (counted in ``pool.bad_rows``)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"replay pool {path} does not exist (make one with `credo rlep collect`)")
        entries, bad = [], 0
        with path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    entries.append(entry_from_row(json.loads(line)))
                except (ValueError, TypeError, KeyError) as exc:
                    bad += 1
                    if bad <= 5:
                        log.warning("replay pool %s line %d skipped: %s", path, lineno, exc)
        if not entries:
            raise ValueError(f"replay pool {path} holds no valid rows ({bad} malformed)")
        pool = cls(entries, max_per_prompt=max_per_prompt)
        pool.bad_rows = bad
        return pool

    def save(self, path: str | Path) -> None:
        """Write every entry as JSONL (atomically: a temporary file renamed over the target)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w") as f:
            for e in self.entries():
                f.write(json.dumps(dataclasses.asdict(e)) + "\n")
        os.replace(tmp, path)

    def state_dict(self) -> dict[str, Any]:
        return {"added": [dataclasses.asdict(e) for e in self.added]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.add([entry_from_row(r) for r in state.get("added", [])])


def entry_from_row(row: dict[str, Any]) -> ReplayEntry:
    if not isinstance(row, dict):
        raise TypeError(f"a pool row must be a JSON object, got {type(row).__name__}")
    prompt, response = row["prompt"], row["response"]
    if not isinstance(prompt, str) or not isinstance(response, str):
        raise TypeError("prompt and response must be strings")
    uid = row.get("uid") or ""
    correct = row.get("correct", True)
    if not isinstance(correct, bool):
        raise TypeError(f"correct must be true or false, got {correct!r}")
    score = float(row.get("score", 1.0 if correct else 0.0))
    return ReplayEntry(str(uid), prompt, response, correct, score, dict(row.get("source") or {}))


# ====================================================================== collection

def collect_pool(engine, runner, examples: list[Example], *, samples: int, sampling: SamplingParams,
                 min_correct: int = 2, keep_negatives: bool = False, source: dict[str, Any] | None = None,
                 chunk_prompts: int = 64, on_chunk=None) -> tuple[list[ReplayEntry], dict[str, float]]:
    """Sample ``samples`` answers per example and keep the verified ones of every example with at least
    ``min_correct`` of them (and, with ``keep_negatives``, the failed answers of every example). Returns the
    entries and counts (prompts, stored prompts, answers, sampled accuracy)."""
    entries: list[ReplayEntry] = []
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    base = dict(source or {}) | {"samples": samples, "temperature": sampling.temperature, "top_p": sampling.top_p,
                                 "created": created}
    n_correct = n_total = kept_prompts = 0
    for start in range(0, len(examples), chunk_prompts):
        chunk = examples[start : start + chunk_prompts]
        trajs = engine.generate(chunk, samples, sampling)
        results = runner.score([t.response_text for t in trajs], [t.example for t in trajs])
        by_prompt: dict[int, list[tuple[int, Trajectory, Any]]] = defaultdict(list)
        for i, (t, r) in enumerate(zip(trajs, results)):
            by_prompt[t.group_id].append((i % samples, t, r))
        for rows in by_prompt.values():
            good = [(k, t, r) for k, t, r in rows if r.correct and not r.failed]
            n_correct += len(good)
            n_total += len(rows)
            keep = good if len(good) >= min_correct else []
            kept_prompts += bool(keep)
            if keep_negatives:
                keep = keep + [(k, t, r) for k, t, r in rows if not r.correct and not r.failed]
            entries += [ReplayEntry(t.example.uid, t.example.prompt, t.response_text, bool(r.correct), float(r.score),
                                    base | {"sample_index": k}) for k, t, r in keep]
        if on_chunk is not None:
            on_chunk(min(start + chunk_prompts, len(examples)), len(examples))
    stats = {"prompts": len(examples), "stored_prompts": kept_prompts,
             "stored_answers": sum(e.correct for e in entries), "stored_negatives": sum(not e.correct for e in entries),
             "sampled_accuracy": n_correct / max(n_total, 1)}
    return entries, stats


# ====================================================================== mixing into groups

@dataclass
class ReplayOptions:
    num: int = 2  # M positives per group
    negative: int = 0  # stored failures per group
    fill_missing: bool = False  # the reference's empty filler responses
    max_new_tokens: int = 16  # the response budget replayed answers are truncated to


def mix_replay(trajs: list[Trajectory], results: list, pool: ReplayPool, tokenizer, runner, *,
               opts: ReplayOptions, rng: random.Random) -> tuple[list[Trajectory], list, dict[str, float]]:
    """Each group's fresh samples followed by its replayed answers (scored by ``runner``); returns the mixed
    trajectories, their results and ``replay/*`` metrics."""
    groups: "OrderedDict[int, list[int]]" = OrderedDict()
    for i, t in enumerate(trajs):
        groups.setdefault(t.group_id, []).append(i)
    version = max((t.policy_version for t in trajs), default=0)
    extra: dict[int, list[Trajectory]] = {}
    short = 0
    for gid, rows in groups.items():
        first = trajs[rows[0]]
        key = example_key(first.example)
        chosen = [("positive", e) for e in pool.draw(key, opts.num, rng)]
        short += len(chosen) < opts.num
        if opts.fill_missing:
            chosen += [("empty", None)] * (opts.num - len(chosen))
        chosen += [("negative", e) for e in pool.draw(key, opts.negative, rng, correct=False)]
        extra[gid] = [replay_trajectory(first, kind, e, tokenizer, opts.max_new_tokens, version) for kind, e in chosen]
    new = [t for ts in extra.values() for t in ts]
    scored = runner.score([t.response_text for t in new], [t.example for t in new]) if new else []
    it = iter(scored)
    out_t, out_r = [], []
    for gid, rows in groups.items():
        out_t += [trajs[i] for i in rows] + extra[gid]
        out_r += [results[i] for i in rows] + [next(it) for _ in extra[gid]]
    positives = [(t, r) for t, r in zip(new, scored) if t.info["replay"] == "positive"]
    metrics = {"replay/samples": len(new), "replay/frac": len(new) / max(len(out_t), 1),
               "replay/per_group": len(new) / max(len(groups), 1), "replay/short_groups": short,
               "replay/empty": sum(t.info["replay"] == "empty" for t in new), "replay/pool_answers": len(pool)}
    if positives:  # stored answers the verifier still accepts (1.0 unless the reward changed since collection)
        metrics["replay/positive_accuracy"] = sum(r.correct for _, r in positives) / len(positives)
    return out_t, out_r, metrics


def replay_trajectory(fresh: Trajectory, kind: str, entry: ReplayEntry | None, tokenizer, max_new_tokens: int,
                      version: int) -> Trajectory:
    """A stored answer as a trajectory of ``fresh``'s prompt (an empty response for the reference's filler)."""
    ids = [] if entry is None else encode_response(tokenizer, entry.response)[:max_new_tokens]
    finish = "eos" if ids and ids[-1] == tokenizer.eos_token_id else "length"
    text = tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
    info = {"replay": kind} | ({"replay_source": entry.source} if entry is not None else {})
    return Trajectory(example=fresh.example, group_id=fresh.group_id, prompt_ids=list(fresh.prompt_ids),
                      response_ids=ids, rollout_logprobs=[0.0] * len(ids), response_mask=[1] * len(ids),
                      finish_reason=finish, response_text=text, info=info, policy_version=version)


def refresh_entries(trajs: list[Trajectory], results: list, *, step: int) -> list[ReplayEntry]:
    """The fresh samples the verifier accepted, as pool entries (the pool refresh during training)."""
    return [ReplayEntry(t.example.uid, t.example.prompt, t.response_text, True, float(r.score),
                        {"refresh_step": step, "policy_version": t.policy_version})
            for t, r in zip(trajs, results) if r.correct and not r.failed and "replay" not in t.info]


def replay_rows(trajs: list[Trajectory]) -> torch.Tensor:
    """(B,) bool: the rows that were replayed, not sampled."""
    return torch.tensor(["replay" in t.info for t in trajs], dtype=torch.bool)


def step_rng(seed: int, step: int) -> random.Random:
    """The draw of step ``step``: a function of (seed, step) only, so a resumed run replays the same answers."""
    return random.Random(f"credo/replay/{seed}/{step}")
