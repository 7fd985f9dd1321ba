"""PNG plots of a run's metrics for the HTML report.

Figures are drawn on matplotlib's Agg canvas directly (``Figure`` + ``FigureCanvasAgg``), without
pyplot, so no global backend or rc state is changed and nothing needs a display.

Every plot is a list of *panels* (stacked vertically, shared step axis).  A panel is built only if
its metrics exist in the rows; a plot without any panel is skipped.  Noisy training curves are
drawn as an EMA-smoothed line over the faint raw values; eval curves (logged on some steps only)
are drawn with markers.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["PlotFile", "Series", "series", "keys_with_prefix", "ema", "make_plots"]

Rows = Sequence[Mapping[str, Any]]

DPI = 110
WIDTH = 7.0
PANEL_HEIGHT = 4.0  # one-panel figures are (7, 4); each extra panel adds a bit less
EXTRA_PANEL_HEIGHT = 3.0
MIN_POINTS_TO_SMOOTH = 5
MAX_STACKED_BARS = 60  # more steps than this: the time split is drawn as a stacked area
TIMING_PREFIX = "timing_s/"
TIMING_TOTAL = "timing_s/step"


@dataclass(frozen=True)
class PlotFile:
    """A written PNG and the caption the report shows under it."""

    path: Path
    title: str
    caption: str


# ------------------------------------------------------------------------------------ data access


@dataclass(frozen=True)
class Series:
    """Values of one metric at the steps where it was logged with a finite number."""

    steps: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def series(rows: Rows, key: str) -> Series:
    """The finite values of ``key`` and their steps (rows without the key or with null are skipped)."""
    points = [(row["step"], _number(row.get(key))) for row in rows]
    points = [(step, value) for step, value in points if value is not None]
    return Series(
        np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points], dtype=float)
    )


def _paired(rows: Rows, key_a: str, key_b: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps where both keys have finite values, and the two value arrays."""
    triples = [(row["step"], _number(row.get(key_a)), _number(row.get(key_b))) for row in rows]
    triples = [t for t in triples if t[1] is not None and t[2] is not None]
    if not triples:
        return np.empty(0), np.empty(0), np.empty(0)
    steps, a, b = (np.array(column, dtype=float) for column in zip(*triples))
    return steps, a, b


