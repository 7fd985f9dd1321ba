"""``credo compare``: run several presets over several seeds on the same task and tabulate them.

Every run is a normal ``credo train`` run directory under ``OUT/<preset>/seed<k>`` (finished runs are
reused, so an interrupted comparison continues where it stopped). The table reports, per preset,
the final held-out greedy accuracy and avg@k (mean +- std over seeds), the first evaluation step at
which greedy accuracy reached ``target`` (mean over the seeds that reached it), the policy entropy
at the end, and the wall time. Written to ``OUT/compare.md``, ``OUT/compare.json`` and one figure,
``OUT/compare.png``.
"""
from __future__ import annotations

import json
import logging
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from credo.config import load_run_config
from credo.recipes.rlvr import train
from credo.tracking.metrics import read_metrics

log = logging.getLogger(__name__)


@dataclass
class Row:
    preset: str
    seeds: int
    greedy_acc: float
    greedy_acc_std: float
    avg_at_k: float
    avg_at_k_std: float
    start_greedy_acc: float
    steps_to_target: float | None  # mean over the seeds that reached the target
    reached: int  # how many seeds reached the target
    final_entropy: float
    wall_s: float


def compare(presets: list[str], seeds: list[int], *, out_dir: Path, overrides: list[str] = (),
            target: float = 0.6) -> Path:
    out_dir = Path(out_dir)
    for preset in presets:  # validate every preset before spending minutes on the first
        load_run_config(preset, list(overrides))
    for preset in presets:
        for seed in seeds:
            run_dir = out_dir / label(preset) / f"seed{seed}"
            if (run_dir / "summary.json").is_file():
                log.info("reusing finished run %s", run_dir)
                continue
            log.info("compare: %s seed %d -> %s", preset, seed, run_dir)
            cfg = load_run_config(preset, [*overrides, f"seed={seed}", "log.report=false"])
            resume = (run_dir / "checkpoints" / "latest").is_file()  # else a crash before the first checkpoint:
            train(cfg, run_dir=run_dir, resume=resume, overwrite=not resume)  # start that run again, cleanly
    rows = [summarize(out_dir, preset, seeds, target) for preset in presets]
    write_outputs(out_dir, rows, presets, seeds, target, list(overrides))
    return out_dir


def label(preset: str) -> str:
    """A preset's name in the table and its runs' directory: the preset, or a YAML file's stem."""
    return Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset


def summarize(out_dir: Path, preset: str, seeds: list[int], target: float) -> Row:
    finals, avgs, starts, hits, ents, walls = [], [], [], [], [], []
    for seed in seeds:
        run_dir = out_dir / label(preset) / f"seed{seed}"
        summary = json.loads((run_dir / "summary.json").read_text())
        rows = read_metrics(run_dir / "metrics.jsonl")
        finals.append(summary["final/eval/greedy_acc"])
        avgs.append(next(v for k, v in summary.items() if k.startswith("final/eval/avg@")))
        starts.append(summary["start/eval/greedy_acc"])
        walls.append(summary.get("train_wall_s", 0.0))
        reached = [r["step"] for r in rows if r.get("eval/greedy_acc") is not None and r["eval/greedy_acc"] >= target]
        if reached:
            hits.append(reached[0])
        ents.append(next(r["actor/entropy"] for r in reversed(rows) if r.get("actor/entropy") is not None))
    std = statistics.stdev if len(seeds) > 1 else (lambda xs: 0.0)
    return Row(preset=label(preset), seeds=len(seeds), greedy_acc=statistics.fmean(finals), greedy_acc_std=std(finals),
               avg_at_k=statistics.fmean(avgs), avg_at_k_std=std(avgs), start_greedy_acc=statistics.fmean(starts),
               steps_to_target=statistics.fmean(hits) if hits else None, reached=len(hits),
               final_entropy=statistics.fmean(ents), wall_s=statistics.fmean(walls))


def markdown_table(rows: list[Row], target: float) -> str:
    head = (f"| preset | final greedy acc | final avg@k | greedy acc after warm start | steps to {target:.0%} greedy "
            f"(seeds reaching) | entropy at end | RL wall s |\n|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        steps = f"{r.steps_to_target:.0f} ({r.reached}/{r.seeds})" if r.steps_to_target is not None else \
            f"not reached (0/{r.seeds})"
        lines.append(f"| {r.preset} | {r.greedy_acc:.1%} ± {r.greedy_acc_std:.1%} | {r.avg_at_k:.1%} ± "
                     f"{r.avg_at_k_std:.1%} | {r.start_greedy_acc:.1%} | {steps} | {r.final_entropy:.3f} | "
                     f"{r.wall_s:.0f} |")
    return head + "\n".join(lines) + "\n"


def write_outputs(out_dir: Path, rows: list[Row], presets: list[str], seeds: list[int], target: float,
                  overrides: list[str]) -> None:
    cmd = f"credo compare --presets {','.join(presets)} --seeds {len(seeds)} --target {target} --out {out_dir}"
    cmd += "".join(f" {o}" for o in overrides)
    text = f"# credo compare\n\nCommand: `{cmd}`\n\n" + markdown_table(rows, target)
    (out_dir / "compare.md").write_text(text)
    (out_dir / "compare.json").write_text(json.dumps({"command": cmd, "rows": [asdict(r) for r in rows]}, indent=2))
    plot(out_dir, presets, seeds)


def plot(out_dir: Path, presets: list[str], seeds: list[int]) -> Path:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    acc_ax, ent_ax = fig.subplots(1, 2)
    palette = matplotlib.colormaps["tab20" if len(presets) > 10 else "tab10"]
    for i, preset in enumerate(presets):
        color = palette(i % palette.N)
        curves = [read_metrics(out_dir / label(preset) / f"seed{s}" / "metrics.jsonl") for s in seeds]
        evals = [[(r["step"], r["eval/greedy_acc"]) for r in c if r.get("eval/greedy_acc") is not None] for c in curves]
        steps = [s for s, _ in evals[0]]
        mean = [statistics.fmean(e[i][1] for e in evals if i < len(e)) for i in range(len(steps))]
        line = acc_ax.plot(steps, mean, marker="o", ms=3, label=label(preset), color=color)[0]
        lo = [min(e[i][1] for e in evals if i < len(e)) for i in range(len(steps))]
        hi = [max(e[i][1] for e in evals if i < len(e)) for i in range(len(steps))]
        acc_ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.08)
        ent = [[(r["step"], r["actor/entropy"]) for r in c if r.get("actor/entropy") is not None] for c in curves]
        n = min(len(e) for e in ent)
        ent_ax.plot([ent[0][i][0] for i in range(n)], [statistics.fmean(e[i][1] for e in ent) for i in range(n)],
                    color=line.get_color(), label=label(preset), lw=1.2)
    acc_ax.set(title=f"Held-out greedy accuracy (mean, min-max over {len(seeds)} seeds)", xlabel="RL step",
               ylabel="accuracy")
    ent_ax.set(title="Policy entropy (mean over seeds)", xlabel="RL step", ylabel="nats / token")
    for ax in (acc_ax, ent_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "compare.png"
    fig.savefig(path)
    return path
