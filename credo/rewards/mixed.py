"""Combining and corrupting rewards: a weighted mixture of verifiers, and reward noise for robustness experiments.

:class:`MixedRunner` scores a batch with every component runner (each with its own executor, so a process-isolated
verifier stays isolated) and returns ``score = sum_k w_k s_k``. The first component is the task's verifier: its
``correct`` flag is the result's (accuracy metrics stay verifiable when a reward model is mixed in); a result is
``failed`` when any component failed. ``info["components"]`` holds each component's score. A weighted sum that is not
finite (a component's NaN, inf or None score is already a failure, but ``w * s`` can overflow) is a failure with the
failure score (``error="non-finite score: inf (weighted sum)"``).

:class:`NoisyRunner` corrupts a share ``rate`` of the *training* rewards (evaluation keeps the clean runner):
``flip`` maps ``s -> 2c - s`` around ``center`` (for 0/1 rewards with c = 0.5: 1 - s), ``perturb`` adds
``N(0, std^2)``. Which responses are corrupted is a hash of (seed, step, example uid, response text, occurrence),
so it does not depend on how the batch was split into scoring calls and a resumed run corrupts the same ones.
``correct`` is left as the verifier said (it is what the metrics report); ``info["noised"]`` marks the corrupted.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from typing import Any, Sequence

from credo.rewards.runner import NONFINITE, finite_result
from credo.types import Example, RewardResult


class MixedRunner:
    """Weighted sum of several runners' scores (module docstring)."""

    def __init__(self, components: list[tuple[str, float, Any]], *, failure_score: float | None = None):
        if not components:
            raise ValueError("MixedRunner needs at least one component")
        self.components = components  # (name, weight, runner)
        # None: the first component runner's failure score
        self.failure_score = float(getattr(components[0][2], "failure_score", 0.0) if failure_score is None
                                   else failure_score)

    def score(self, responses: Sequence[str], examples: Sequence[Example]) -> list[RewardResult]:
        per = [(name, w, [finite_result(r, self.failure_score) for r in runner.score(responses, examples)])
               for name, w, runner in self.components]
        out = []
        for i in range(len(responses)):
            parts = [(name, w, res[i]) for name, w, res in per]
            main = parts[0][2]
            failed = [r for _, _, r in parts if r.failed]
            info = {**main.info, "components": {**main.info.get("components", {}),
                                                **{name: r.score for name, _, r in parts}}}
            score, errors = sum(w * r.score for _, w, r in parts), [r.error for r in failed]
            if not math.isfinite(score):  # float overflow gives inf (or inf - inf = nan), never an exception
                score, errors = self.failure_score, errors + [f"{NONFINITE}: {score!r} (weighted sum)"]
            out.append(RewardResult(score=score, correct=main.correct, failed=bool(errors), error="; ".join(errors),
                                    info=info))
        return out

    def close(self) -> None:
        for _, _, runner in self.components:
            runner.close()

    def __enter__(self) -> "MixedRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def noise_draw(*key: Any) -> float:
    """A uniform [0, 1) number from a hash of ``key`` (stable across processes and runs)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64


class NoisyRunner:
    """Corrupts a share of a runner's scores (module docstring). One instance per training step."""

    def __init__(self, runner: Any, *, rate: float, mode: str = "flip", center: float = 0.5, std: float = 1.0,
                 seed: int = 0, step: int = 0):
        if mode not in ("flip", "perturb"):
            raise ValueError(f"reward noise mode must be flip or perturb, got {mode!r}")
        self.runner, self.rate, self.mode, self.center, self.std = runner, rate, mode, center, std
        self.seed, self.step = seed, step
        self.seen: Counter = Counter()  # (uid, text) -> occurrences so far this step

    def score(self, responses: Sequence[str], examples: Sequence[Example]) -> list[RewardResult]:
        results = self.runner.score(responses, examples)
        out = []
        for text, ex, res in zip(responses, examples, results):
            key = (ex.uid or ex.prompt, text)
            n = self.seen[key]
            self.seen[key] += 1
            if res.failed or noise_draw(self.seed, self.step, *key, n, "pick") >= self.rate:
                out.append(res)
                continue
            if self.mode == "flip":
                score = 2.0 * self.center - res.score
            else:  # Box-Muller from two more hashed uniforms
                u1 = max(noise_draw(self.seed, self.step, *key, n, "u1"), 1e-12)
                u2 = noise_draw(self.seed, self.step, *key, n, "u2")
                score = res.score + self.std * math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
            out.append(dataclasses.replace(res, score=score, info={**res.info, "noised": True,
                                                                   "clean_score": res.score}))
        return out