def keys_with_prefix(rows: Rows, prefix: str) -> list[str]:
    """All keys starting with ``prefix``, ordered by the integer that follows it (``eval/avg@8``)."""
    keys = {key for row in rows for key in row if key.startswith(prefix)}

    def order(key: str) -> tuple[int, str]:
        match = re.match(r"\d+", key[len(prefix):])
        return (int(match.group()) if match else 1 << 30, key)

    return sorted(keys, key=order)


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing); ``weight=0`` is the identity."""
    out = np.empty(len(values), dtype=float)
    last, norm = 0.0, 0.0
    for i, value in enumerate(values):
        last = weight * last + (1.0 - weight) * value
        norm = weight * norm + (1.0 - weight)
        out[i] = last / norm
    return out


def smoothing_weight(n_points: int) -> float:
    """Stronger smoothing for longer curves: 0 below 5 points, 0.5 at 10, capped at 0.9 (50+)."""
    if n_points < MIN_POINTS_TO_SMOOTH:
        return 0.0
    return min(0.9, 1.0 - MIN_POINTS_TO_SMOOTH / n_points)


# ------------------------------------------------------------------------------ drawing primitives


def _curve(ax: Axes, s: Series, label: str, color: str, *, smooth: bool = True) -> None:
    """Raw values faintly plus their EMA, or plain line with markers for short curves."""
    weight = smoothing_weight(len(s)) if smooth else 0.0
    if weight == 0.0:
        marker = "o" if len(s) <= 20 else None
        ax.plot(s.steps, s.values, color=color, lw=1.5, marker=marker, ms=3.5, label=label)
        return
    ax.plot(s.steps, s.values, color=color, lw=0.8, alpha=0.3)
    ax.plot(s.steps, ema(s.values, weight), color=color, lw=1.8, label=f"{label} (EMA)")


def _markers(ax: Axes, s: Series, label: str, color: str, marker: str = "o") -> None:
    """Sparse curves (eval): markers joined by a dashed line."""
    ax.plot(s.steps, s.values, color=color, lw=1.2, ls="--", marker=marker, ms=5, label=label)


def _band(ax: Axes, steps: np.ndarray, low: np.ndarray, high: np.ndarray, color: str, label: str) -> None:
    if len(steps) == 1:  # a band of one step is invisible: draw an error bar instead
        ax.errorbar(steps, (low + high) / 2, yerr=(high - low) / 2, color=color, alpha=0.4, capsize=4)
        return
    ax.fill_between(steps, low, high, color=color, alpha=0.15, lw=0, label=label)


def _style(ax: Axes, title: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=11)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=8, loc="best", framealpha=0.85, ncol=2 if len(handles) > 4 else 1)


# ----------------------------------------------------------------------------------------- panels


@dataclass(frozen=True)
class Panel:
    """One axes of a figure: a title, a y label and a function drawing its artists."""

    title: str
    ylabel: str
    draw: Callable[[Axes], None]


def _lines_panel(
    rows: Rows, title: str, ylabel: str, keys: Sequence[str], *, smooth: bool = True
) -> Panel | None:
    """One curve per present key; ``None`` if none of the keys has a value."""
    present = [(key, s) for key in keys if len(s := series(rows, key))]
    if not present:
        return None

    def draw(ax: Axes) -> None:
        for i, (key, s) in enumerate(present):
            _curve(ax, s, key, f"C{i}", smooth=smooth)

    return Panel(title, ylabel, draw)


def _reward_panel(rows: Rows) -> Panel | None:
    mean = series(rows, "reward/mean")
    if not len(mean):
        return None
    steps, band_mean, std = _paired(rows, "reward/mean", "reward/std")

    def draw(ax: Axes) -> None:
        if len(steps):
            _band(ax, steps, band_mean - std, band_mean + std, "C0", "± reward/std")
        _curve(ax, mean, "reward/mean", "C0")

    return Panel("Reward", "reward", draw)


def _accuracy_panel(rows: Rows) -> Panel | None:
    sampled = keys_with_prefix(rows, "eval/avg@") + keys_with_prefix(rows, "eval/pass@")
    eval_keys = ["eval/greedy_acc", *sampled]
    train = series(rows, "acc/mean")
    evals = [(key, s) for key in eval_keys if len(s := series(rows, key))]
    if not len(train) and not evals:
        return None

    def draw(ax: Axes) -> None:
        if len(train):
            _curve(ax, train, "acc/mean (train samples)", "C0")
        for i, (key, s) in enumerate(evals):
            _markers(ax, s, key, f"C{i + 1}", marker="osD^v<>"[i % 7])

    return Panel("Accuracy", "accuracy", draw)


def _length_panel(rows: Rows) -> Panel | None:
    mean, low, high = (series(rows, f"response_length/{k}") for k in ("mean", "min", "max"))
    steps, band_low, band_high = _paired(rows, "response_length/min", "response_length/max")
    if not (len(mean) or len(low) or len(high)):
        return None

    def draw(ax: Axes) -> None:
        if len(steps):
            _band(ax, steps, band_low, band_high, "C0", "min-max range")
        else:  # only one bound was logged
            for key, s in (("min", low), ("max", high)):
                if len(s):
                    ax.plot(s.steps, s.values, color="C0", lw=0.8, ls=":", label=f"response_length/{key}")
        if len(mean):
            _curve(ax, mean, "response_length/mean", "C0")

    return Panel("Response length", "tokens", draw)


def _timing_matrix(rows: Rows) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Steps, phase names (largest total first) and seconds[phase, step] (missing = 0)."""
    keys = [k for k in keys_with_prefix(rows, TIMING_PREFIX) if k != TIMING_TOTAL]
    timed = [row for row in rows if any(_number(row.get(k)) is not None for k in keys)]
    steps = np.array([row["step"] for row in timed], dtype=float)
    seconds = np.array([[_number(row.get(k)) or 0.0 for row in timed] for k in keys])
    seconds = seconds.reshape(len(keys), len(timed))  # keeps the 2-D shape when there are no rows
    order = np.argsort(-seconds.sum(axis=1), kind="stable")
    return steps, [keys[i] for i in order], seconds[order]


def _time_panel(rows: Rows) -> Panel | None:
    steps, keys, seconds = _timing_matrix(rows)
    if not len(steps):
        return None
    labels = [k[len(TIMING_PREFIX):] for k in keys]
    colors = [f"C{i % 10}" for i in range(len(keys))]

    def draw(ax: Axes) -> None:
        if len(steps) > MAX_STACKED_BARS:
            ax.stackplot(steps, seconds, labels=labels, colors=colors, alpha=0.85)
            return
        width = 0.8 * (float(np.min(np.diff(steps))) if len(steps) > 1 else 1.0)
        bottom = np.zeros(len(steps))
        for label, color, values in zip(labels, colors, seconds):
            ax.bar(steps, values, bottom=bottom, width=width, color=color, label=label)
            bottom += values

    return Panel("Time per step by phase", "seconds", draw)


# ------------------------------------------------------------------------------------------ plots


