"""``credo compare``'s learning curves (mean and 95% band over seeds), its table and its plot (docs/evidence.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from credo.report.series import points
from credo.report.stats import bootstrap_ci

GRID = 30  # points of a curve
AXIS = {"steps": "step", "wall_s": "step", "sampled_tokens": "budget/sampled_tokens",
        "trained_tokens": "budget/trained_tokens"}


def _xy(rows: list[dict], key: str, axis: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, value) arrays of the rows that logged ``key`` (credo.report.series.points)."""
    pts = points(rows, key, axis)
    return np.asarray([a for a, _ in pts]), np.asarray([b for _, b in pts])


def curves(spec: Any, rows: dict[tuple[str, int], list[dict]], seeds: list[int]) -> dict[str, Any]:
    """Per metric key: a common x grid (step or budget total) over the range every run covers, each seed's curve
    interpolated on it, per arm the mean and a bootstrap 95% band over seeds at every grid point, and per other arm
    the paired difference to the baseline (seed by seed) with its band: the seeds' spread in starting accuracy
    widens the arms' bands, not the differences'."""
    axis = AXIS[spec.budget_unit]
    out: dict[str, Any] = {}
    for key in dict.fromkeys(m.key for m in spec.metrics):
        series = {(a, s): _xy(rows[(a, s)], key, axis) for a in spec.arms for s in seeds}
        if any(len(x) == 0 for x, _ in series.values()):
            continue
        lo_x = max(float(x.min()) for x, _ in series.values())
        hi_x = min(float(x.max()) for x, _ in series.values())
        if hi_x < lo_x:
            continue
        grid = np.linspace(lo_x, hi_x, GRID) if hi_x > lo_x else np.array([lo_x])
        ys = {a: np.stack([np.interp(grid, *series[(a, s)]) for s in seeds]) for a in spec.arms}  # (seeds, grid)
        arms = {a: _band(y) for a, y in ys.items()}
        diff = {a: _band(y - ys[spec.baseline]) for a, y in ys.items() if a != spec.baseline}
        out[key] = {"x": axis, "grid": grid.tolist(), "arms": arms, "diff_to_baseline": diff}
    return out


def _band(ys: np.ndarray) -> dict[str, list[float]]:
    """(seeds, grid) -> the mean and the bootstrap 95% band at every grid point."""
    bands = [bootstrap_ci(ys[:, j]) for j in range(ys.shape[1])]
    return {"mean": ys.mean(axis=0).tolist(), "lo": [b[0] for b in bands], "hi": [b[1] for b in bands]}


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def write_markdown(path: Path, data: dict[str, Any]) -> None:
    spec, base = data["spec"], data["baseline"]
    budget = data["budget"]
    arms = ", ".join(f"{a} ({' '.join([v['preset'], *v['overrides']])})" for a, v in data["arms"].items())
    lines = [f"# credo compare: {data['name']}", "", f"Command: `{data['command']}`", "",
             f"Arms: {arms}; baseline **{base}**.",
             f"Seeds: {len(data['seeds'])} ({', '.join(map(str, data['seeds']))}); budget: "
             + (f"{budget['unit']} = {budget['value']:g}" if budget["value"] is not None else "train.steps")
             + f"; overrides for every arm: {' '.join(spec['overrides']) or 'none'}.",
             "Same initial weights across arms: " + ", ".join(
                 f"seed {s}: {'yes' if v else 'NO'}" for s, v in data["same_start_weights"].items()) + ".", ""]
    if data["failed"]:
        lines += ["Failed runs (their seeds are left out): " + "; ".join(
            f"{f['arm']} seed {f['seed']} ({f['error']})" for f in data["failed"]), ""]
    lines += ["Intervals: percentile bootstrap of the mean over seeds, 95%. A verdict is given only where the paired "
              "difference's interval excludes 0; p is the exact sign-flip p-value (at least 2/2^n).", ""]
    for mid, m in data["metrics"].items():
        lines += [f"## {mid}", "", f"| arm | mean [95% CI] | {'Δ vs ' + base} [95% CI] | verdict | wins | p |",
                  "|---|---|---|---|---|---|"]
        for arm, a in m["arms"].items():
            d = m["vs_baseline"].get(arm)
            row = f"| {arm} | {_fmt(a['mean'])} [{_fmt(a['ci95'][0])}, {_fmt(a['ci95'][1])}] | "
            row += (f"{_fmt(d['mean'])} [{_fmt(d['ci95'][0])}, {_fmt(d['ci95'][1])}] | {d['verdict']} | "
                    f"{d['wins']}/{d['n']} | {d['p_sign_flip']:.3g} |") if d else "baseline | | | |"
            lines.append(row)
        lines.append("")
    for mid, err in data.get("metric_errors", {}).items():
        lines += [f"## {mid}", "", f"Not summarised: {err}", ""]
    path.write_text("\n".join(lines))


def write_plot(path: Path, data: dict[str, Any]) -> Path:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = list(data["curves"])[:6]
    cols = min(3, len(keys))
    rows = 2 * ((len(keys) + cols - 1) // cols)  # each key: its curves, and below them the paired differences
    fig = Figure(figsize=(5.2 * cols, 3.4 * rows), dpi=100)
    FigureCanvasAgg(fig)
    palette = matplotlib.colormaps["tab10"]
    colors = {arm: palette(j % palette.N) for j, arm in enumerate(data["arms"])}
    for i, key in enumerate(keys):
        c = data["curves"][key]
        top = fig.add_subplot(rows, cols, (i // cols) * 2 * cols + i % cols + 1)
        low = fig.add_subplot(rows, cols, (i // cols) * 2 * cols + cols + i % cols + 1, sharex=top)
        for ax, bands in ((top, c["arms"]), (low, c.get("diff_to_baseline", {}))):
            for arm, band in bands.items():
                ax.plot(c["grid"], band["mean"], color=colors[arm], lw=1.4, label=arm)
                ax.fill_between(c["grid"], band["lo"], band["hi"], color=colors[arm], alpha=0.15)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        low.axhline(0.0, color="black", lw=0.8)
        top.set(title=key)
        low.set(title=f"{key}: arm − {data['baseline']} (paired)", xlabel=c["x"].replace("budget/", ""))
    fig.suptitle(f"{data['name']}: mean and 95% bootstrap band over {len(data['seeds'])} seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path
