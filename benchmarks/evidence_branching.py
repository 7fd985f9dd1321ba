"""Derived evidence for ARPO / AEPO branching (docs/agents.md, "ARPO and AEPO branching rollouts", "Evidence"), from
the runs of ``credo compare docs/evidence/specs/arpo_branching.yaml --out runs/evidence/arpo_branching``, in credo
compare's JSON shape (``credo.report.stats.write_compare_json``).

    python benchmarks/evidence_branching.py --runs runs/evidence --out-dir docs/evidence/data

Every value is one number per seed: the mean over the run's training steps of a per-step ``agent/branch/*`` metric
(credo.rollout.branching.decision_stats), steps where it is undefined (no decision of that kind) left out. The
"arms" of a file are the two kinds of branch decision of the same runs (paired by seed), so the paired difference
is branched minus unbranched within one method:

- ``<method>_branch_entropy.json`` (method arpo or aepo): the segment entropy H_t (``entropy@mean``), the entropy
  change since the episode's first segment dH = H_t - H_init (``dH@mean``, what ARPO's branch probability
  clip(0.5 + 0.2 dH, 0, 1) reads) and the share above the step's median H_t (``above_median@mean``), at the
  decisions that branched (arm ``branched``) and at those that did not (baseline ``unbranched``).
- ``aepo_consecutive.json``: the share of branching decisions taken by an episode that also branched in the
  previous round (``agent/branch/consecutive_share``), AEPO's arm against ARPO's (baseline ``arpo``): what AEPO's
  consecutive-branch penalty is meant to lower.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from credo.recipes.compare import arm_rows
from credo.report.series import reduce_series
from credo.report.stats import metric_block, write_compare_json

COMMAND = "python benchmarks/evidence_branching.py --runs runs/evidence --out-dir docs/evidence/data"
SPEC = "arpo_branching"


def arm_runs(runs: Path, arm: str) -> dict[int, list[dict]]:
    return arm_rows(runs / SPEC, arm)


def step_mean(rows: list[dict], key: str) -> float:
    """The mean over the steps that logged ``key`` (credo.report.series)."""
    return reduce_series(rows, key, "mean")


def entropy_file(runs: Path, out_dir: Path, method: str) -> None:
    by_seed = arm_runs(runs, method)
    seeds = sorted(by_seed)
    metrics = {}
    for name, key in (("entropy", "entropy"), ("dH", "dH"), ("above_median", "above_median")):
        vals = {kind: [step_mean(by_seed[s], f"agent/branch/{key}_{kind}") for s in seeds]
                for kind in ("unbranched", "branched")}
        metrics[f"{name}@mean"] = {"key": f"agent/branch/{key}_<kind>", "reduce": "mean over steps",
                                   **metric_block(vals, "unbranched")}
    decisions = {str(s): sum(r.get("agent/branch/decisions", 0) for r in by_seed[s]) for s in seeds}
    branches = {str(s): sum(r.get("agent/branch/branches", 0) for r in by_seed[s]) for s in seeds}
    write_compare_json(out_dir / f"{method}_branch_entropy.json", name=f"{method}_branch_entropy", command=COMMAND,
                       baseline="unbranched", seeds=seeds, metrics=metrics,
                       extra={"source": f"runs/evidence/{SPEC}/{method}/seed<k>/metrics.jsonl",
                              "decisions": decisions, "branches": branches})


def consecutive_file(runs: Path, out_dir: Path) -> None:
    arms = {arm: arm_runs(runs, arm) for arm in ("arpo", "aepo")}
    seeds = sorted(arms["arpo"])
    vals = {arm: [step_mean(arms[arm][s], "agent/branch/consecutive_share") for s in seeds] for arm in arms}
    write_compare_json(out_dir / "aepo_consecutive.json", name="aepo_consecutive", command=COMMAND, baseline="arpo",
                       seeds=seeds,
                       metrics={"consecutive_share@mean": {"key": "agent/branch/consecutive_share",
                                                          "reduce": "mean over steps", **metric_block(vals, "arpo")}},
                       extra={"source": f"runs/evidence/{SPEC}/<arm>/seed<k>/metrics.jsonl"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=Path("runs/evidence"))
    ap.add_argument("--out-dir", type=Path, default=Path("docs/evidence/data"))
    args = ap.parse_args()
    for method in ("arpo", "aepo"):
        entropy_file(args.runs, args.out_dir, method)
    consecutive_file(args.runs, args.out_dir)
    print(f"written to {args.out_dir}")


if __name__ == "__main__":
    main()
