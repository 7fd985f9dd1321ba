"""Preference pairs for reward-model training: from JSONL files or generated from a built-in task.

A file row is ``{"prompt": ..., "chosen": ..., "rejected": ...}``; a row missing a field, with a non-string
field, or with ``chosen == rejected`` is skipped and reported (``BadRow``), never fatal.

Generated pairs (:func:`generate_pairs`): for each task example the chosen response is its correct answer and
the rejected one a corrupted copy (two characters swapped, one replaced, one dropped or one added) that the task's
verifier scores as wrong. ``noise`` swaps chosen and rejected on that fraction of the *training* pairs
(``flipped=True`` records which, so a filter's precision can be measured); held-out pairs are never flipped.
"""
from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass, replace
from pathlib import Path

from credo.data.files import DEFAULT_MAX_ROW_BYTES, BadRow, iter_lines, row_too_long
from credo.data.tasks import build_splits, get_task
from credo.rewards import get_reward_fn
from credo.types import Example


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str
    flipped: bool = False  # generated with label noise: ``chosen`` is the wrong response


def load_pairs(path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
               ) -> tuple[list[PreferencePair], list[BadRow]]:
    """Pairs from a JSONL file; malformed rows and rows over ``max_row_bytes`` are skipped and returned as bad rows
    (an oversized line is never read whole)."""
    pairs, bad = [], []
    with open(path, "rb") as f:
        for line_no, (line, size) in enumerate(iter_lines(f, max_row_bytes), 1):
            if line is None:
                bad.append(BadRow(str(path), line_no, row_too_long(size, max_row_bytes)))
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
                fields = [row.get(k) for k in ("prompt", "chosen", "rejected")] if isinstance(row, dict) else None
                if fields is None or not all(isinstance(v, str) for v in fields):
                    raise ValueError("needs string fields prompt, chosen, rejected")
                if fields[1] == fields[2]:
                    raise ValueError("chosen and rejected are the same response")
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                bad.append(BadRow(path=str(path), line=line_no, reason=str(exc)))
                continue
            pairs.append(PreferencePair(*fields))
    if not pairs:
        raise ValueError(f"{path}: no usable preference pairs ({len(bad)} bad rows)")
    return pairs, bad


def corrupt(answer: str, rng: random.Random, alphabet: str) -> str:
    """A different string near ``answer``: two characters swapped, one replaced, one dropped, or one added."""
    for _ in range(100):
        s = list(answer)
        kind = rng.choice(("swap", "replace", "drop", "add") if len(s) > 1 else ("replace", "add"))
        i = rng.randrange(len(s))
        if kind == "swap":
            j = rng.randrange(len(s))
            s[i], s[j] = s[j], s[i]
        elif kind == "replace":
            s[i] = rng.choice(alphabet)
        elif kind == "drop":
            del s[i]
        else:
            s.insert(i, rng.choice(alphabet))
        out = "".join(s)
        if out != answer:
            return out
    raise ValueError(f"could not corrupt {answer!r}")


def generate_pairs(task: str, params: dict, *, train_size: int, eval_size: int, seed: int,
                   noise: float = 0.0) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train pairs, held-out pairs) from a built-in task; see the module docstring."""
    t = get_task(task, **params)
    train, held_out = build_splits(t, train_size=train_size, eval_size=eval_size, seed=seed)
    verify = get_reward_fn(t.default_reward)
    rng = random.Random(seed * 7 + 1)

    def pair(ex: Example) -> PreferencePair:
        chosen = t.demonstration(ex)
        # corrupt with the answer's own characters, so no foreign character gives a wrong answer away
        alphabet = "".join(sorted(set(chosen))) + (string.digits if chosen.isdigit() else "")
        while True:
            rejected = corrupt(chosen, rng, alphabet)
            if _score(verify, rejected, ex) < _score(verify, chosen, ex):
                return PreferencePair(ex.prompt, chosen, rejected)

    train_pairs = [pair(ex) for ex in train]
    flip = set(rng.sample(range(len(train_pairs)), round(noise * len(train_pairs))))
    train_pairs = [replace(p, chosen=p.rejected, rejected=p.chosen, flipped=True) if i in flip else p
                   for i, p in enumerate(train_pairs)]
    return train_pairs, [pair(ex) for ex in held_out]


def _score(verify, response: str, ex: Example) -> float:
    return float(verify(response, ex).score)


def preference_data(cfg) -> tuple[list[PreferencePair], list[PreferencePair], list]:
    """(training pairs, held-out pairs, bad rows) of a ``credo rm train`` config: from ``rm.train_file`` /
    ``rm.eval_file`` or generated."""
    r = cfg.rm
    if r.train_file is None:
        train, held_out = generate_pairs(cfg.task.name, cfg.task.params, train_size=r.pairs,
                                         eval_size=r.eval_pairs, seed=cfg.seed, noise=r.noise)
        return train, held_out, []
    train, bad = load_pairs(r.train_file)
    if r.eval_file is not None:
        held_out, bad_eval = load_pairs(r.eval_file)
        return train, held_out, bad + bad_eval
    shuffled = random.Random(cfg.seed).sample(train, len(train))
    n_eval = max(1, len(train) // 10)
    return shuffled[n_eval:], shuffled[:n_eval], bad
