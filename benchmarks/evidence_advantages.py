"""Derived evidence for EVPO, PAPO and the noise-robust critics (docs/algorithms/{evpo,papo,dvpo,vrpo,dfpo}.md,
"Evidence"), from the runs of ``credo compare`` over docs/evidence/specs/{evpo_gate,papo_polarity,critic_noise_*}.yaml,
in credo compare's JSON shape (``credo.report.stats.write_compare_json``).

    python benchmarks/evidence_advantages.py --runs runs/evidence --out-dir docs/evidence/data

Each file's numbers are one value per seed (seed k of every "arm" comes from the same run or, for the noise drop,
from the same seed's two runs), summarised by ``credo.report.stats.metric_block`` (mean, bootstrap 95% interval,
paired difference to the baseline):

- ``evpo_gate_agreement.json`` (the ``evpo`` arm of evpo_gate): per seed, the share of steps whose gate used the
  critic (``evpo/use_critic``) among the steps whose explained variance was positive, and among the others. The
  explained variance is the step's own ``critic/vf_explained_var`` (credo.recipes.step.step_metrics, computed from
  the batch after the estimator ran, the same formula and eps as the gate's), so the agreement is checked against
  a number the gate did not write. ``extra.agreement`` holds the per-seed share of steps with
  ``use_critic == (EV > 0)`` and the step counts.
- ``evpo_resid_var.json`` (the ``evpo`` arm): per seed, the mean over steps of the residual variance
  Var(return - baseline) over loss tokens for the baseline the gate chose (baseline arm ``chosen``) and for each
  baseline it could have used on the same batches: ``critic`` (PPO's), ``batch`` (the batch mean, EV's reference)
  and ``group`` (GRPO's group mean).
- ``papo_expand_share.json`` (the ``papo`` arm of papo_polarity): per seed, the share of the advantage mass
  sum|A| on entropy-expanding tokens (polarity P > 0) before (``base``) and after (``papo``) the reweighting,
  averaged over the steps whose entropy phase was negative (entropy below its start: the paper's collapse phase)
  and, as a second metric, over those where it was positive.
- ``critic_noise_drop.json`` (critic_noise_0 and critic_noise_40): per arm and seed, the held-out greedy accuracy
  at noise 0 minus at noise 0.4 (``eval/greedy_acc@final``; same seed = same data order and initial weights), and
  the same for the clean training accuracy ``acc/mean@last:0.5``; baseline ``ppo``.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Callable

from credo.recipes.compare import arm_rows
from credo.report.stats import metric_block, write_compare_json

COMMAND = "python benchmarks/evidence_advantages.py --runs runs/evidence --out-dir docs/evidence/data"


def arm_runs(runs: Path, spec: str, arm: str) -> dict[int, list[dict]]:
    return arm_rows(runs / spec, arm)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def per_seed(rows_by_seed: dict[int, list[dict]], fn: Callable[[list[dict]], float]) -> list[float]:
    return [fn(rows) for _, rows in sorted(rows_by_seed.items())]


def evpo_files(runs: Path, out_dir: Path) -> None:
    rows_by_seed = arm_runs(runs, "evpo_gate", "evpo")
    seeds = sorted(rows_by_seed)

    def steps(rows):
        return [r for r in rows if "evpo/use_critic" in r and "critic/vf_explained_var" in r]

    def share(rows, positive: bool):
        picked = [r["evpo/use_critic"] for r in steps(rows) if (r["critic/vf_explained_var"] > 0) == positive]
        return mean(picked)

    agreement = per_seed(rows_by_seed, lambda rows: mean([float((r["critic/vf_explained_var"] > 0)
                                                                == (r["evpo/use_critic"] == 1.0))
                                                          for r in steps(rows)]))
    counts = {str(s): {"steps": len(steps(rows_by_seed[s])),
                       "ev_positive": sum(r["critic/vf_explained_var"] > 0 for r in steps(rows_by_seed[s]))}
              for s in seeds}
    pos = per_seed(rows_by_seed, lambda rows: share(rows, True))
    neg = per_seed(rows_by_seed, lambda rows: share(rows, False))
    kept = [i for i, (a, b) in enumerate(zip(pos, neg)) if not (math.isnan(a) or math.isnan(b))]
    write_compare_json(
        out_dir / "evpo_gate_agreement.json", name="evpo_gate_agreement", command=COMMAND, baseline="ev_nonpositive",
        seeds=[seeds[i] for i in kept],
        metrics={"use_critic_share": {"key": "evpo/use_critic", "reduce": "mean over steps of the EV class",
                                      **metric_block({"ev_positive": [pos[i] for i in kept],
                                                      "ev_nonpositive": [neg[i] for i in kept]}, "ev_nonpositive")}},
        extra={"source": "runs/evidence/evpo_gate/evpo/seed<k>/metrics.jsonl",
               "agreement": dict(zip(map(str, seeds), agreement)), "counts": counts})

    kinds = ("chosen", "critic", "batch", "group")
    values = {k: per_seed(rows_by_seed, lambda rows, k=k: mean([r[f"evpo/resid_var_{k}"] for r in rows
                                                                if f"evpo/resid_var_{k}" in r])) for k in kinds}
    picked = per_seed(rows_by_seed, lambda rows: mean([r["evpo/picked_lower"] for r in rows
                                                       if "evpo/picked_lower" in r]))
    write_compare_json(
        out_dir / "evpo_resid_var.json", name="evpo_resid_var", command=COMMAND, baseline="chosen", seeds=seeds,
        metrics={"resid_var@mean": {"key": "evpo/resid_var_<baseline>", "reduce": "mean",
                                    **metric_block(values, "chosen")}},
        extra={"source": "runs/evidence/evpo_gate/evpo/seed<k>/metrics.jsonl",
               "picked_lower_share": dict(zip(map(str, seeds), picked))})


def papo_file(runs: Path, out_dir: Path) -> None:
    rows_by_seed = arm_runs(runs, "papo_polarity", "papo")
    seeds = sorted(rows_by_seed)
    metrics, counts = {}, {}
    for phase, test in (("falling", lambda p: p < 0), ("rising", lambda p: p > 0)):
        sel = {s: [r for r in rows if "papo/phase" in r and test(r["papo/phase"])] for s, rows in rows_by_seed.items()}
        counts[phase] = {str(s): len(v) for s, v in sel.items()}
        vals = {"base": [mean([r["papo/expand_share_base"] for r in sel[s]]) for s in seeds],
                "papo": [mean([r["papo/expand_share"] for r in sel[s]]) for s in seeds]}
        kept = [i for i in range(len(seeds)) if not math.isnan(vals["base"][i])]
        if len(kept) >= 2:
            metrics[f"expand_share@{phase}_entropy_steps"] = {
                "key": "papo/expand_share", "reduce": f"mean over steps with phase {'< 0' if phase == 'falling' else '> 0'}",
                "seeds": [seeds[i] for i in kept],
                **metric_block({k: [v[i] for i in kept] for k, v in vals.items()}, "base")}
    write_compare_json(out_dir / "papo_expand_share.json", name="papo_expand_share", command=COMMAND,
                       baseline="base", seeds=seeds, metrics=metrics,
                       extra={"source": "runs/evidence/papo_polarity/papo/seed<k>/metrics.jsonl", "steps": counts})


def noise_file(runs: Path, out_dir: Path) -> None:
    clean = json.loads((runs / "critic_noise_0" / "compare.json").read_text())
    levels = [(lvl, json.loads((runs / f"critic_noise_{tag}" / "compare.json").read_text()))
              for lvl, tag in (("0.2", "20"), ("0.4", "40")) if (runs / f"critic_noise_{tag}" / "compare.json").is_file()]
    seeds = [s for s in clean["seeds"] if all(s in noisy["seeds"] for _, noisy in levels)]
    metrics = {}
    for level, noisy in levels:
        for mid in ("eval/greedy_acc@final", "acc/mean@last:0.5"):
            drops = {}
            for arm in clean["metrics"][mid]["arms"]:
                a = dict(zip(clean["seeds"], clean["metrics"][mid]["arms"][arm]["values"]))
                b = dict(zip(noisy["seeds"], noisy["metrics"][mid]["arms"][arm]["values"]))
                drops[arm] = [a[s] - b[s] for s in seeds]
            metrics[f"drop_0_to_{level}/{mid}"] = {"key": mid, "reduce": f"value at noise 0 minus value at noise {level}",
                                                   **metric_block(drops, "ppo")}
    write_compare_json(out_dir / "critic_noise_drop.json", name="critic_noise_drop", command=COMMAND,
                       baseline="ppo", seeds=seeds, metrics=metrics,
                       extra={"source": "runs/evidence/critic_noise_{0,20,40}/compare.json (those present)"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=Path("runs/evidence"))
    ap.add_argument("--out-dir", type=Path, default=Path("docs/evidence/data"))
    ap.add_argument("--only", default="evpo,papo,noise", help="comma-separated: evpo, papo, noise")
    args = ap.parse_args()
    parts = {"evpo": evpo_files, "papo": papo_file, "noise": noise_file}
    for name in args.only.split(","):
        parts[name](args.runs, args.out_dir)
        print(f"{name}: written to {args.out_dir}")


if __name__ == "__main__":
    main()
