"""An :class:`~credo.inspect.core.Inspection` as a self-contained HTML page or a JSON document.

The page (credo.report.page's style, no script, no network): the replay's inputs and notes, the pairwise
disagreement table, then per sample one strip of token cells per loss (coloured by the per-token gradient) and
per estimator (coloured by the advantage), a tooltip on every cell with the token's numbers for that method,
and a per-token table. Every text (tokens, prompts, uids, notes) is HTML-escaped.
"""
from __future__ import annotations

import html
import json
import math
from functools import partial
from typing import Any

import torch

from credo.inspect.core import Inspection
from credo.inspect.methods import ZERO_TOL, LossReplay

EXTRA_CSS = """
body { max-width: 1200px; }
.strip { display: flex; flex-wrap: wrap; align-items: center; margin: 0.15rem 0; font-family: monospace; }
.lbl { width: 9rem; flex: none; font-size: 0.8rem; color: #444; }
.tok { padding: 0 2px; margin: 1px; border: 1px solid transparent; white-space: pre; font-size: 0.85rem; }
.tok.off { color: #999; background: #f0f0f0; }
.tok.dis { border-color: #000; }
td.num { text-align: right; font-family: monospace; }
.small { font-size: 0.8rem; }
"""
PROMPT_CHARS = 2000  # prompts are cut on the page (the JSON has them whole)


def _num(x: float) -> float | None:
    """JSON-safe float: 6 significant digits, NaN / inf as None."""
    return None if not math.isfinite(x) else float(f"{x:.6g}")


def _row(x: torch.Tensor, i: int, n: int) -> list[float | None]:
    return [_num(float(v)) for v in x[i, :n].tolist()]


def to_json(ins: Inspection) -> dict[str, Any]:
    """Everything the page shows, as plain JSON values (per-token lists cut to each response's length)."""
    b = ins.batch
    samples = []
    for i, row in enumerate(b.rows):
        n = len(row["response_ids"])
        samples.append({
            "uid": row.get("uid"), "group": int(b.group_ids[i]), "score": _num(float(b.scores[i])),
            "prompt": row.get("prompt"), "response": row.get("response"), "tokens": b.tokens[i],
            "response_ids": row["response_ids"], "mask": [int(m) for m in b.mask[i, :n].tolist()],
            "logprobs": _row(b.logprobs, i, n), "old_logprobs": _row(b.old_logprobs, i, n),
            "ratio": _row(b.ratio, i, n), "entropy": None if b.entropy is None else _row(b.entropy, i, n),
            "advantages": {e.name: _row(e.advantages, i, n) for e in ins.estimators},
            "losses": {r.name: {"grad": _row(r.grad, i, n), "weight": _row(r.weight, i, n),
                                "agg_grad": _row(r.agg_grad, i, n), "region": r.regions[i][:n]}
                       for r in ins.losses},
            "disagree": {"loss": [bool(v) for v in ins.loss_disagree[i, :n].tolist()],
                         "estimator": [bool(v) for v in ins.estimator_disagree[i, :n].tolist()]},
        })
    return {
        "run": str(ins.run_dir), "step": b.step, "run_loss": ins.run_loss, "run_estimator": ins.run_estimator,
        "agg": ins.agg, "advantages_source": ins.advantages_source, "sources": b.sources, "notes": b.notes,
        "losses": [{"name": r.name, "hparams": r.hparams, "metrics": {k: _num(v) for k, v in r.metrics.items()}}
                   for r in ins.losses],
        "estimators": [{"name": e.name, "hparams": e.hparams} for e in ins.estimators],
        "skipped": [{"kind": s.kind, "name": s.name, "reason": s.reason} for s in ins.skipped],
        "disagreement": [{"kind": d.kind, "a": d.a, "b": d.b, "tokens": d.tokens, "sign": _num(d.sign),
                          "zero": _num(d.zero), "mean_abs_diff": _num(d.mean_abs_diff)} for d in ins.disagreements],
        "samples": samples,
    }


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _show(token: str) -> str:
    """A token as visible text: whitespace escapes, an empty token as a mark."""
    return token.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r") or "\u2205"


def _colour(x: float, scale: float) -> str:
    """Green for x < 0 (descent raises the log-prob), red for x > 0; alpha |x| / scale."""
    if not math.isfinite(x) or abs(x) <= ZERO_TOL or scale <= 0:
        return "#ffffff"
    alpha = min(abs(x) / scale, 1.0) * 0.85 + 0.1
    rgb = "0,150,60" if x < 0 else "210,40,40"
    return f"rgba({rgb},{alpha:.2f})"


def _f(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x + 0.0:.4g}"  # + 0.0: -0.0 shows as 0


def _common(ins: Inspection, i: int, t: int) -> str:
    b = ins.batch
    text = f"t={t} token={b.tokens[i][t]!r} ratio={_f(float(b.ratio[i, t]))}"
    return text + (f" entropy={_f(float(b.entropy[i, t]))}" if b.entropy is not None else "")


def _loss_detail(r: LossReplay, i: int, t: int) -> str:
    return (f"{r.name}: grad={_f(float(r.grad[i, t]))} w={_f(float(r.weight[i, t]))} region={r.regions[i][t]} "
            f"agg_grad={_f(float(r.agg_grad[i, t]))}")


