"""log.mechanism through the real CLI: the mech/* keys are logged for any policy loss, PPO-clip's clipped tokens carry
exactly no gradient while GPPO's carry some, and switching the diagnostics on changes nothing else
(credo.algo.diagnostics, docs/algorithms/README.md "Mechanism diagnostics")."""
from __future__ import annotations

from pathlib import Path

from credo.cli.main import main
from credo.tracking.metrics import read_metrics
from tests.conftest import TINY_RUN

# four mini-batches per step at a large learning rate, so that ratios leave the 0.2 window; a dense reward that a
# random model does not saturate (digit_share, below), so that every step has groups with distinct scores
ARGS = [*TINY_RUN, "train.steps=4", "eval.every=0", "log.report=false", "log.tensorboard=false",
        "train.mini_batch_size=4", "train.lr=0.02", "reward.name=tests.train.test_mechanism:digit_share"]
KEYS = ("mech/clip_frac", "mech/grad_share_clipped", "mech/grad_share_clipped_pos", "mech/grad_share_clipped_neg",
        "mech/drift", "mech/drift_high_entropy", "mech/drift_low_entropy", "mech/grad_share_pos_highprob",
        "mech/pos_highprob_frac")


def digit_share(response: str, example, **_: object) -> float:
    """The share of digits in the response: a dense score with distinct values within a group."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)


def _run(tmp_path: Path, name: str, *extra: str) -> list[dict]:
    assert main(["-q", "train", "--run-dir", str(tmp_path / name), *ARGS, *extra]) == 0
    return [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["step"] > 0]


def _updated(rows: list[dict]) -> list[dict]:
    """The steps with a nonzero advantage somewhere (a group whose scores differ), so a policy gradient."""
    return [r for r in rows if r["frac_reward_zero_std"] < 1.0]


def _volatile(k: str) -> bool:
    return k.startswith(("timing_s/", "perf/tokens_per_s", "perf/gen_tokens_per_s", "mech/"))


def test_mechanism_keys_ppo_zero_clipped_gradient_gppo_positive(tmp_path: Path):
    grpo = _run(tmp_path, "grpo", "algo.policy_loss=ppo", "log.mechanism=true")
    gppo = _run(tmp_path, "gppo", "algo.policy_loss=gppo", "log.mechanism=true")
    for rows in (_updated(grpo), _updated(gppo)):
        assert len(rows) >= 3
        for key in KEYS:
            assert all(key in r for r in rows), key
        assert all(0.0 <= r["mech/grad_share_clipped"] <= 1.0 for r in rows)
        assert all(r["mech/drift"] > 0 for r in rows)  # later mini-batches see a moved policy
    # tokens do leave the window on the pessimistic side, in both runs ...
    assert max(r["mech/clip_frac"] for r in grpo) > 0 and max(r["mech/clip_frac"] for r in gppo) > 0
    # ... PPO-clip (0.2 / 0.2, the reference window) gives them exactly no gradient
    assert all(r["mech/grad_share_clipped"] == 0.0 for r in _updated(grpo))
    # ... GPPO keeps a gradient of weight 1 + 0.28 / 1 - 0.2 on each of them: a positive share wherever there are any
    assert all(r["mech/grad_share_clipped"] > 0 for r in _updated(gppo) if r["mech/clip_frac"] > 0)
    # off (the default): no mech/* key, and the same run otherwise, metric for metric
    off = _run(tmp_path, "off", "algo.policy_loss=ppo")
    assert not any(k.startswith("mech/") for r in off for k in r)
    strip = [{k: v for k, v in r.items() if not _volatile(k)} for r in grpo]
    assert strip == [{k: v for k, v in r.items() if not _volatile(k)} for r in off]
