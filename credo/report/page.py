"""Self-contained HTML report of one run: summary table, PNG plots, config.

Inputs (in the run directory)::

    metrics.jsonl      required, written by credo.tracking.metrics.MetricsLogger
    warm_start.jsonl   optional, SFT warm-start rows (step, sft/loss, sft/lr)
    summary.json       optional, a flat dict shown as a table
    config.yaml        optional, shown verbatim

Outputs: ``plots/*.png`` and ``report.html`` (CSS inline, images referenced as ``plots/<name>.png``,
so the directory can be copied or served as is).
"""
from __future__ import annotations

import html
import json
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from credo.report.plots import TIMING_TOTAL, PlotFile, keys_with_prefix, make_plots, series
from credo.tracking.atomic import atomic_write_text
from credo.tracking.metrics import read_metrics
from credo.tracking.rundir import check_run_dir

__all__ = ["write_report", "summarize", "merge_by_step"]

REPORT_NAME = "report.html"
PLOTS_DIRNAME = "plots"

Rows = Sequence[Mapping[str, Any]]


# ------------------------------------------------------------------------------------------ input


def merge_by_step(rows: Rows) -> list[dict[str, Any]]:
    """One row per step, sorted by step; rows sharing a step are merged (later values win).

    Handles a trainer that logs eval metrics in a separate call at the same step, and a run that
    was resumed without truncating its log.  Rows without a numeric step are dropped.
    """
    merged: dict[float, dict[str, Any]] = {}
    for row in rows:
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
            continue
        merged.setdefault(step, {}).update(row)
    return [merged[step] for step in sorted(merged)]


def _read_optional_rows(path: Path) -> list[dict[str, Any]]:
    return merge_by_step(read_metrics(path)) if path.is_file() else []


def _read_summary_json(path: Path) -> dict[str, Any] | str | None:
    """The dict in summary.json, an error message if it cannot be used, or None if absent."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return f"summary.json could not be parsed: {exc}"
    return data if isinstance(data, dict) else f"summary.json holds a {type(data).__name__}, not an object"


# ---------------------------------------------------------------------------------------- summary


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.4g}"


def _fmt_step(step: float) -> str:
    return f"step {_fmt(step)}"


def _fmt_duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _final(rows: Rows, key: str) -> tuple[str, str] | None:
    s = series(rows, key)
    if not len(s):
        return None
    return f"Final {key}", f"{_fmt(s.values[-1])} ({_fmt_step(s.steps[-1])})"


def _eval_change(rows: Rows) -> tuple[str, str] | None:
    s = series(rows, "eval/greedy_acc")
    if not len(s):
        return None
    first, last = s.values[0], s.values[-1]
    text = f"{_fmt(first)} ({_fmt_step(s.steps[0])})"
    if len(s) > 1:
        text += f" → {_fmt(last)} ({_fmt_step(s.steps[-1])}), change {last - first:+.4g}"
    return "Eval greedy accuracy", text


def _wall_time(rows: Rows) -> tuple[str, str] | None:
    s = series(rows, TIMING_TOTAL)
    if not len(s):
        return None
    total = _fmt_duration(float(s.values.sum()))
    return "Total wall time", f"{total} (sum of {TIMING_TOTAL} over {len(s)} steps)"


def _throughput(rows: Rows) -> tuple[str, str] | None:
    s = series(rows, "perf/tokens_per_s")
    return ("Tokens / s (median)", _fmt(statistics.median(s.values.tolist()))) if len(s) else None


def summarize(rows: Rows) -> list[tuple[str, str]]:
    """Headline numbers of a run as (label, text) pairs; entries whose metrics are missing are omitted.

    ``rows`` must be merged and sorted by step (see :func:`merge_by_step`).
    """
    if not rows:
        return [("Steps logged", "0")]
    steps = [row["step"] for row in rows]
    entries = [("Steps logged", f"{len(steps)} ({_fmt_step(steps[0])} to {_fmt(steps[-1])})")]
    candidates = [
        _eval_change(rows),
        *(_final(rows, key) for key in keys_with_prefix(rows, "eval/avg@")),
        *(_final(rows, key) for key in keys_with_prefix(rows, "eval/pass@")),
        _final(rows, "reward/mean"),
        _final(rows, "acc/mean"),
        _wall_time(rows),
        _throughput(rows),
    ]
    return entries + [entry for entry in candidates if entry is not None]


# ------------------------------------------------------------------------------------------- html

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2rem auto;
       max-width: 960px; padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.2rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2rem; }
.meta { color: #666; font-size: 0.9rem; }
table { border-collapse: collapse; font-size: 0.92rem; }
th, td { text-align: left; padding: 0.25rem 0.9rem 0.25rem 0; border-bottom: 1px solid #eee;
         vertical-align: top; }
th { font-weight: 600; white-space: nowrap; }
figure { margin: 1.2rem 0 2rem 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #444; font-size: 0.9rem; margin-top: 0.3rem; }
pre { background: #f6f8fa; padding: 0.8rem; overflow-x: auto; font-size: 0.85rem; }
.note { color: #a15c00; }
"""