@dataclass(frozen=True)
class PlotSpec:
    filename: str
    title: str
    caption: str
    panels: Callable[[Rows], list[Panel | None]]


TRAINING_PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec(
        "reward_accuracy.png",
        "Reward and accuracy",
        "Top: mean reward of the training rollouts with a ±1 std band. Bottom: accuracy of the sampled "
        "training rollouts (acc/mean) and evaluation accuracies (markers: greedy, avg@K, pass@K).",
        lambda rows: [_reward_panel(rows), _accuracy_panel(rows)],
    ),
    PlotSpec(
        "entropy.png",
        "Policy entropy",
        "Mean per-token entropy of the policy on the training rollouts. A fast collapse towards 0 means "
        "the policy stopped exploring.",
        lambda rows: [_lines_panel(rows, "Policy entropy", "nats / token", ["actor/entropy"])],
    ),
    PlotSpec(
        "clip_fractions.png",
        "Clip fractions",
        "Fraction of response tokens whose importance ratio was clipped by the surrogate objective.",
        lambda rows: [
            _lines_panel(
                rows,
                "Clip fractions",
                "fraction of tokens",
                ["actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/clipfrac_high", "actor/clipfrac_low"],
            )
        ],
    ),
    PlotSpec(
        "response_length.png",
        "Response length",
        "Top: mean response length with the min-max range of the batch. Bottom: fraction of responses "
        "cut at the generation length limit.",
        lambda rows: [
            _length_panel(rows),
            _lines_panel(rows, "Truncated responses", "fraction", ["response_length/clip_ratio"]),
        ],
    ),
    PlotSpec(
        "time_split.png",
        "Time split",
        "Top: wall-clock seconds of each phase of a training step (timing_s/*), stacked. Bottom: "
        "throughput in tokens per second.",
        lambda rows: [
            _time_panel(rows),
            _lines_panel(rows, "Throughput", "tokens / s", ["perf/tokens_per_s"]),
        ],
    ),
    PlotSpec(
        "kl_gradnorm.png",
        "KL and gradient norm",
        "Top: KL between the updated and the rollout policy (ppo_kl) and to the reference policy (kl). "
        "Bottom: gradient norm before clipping.",
        lambda rows: [
            _lines_panel(rows, "KL divergence", "KL", ["actor/ppo_kl", "actor/kl"]),
            _lines_panel(rows, "Gradient norm", "norm", ["actor/grad_norm"]),
        ],
    ),
    PlotSpec(
        "loss_lr.png",
        "Policy loss and learning rate",
        "Top: policy-gradient loss. Bottom: learning rate schedule.",
        lambda rows: [
            _lines_panel(rows, "Policy-gradient loss", "loss", ["actor/pg_loss"]),
            _lines_panel(rows, "Learning rate", "lr", ["actor/lr"], smooth=False),
        ],
    ),
    PlotSpec(
        "verifier_failures.png",
        "Verifier failures",
        "Number of responses per step whose verifier raised an error or timed out (scored with the "
        "failure score).",
        lambda rows: [
            _lines_panel(
                rows,
                "Verifier failures",
                "responses",
                ["reward/verifier_failures", "reward/verifier_timeouts"],
                smooth=False,
            )
        ],
    ),
)

def _filter_panel(rows: Rows) -> Panel | None:
    """Kept / dropped groups, only for runs where group filtering dropped something."""
    dropped = series(rows, "filter/dropped_groups")
    if not len(dropped) or not np.any(dropped.values > 0):
        return None
    return _lines_panel(rows, "Group filtering", "groups",
                        ["filter/kept_groups", "filter/dropped_groups", "filter/surplus_groups", "filter/gen_batches"],
                        smooth=False)


TRAINING_PLOTS += (
    PlotSpec(
        "critic.png",
        "Critic",
        "When a critic is trained (ppo, evpo): value loss (top) and the explained variance of the returns by "
        "the critic's values, with EVPO's gate (fraction of groups using the critic) where logged (bottom).",
        lambda rows: [
            _lines_panel(rows, "Value loss", "loss", ["critic/vf_loss"]),
            _lines_panel(rows, "Explained variance and EVPO gate", "value",
                         ["critic/vf_explained_var", "evpo/explained_variance", "evpo/use_critic"]),
        ],
    ),
    PlotSpec(
        "algorithm_signals.png",
        "Algorithm signals",
        "Method-specific signals where logged: entropy-split fractions (aspo, archer), soft dual clip (aspo), "
        "PAPO phase and branch weights, group filtering (kept / dropped groups per step).",
        lambda rows: [
            _lines_panel(rows, "Token regions", "fraction of tokens",
                         ["actor/high_entropy_frac", "actor/aspo_pos_dual_frac", "actor/aspo_neg_dual_frac",
                          "token_select/frac", "papo/frac_expand"]),
            _lines_panel(rows, "PAPO phase and weights", "value", ["papo/phase", "papo/w_pos", "papo/w_neg"]),
            _filter_panel(rows),
        ],
    ),
)