def _strip(ins: Inspection, i: int, label: str, values: torch.Tensor, flags: torch.Tensor, detail) -> str:
    """One line of token cells coloured by ``values`` (B, T); each tooltip: the token's common numbers and
    ``detail(i, t)``, this method's (the per-token table has every method's)."""
    b = ins.batch
    scale = float((values.abs() * b.mask).max()) if b.mask.any() else 0.0
    cells = []
    for t, tok in enumerate(b.tokens[i]):
        on = bool(b.mask[i, t])
        cls = "tok" + ("" if on else " off") + (" dis" if on and bool(flags[i, t]) else "")
        style = f' style="background:{_colour(float(values[i, t]), scale)}"' if on else ""
        tip = _e(_common(ins, i, t) + "\n" + detail(i, t))
        cells.append(f'<span class="{cls}"{style} title="{tip}">{_e(_show(tok))}</span>')
    return f'<div class="strip"><span class="lbl">{_e(label)}</span>{"".join(cells)}</div>'


def _token_table(ins: Inspection, i: int) -> str:
    b = ins.batch
    head = ["t", "token", "mask", "ratio", "entropy"] + [f"A[{e.name}]" for e in ins.estimators]
    head += [f"{r.name} {k}" for r in ins.losses for k in ("grad", "w", "region")]
    lines = []
    for t, tok in enumerate(b.tokens[i]):
        cells = [str(t), _e(_show(tok)), str(int(b.mask[i, t])), _f(float(b.ratio[i, t])),
                 "" if b.entropy is None else _f(float(b.entropy[i, t]))]
        cells += [_f(float(e.advantages[i, t])) for e in ins.estimators]
        for r in ins.losses:
            cells += [_f(float(r.grad[i, t])), _f(float(r.weight[i, t])), _e(r.regions[i][t])]
        lines.append("<tr>" + "".join(f'<td class="num">{c}</td>' for c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"
    return f'<details><summary>per-token numbers</summary><table class="small">{header}{"".join(lines)}</table>' \
           "</details>"


def _sample(ins: Inspection, i: int) -> str:
    b, row = ins.batch, ins.batch.rows[i]
    prompt = str(row.get("prompt") or "")
    cut = prompt[:PROMPT_CHARS] + (" [...]" if len(prompt) > PROMPT_CHARS else "")
    n_loss, n_est = int(ins.loss_disagree[i].sum()), int(ins.estimator_disagree[i].sum())
    head = (f"<h3>sample {i} · {_e(row.get('uid', ''))} · group {int(b.group_ids[i])} · score "
            f"{_f(float(b.scores[i]))}</h3>\n<p class=\"small\">tokens where the losses disagree: {n_loss}; the "
            f"estimators: {n_est}</p>\n<pre>{_e(cut)}</pre>")
    strips = [_strip(ins, i, f"loss {r.name}", r.grad, ins.loss_disagree, partial(_loss_detail, r))
              for r in ins.losses]
    strips += [_strip(ins, i, f"A {e.name}", -e.advantages, ins.estimator_disagree,
                      lambda i, t, e=e: f"A[{e.name}]={_f(float(e.advantages[i, t]))}") for e in ins.estimators]
    return head + "\n" + "\n".join(strips) + "\n" + _token_table(ins, i)


def _table(head: list[str], rows: list[list[str]]) -> str:
    h = "<tr>" + "".join(f"<th>{_e(x)}</th>" for x in head) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table>{h}{body}</table>"


def render_html(ins: Inspection, *, max_samples: int | None = None) -> str:
    """The page; ``max_samples`` limits the per-sample sections (the tables count every sample)."""
    b = ins.batch
    inputs = [["advantages for the losses", ins.advantages_source], ["aggregation (agg_grad)", ins.agg]]
    inputs += [[k, v] for k, v in b.sources.items()]
    inputs += [[f"skipped {s.kind} {s.name}", s.reason] for s in ins.skipped]
    methods = [[f"loss {r.name}", json.dumps(r.hparams)] for r in ins.losses]
    methods += [[f"estimator {e.name}", json.dumps(e.hparams)] for e in ins.estimators]
    dis = [[d.kind, d.a, d.b, str(d.tokens), f"{100 * d.sign:.1f}%", f"{100 * d.zero:.1f}%", f"{d.mean_abs_diff:.4g}"]
           for d in ins.disagreements]
    shown = range(b.batch_size if max_samples is None else min(max_samples, b.batch_size))
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in b.notes)
    sections = [
        f"<h1>credo inspect: {_e(ins.run_dir.name)} · step {b.step}</h1>",
        f'<p class="meta">{_e(ins.run_dir)} · {b.batch_size} samples · run loss {_e(ins.run_loss)}, '
        f"estimator {_e(ins.run_estimator)}</p>", notes,
        "<h2>Inputs</h2>", _table(["input", "source"], inputs),
        "<h2>Methods</h2>", _table(["method", "hyperparameters"], methods),
        "<h2>Disagreement</h2>",
        _table(["kind", "a", "b", "tokens", "opposite sign", "zero vs non-zero", "mean |a - b|"], dis)
        if dis else "<p>One method of each kind: nothing to compare.</p>",
        "<h2>Samples</h2>",
        "<p class=\"small\">Loss strips: the per-token gradient d L / d logprob (green: a descent step raises the "
        "token's log-prob, red: lowers it; shade relative to the method's largest |value| in the step). Estimator "
        "strips: the advantage (green: A &gt; 0). Grey: outside the loss mask. Outlined: the methods of that kind "
        "disagree on the token (sign, or zero vs non-zero). Hover a token for its numbers.</p>",
        *(_sample(ins, i) for i in shown),
    ]
    if len(shown) < b.batch_size:
        sections.append(f'<p class="note">{b.batch_size - len(shown)} more samples not shown (--samples).</p>')
    body = "\n".join(s for s in sections if s)
    from credo.report.page import CSS  # the run report's style (imported here: it loads matplotlib)

    return ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>credo inspect: {_e(ins.run_dir.name)} step {b.step}</title>\n<style>{CSS}{EXTRA_CSS}</style>\n"
            "</head>\n"
            f"<body>\n{body}\n</body>\n</html>\n")