def _table(entries: Sequence[tuple[str, str]]) -> str:
    body = "\n".join(
        f"<tr><th>{html.escape(label)}</th><td>{html.escape(text)}</td></tr>" for label, text in entries
    )
    return f"<table>\n{body}\n</table>"


def _summary_json_section(summary: dict[str, Any] | str | None) -> str:
    if summary is None:
        return ""
    if isinstance(summary, str):
        return f'<h2>summary.json</h2>\n<p class="note">{html.escape(summary)}</p>'
    entries = [
        (key, _fmt(value) if isinstance(value, (int, float)) else json.dumps(value))
        for key, value in summary.items()
    ]
    return f"<h2>summary.json</h2>\n{_table(entries)}"


def _figure(plot: PlotFile) -> str:
    src = html.escape(f"{PLOTS_DIRNAME}/{plot.path.name}", quote=True)
    return (
        f'<figure>\n<img src="{src}" alt="{html.escape(plot.title, quote=True)}">\n'
        f"<figcaption><b>{html.escape(plot.title)}.</b> {html.escape(plot.caption)}</figcaption>\n</figure>"
    )


def _plots_section(plots: Sequence[PlotFile]) -> str:
    if not plots:
        return '<h2>Plots</h2>\n<p class="note">No plottable metrics were logged.</p>'
    return "<h2>Plots</h2>\n" + "\n".join(_figure(plot) for plot in plots)


def _config_section(config_text: str | None) -> str:
    if config_text is None:
        return ""
    return f"<h2>Config (config.yaml)</h2>\n<pre>{html.escape(config_text)}</pre>"


def render_html(
    run_dir: Path,
    summary: Sequence[tuple[str, str]],
    summary_json: dict[str, Any] | str | None,
    plots: Sequence[PlotFile],
    config_text: str | None,
) -> str:
    """The full report page as a string."""
    name = html.escape(run_dir.resolve().name)
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    sections = [
        f"<h1>credo run report: {name}</h1>",
        f'<p class="meta">{html.escape(str(run_dir.resolve()))} · generated {generated}</p>',
        "<h2>Summary</h2>",
        _table(summary),
        _summary_json_section(summary_json),
        _plots_section(plots),
        _config_section(config_text),
    ]
    body = "\n".join(section for section in sections if section)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>credo report: {name}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )


# ------------------------------------------------------------------------------------------ entry


def write_report(run_dir: str | Path) -> Path:
    """Write ``plots/*.png`` and ``report.html`` for the run in ``run_dir``; returns the HTML path.

    Raises ``FileNotFoundError`` if ``run_dir/metrics.jsonl`` does not exist.  Missing metrics,
    a one-row run, or a truncated last line (killed run) are fine: only what exists is plotted.
    """
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if run_dir.is_dir():
        check_run_dir(run_dir, "credo report")  # a linked config.yaml would be copied into the page
    if not metrics_path.is_file():
        raise FileNotFoundError(
            f"cannot write a report for {run_dir}: {metrics_path} does not exist "
            "(is this a run directory written by credo's MetricsLogger?)"
        )
    rows = merge_by_step(read_metrics(metrics_path))
    warm_start_rows = _read_optional_rows(run_dir / "warm_start.jsonl")
    plots = make_plots(rows, warm_start_rows, run_dir / PLOTS_DIRNAME)
    config_path = run_dir / "config.yaml"
    config_text = config_path.read_text(encoding="utf-8", errors="replace") if config_path.is_file() else None
    summary_json = _read_summary_json(run_dir / "summary.json")
    page = render_html(run_dir, summarize(rows), summary_json, plots, config_text)
    report_path = run_dir / REPORT_NAME
    atomic_write_text(report_path, page)
    return report_path
