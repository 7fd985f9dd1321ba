"""Held-out evaluation: greedy accuracy and sampled avg@k / pass@k."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from credo.tracking.atomic import atomic_write_text
from credo.types import Example, RewardResult, SamplingParams, Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` of ``n`` samples correct (Chen et al. 2021):
    ``1 - C(n - c, k) / C(n, k)``, the chance that ``k`` of the ``n`` samples drawn without replacement hold a
    correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(engine, runner, examples: list[Example], *, k: int, temperature: float, max_new_tokens: int,
             seed: int, samples_path: Path | None = None, pass_k: Sequence[int] = ()) -> dict[str, float]:
    """Metrics ``eval/greedy_acc``, ``eval/avg@k`` (mean correctness of k samples), ``eval/pass@k``, and
    ``eval/pass@j`` for each ``j`` in ``pass_k`` (``eval.pass_k``; each <= k): :func:`pass_at_k` over the same
    ``k`` samples, averaged over the problems (``pass@k`` itself is that estimator at ``j = k``).

    Sampling uses its own ``seed`` so evaluating never moves the training sampler's RNG. If
    ``samples_path`` is given, the greedy responses are written there as JSONL for inspection.
    """
    bad = [j for j in pass_k if isinstance(j, bool) or not isinstance(j, int) or not 1 <= j <= k]
    if bad:
        raise ValueError(f"eval.pass_k: each entry must be an int in [1, eval.k={k}], got {bad[0]!r}")
    greedy = engine.generate(examples, 1, SamplingParams(greedy=True, max_new_tokens=max_new_tokens))
    greedy_res = score(runner, greedy)
    sampled = engine.generate(examples, k, SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                                                          seed=seed))
    sampled_res = score(runner, sampled)
    correct = [r.correct for r in sampled_res]
    per_prompt = [any(correct[i * k : (i + 1) * k]) for i in range(len(examples))]
    if samples_path is not None:
        _write_samples(samples_path, greedy, greedy_res)
    n = max(len(examples), 1)
    counts = [sum(correct[i * k : (i + 1) * k]) for i in range(len(examples))]
    return {
        "eval/greedy_acc": sum(r.correct for r in greedy_res) / n,
        f"eval/avg@{k}": sum(correct) / max(len(correct), 1),
        f"eval/pass@{k}": sum(per_prompt) / n,
        **{f"eval/pass@{j}": sum(pass_at_k(k, c, j) for c in counts) / n for j in sorted(set(pass_k)) if j != k},
        "eval/reward_mean": sum(r.score for r in sampled_res) / max(len(sampled_res), 1),
        "eval/response_length": sum(len(t.response_ids) for t in greedy) / n,
    }


def score(runner, trajs: list[Trajectory]) -> list[RewardResult]:
    return runner.score([t.response_text for t in trajs], [t.example for t in trajs])


def _write_samples(path: Path, trajs: list[Trajectory], results: list[RewardResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = [
        {"uid": t.example.uid, "prompt": t.example.prompt, "answer": t.example.answer, "response": t.response_text,
         "score": r.score, "correct": r.correct, "finish_reason": t.finish_reason}
        for t, r in zip(trajs, results)
    ]
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))  # replaces a link, never follows it