def _agent_success_panel(rows: Rows) -> Panel | None:
    per_env = [k for k in keys_with_prefix(rows, "agent/") if k.count("/") == 2 and k.endswith("/success_rate")]
    train = [(key, s) for key in ["agent/success_rate", *per_env] if len(s := series(rows, key))]
    held_out = [k for k in keys_with_prefix(rows, "eval/") if k.endswith("/greedy_success")]
    evals = [(key, s) for key in ["eval/greedy_acc", *held_out] if len(s := series(rows, key))]
    if not train:
        return None

    def draw(ax: Axes) -> None:
        for i, (key, s) in enumerate(train):
            _curve(ax, s, key, f"C{i}")
        for j, (key, s) in enumerate(evals):
            _markers(ax, s, f"{key} (held-out)", f"C{len(train) + j}", marker="osD^v<>"[j % 7])

    return Panel("Episode success", "success rate", draw)


TRAINING_PLOTS += (
    PlotSpec(
        "agent.png",
        "Agent episodes",
        "Multi-turn agent RL (agent.envs): success of the training episodes (per environment for mixtures) "
        "with held-out greedy success as markers; turns, tool calls and invalid actions per episode with the "
        "turn cap (ScalingInter-RL horizon); environment failures (server errors, timeouts: episodes ended "
        "with reward 0) and episodes cut by the horizon or the token budget; tokens per assistant turn; "
        "branching rollouts (ARPO / AEPO): global samples, branches and fill-up samples per step.",
        lambda rows: [
            _agent_success_panel(rows),
            _lines_panel(rows, "Turns and tool calls", "per episode",
                         ["agent/turns_mean", "agent/tool_calls_mean", "agent/invalid_actions_mean",
                          "agent/max_turns"]),
            _lines_panel(rows, "Failures and cuts", "episodes / fraction",
                         ["agent/env_failures", "agent/cut_by_horizon", "agent/cut_by_length"], smooth=False),
            _lines_panel(rows, "Tokens per turn", "tokens", ["agent/tokens_per_turn"]),
            _lines_panel(rows, "Branching rollouts", "episodes per step",
                         ["agent/branch/global", "agent/branch/branches", "agent/branch/fill"], smooth=False),
        ],
    ),
)

WARM_START_PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec(
        "warm_start.png",
        "Warm start (SFT)",
        "Supervised warm-start before RL: training loss (top) and learning rate (bottom).",
        lambda rows: [
            _lines_panel(rows, "SFT loss", "loss", ["sft/loss"]),
            _lines_panel(rows, "SFT learning rate", "lr", ["sft/lr"], smooth=False),
        ],
    ),
)


def render(path: Path, title: str, panels: Sequence[Panel], xlabel: str = "step") -> None:
    """Draw ``panels`` stacked in one figure with a shared x axis and save it as PNG."""
    height = PANEL_HEIGHT + EXTRA_PANEL_HEIGHT * (len(panels) - 1)
    fig = Figure(figsize=(WIDTH, height), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, panel in zip(axes, panels):
        panel.draw(ax)
        _style(ax, title if len(panels) == 1 else panel.title, panel.ylabel)
    axes[-1].set_xlabel(xlabel)
    low, high = axes[-1].get_xlim()
    if high - low < 2:  # a single step: widen so integer step ticks show instead of 0.995 ... 1.005
        middle = round((low + high) / 2)
        axes[-1].set_xlim(middle - 1, middle + 1)
    if len(panels) > 1:
        fig.suptitle(title, fontsize=13, fontweight="bold")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")


def _make(specs: Sequence[PlotSpec], rows: Rows, out_dir: Path) -> list[PlotFile]:
    written = []
    for spec in specs:
        path = out_dir / spec.filename
        panels = [p for p in spec.panels(rows) if p is not None]
        if panels:
            render(path, spec.title, panels)
            written.append(PlotFile(path, spec.title, spec.caption))
        else:
            path.unlink(missing_ok=True)  # stale plot from an earlier report of this run
    return written


def make_plots(rows: Rows, warm_start_rows: Rows, out_dir: Path) -> list[PlotFile]:
    """Write every plot that has data into ``out_dir`` (created); returns them in report order.

    Rows must carry a numeric ``"step"`` and be sorted by it.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    return _make(TRAINING_PLOTS, rows, out_dir) + _make(WARM_START_PLOTS, warm_start_rows, out_dir)
