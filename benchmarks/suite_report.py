"""The pure half of benchmarks/suite.py: a training step's time split from its metrics rows, a workload's summary,
the comparison of two suite JSONs (ratio B / A of the medians with a bootstrap 95% interval, benchmarks/harness.py),
the markdown table of docs/performance.md ("Workload suite") and its replacement between the markers.

The split of one RL step (`timing_s/*` of metrics.jsonl, the stage timer of credo/recipes/step.py):
generation = gen + gen_baseline + rollout_wait; reward = reward (what is left once generation has ended: rewards
are scored while rows finish); logprob = old_logprob + ref + values + teacher (the no-grad passes); update = update
+ update_critic; sync = sync + weight_sync (credo logs no sync stage today: an in-process sync lands in other);
other = step minus those five (collation, advantages, token selection, metrics, ...).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Iterable

import harness  # benchmarks/ (a script's own directory) is on sys.path

SPLIT = {"generation": ("gen", "gen_baseline", "rollout_wait"), "reward": ("reward",),
         "logprob": ("old_logprob", "ref", "values", "teacher"), "update": ("update", "update_critic"),
         "sync": ("sync", "weight_sync")}
COMPONENTS = ("step", *SPLIT, "other")
# timing_s keys that are not part of a step (or a running total)
OUTSIDE_STEP = ("eval", "checkpoint", "rl_wall_total")
START, END = "<!-- suite-table:start -->", "<!-- suite-table:end -->"
DRIFT_NOTE = ("ratios of two separate invocations carry the machine's drift between them (load, frequency, other "
              "processes): for a clean A/B use --ab TREE_A TREE_B, which interleaves the two trees' workloads")


def step_split(row: dict[str, Any]) -> dict[str, float]:
    """{step, generation, reward, logprob, update, sync, other} seconds of one metrics row with timing_s/step."""
    step = float(row["timing_s/step"])
    out = {"step": step}
    for part, keys in SPLIT.items():
        out[part] = sum(float(row.get(f"timing_s/{k}", 0.0)) for k in keys)
    out["other"] = step - sum(out[p] for p in SPLIT)
    return out


def timed_rows(rows: Iterable[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """The RL steps' rows (those with timing_s/step), the first `warmup` left out."""
    return [r for r in rows if "timing_s/step" in r][warmup:]


def medians(steps: list[dict[str, float]]) -> dict[str, float]:
    """Per component, the median over the samples that have it."""
    keys = dict.fromkeys(k for s in steps for k in s)
    return {k: statistics.median(s[k] for s in steps if k in s) for k in keys}


def train_summary(rows: list[dict[str, Any]], *, params: int | None = None, peak_flops: float | None = None,
                  ppo_epochs: int = 1) -> dict[str, Any]:
    """steps (the split of each timed row), their medians, tokens/s and the update's MFU estimate.

    tokens_per_s: the median of perf/tokens_per_s (prompt + response tokens of the step over the step's time).
    mfu: 6 N T ppo_epochs / update seconds / peak_flops, T = prompt + response tokens of the step (perf/tokens_per_s
    x timing_s/step), the median over steps; the update's share of work as benchmarks/mfu.py counts it."""
    steps = [step_split(r) for r in rows]
    out: dict[str, Any] = {"steps": steps, "median": medians(steps) if steps else {}}
    tps = [float(r["perf/tokens_per_s"]) for r in rows if "perf/tokens_per_s" in r]
    out["tokens_per_s"] = statistics.median(tps) if tps else None
    gen = [float(r["perf/gen_tokens_per_s"]) for r in rows if "perf/gen_tokens_per_s" in r]
    out["gen_tokens_per_s"] = statistics.median(gen) if gen else None
    out["mfu"] = None
    if params and peak_flops:
        per = [6 * params * float(r["perf/tokens_per_s"]) * float(r["timing_s/step"]) * ppo_epochs
               / float(r["timing_s/update"]) / peak_flops
               for r in rows if r.get("timing_s/update") and "perf/tokens_per_s" in r]
        out["mfu"] = statistics.median(per) if per else None
    return out


# ---------------------------------------------------------------- compare


def compare_docs(a: dict[str, Any], b: dict[str, Any], *, seed: int = 0, boot: int = harness.BOOT
                 ) -> list[dict[str, Any]]:
    """Per workload present in both with status ok, per component sampled on both sides: the ratio B / A of the
    medians with its bootstrap 95% interval (independent samples: steps of two runs are not paired). A workload
    that ran on one side only is listed with its statuses."""
    out = []
    for name in dict.fromkeys([*a.get("workloads", {}), *b.get("workloads", {})]):
        wa, wb = a["workloads"].get(name, {}), b["workloads"].get(name, {})
        if wa.get("status") != "ok" or wb.get("status") != "ok":
            out.append({"workload": name, "status_a": wa.get("status", "absent"),
                        "status_b": wb.get("status", "absent")})
            continue
        for comp in dict.fromkeys([*wa.get("median", {}), *wb.get("median", {})]):
            xs = [s[comp] for s in wa["steps"] if comp in s]
            ys = [s[comp] for s in wb["steps"] if comp in s]
            if not xs or not ys or statistics.median(xs) <= 0:
                continue
            cmp = harness.compare(f"{name} {comp}", xs, ys, False, seed=seed, boot=boot)
            out.append({"workload": name, "component": comp, "ratio": cmp.ratio, "lo": cmp.lo, "hi": cmp.hi,
                        "n_a": len(xs), "n_b": len(ys), "median_a": statistics.median(xs),
                        "median_b": statistics.median(ys)})
        for key in ("peak_rss_mb", "tokens_per_s"):
            if wa.get(key) and wb.get(key):
                out.append({"workload": name, "component": key, "ratio": wb[key] / wa[key], "lo": None, "hi": None,
                            "median_a": wa[key], "median_b": wb[key]})
    return out


def compare_lines(a: dict[str, Any], b: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"A: {a.get('commit', '?')[:10]}{' (dirty)' if a.get('dirty') else ''} {a.get('date', '')} "
             f"{a.get('mode', '')}", f"B: {b.get('commit', '?')[:10]}{' (dirty)' if b.get('dirty') else ''} "
             f"{b.get('date', '')} {b.get('mode', '')}",
             "ratio = B / A of the medians (times: below 1 means B is faster), bootstrap 95% interval over the "
             "steps (independent samples)"]
    if a.get("ab") and b.get("ab") and a.get("date") == b.get("date"):
        lines.append(f"the two sides of one --ab invocation: their workloads interleaved in {a['ab']['rounds']} "
                     f"round(s) ({a['ab']['order']})")
    else:
        lines.append(f"note: {DRIFT_NOTE}")
    if a.get("mode") != b.get("mode"):
        lines.append(f"warning: modes differ ({a.get('mode')} vs {b.get('mode')}): the workloads differ in size")
    for r in rows:
        if "status_a" in r:
            lines.append(f"{r['workload']}: not compared (A {r['status_a']}, B {r['status_b']})")
        elif r["lo"] is None:
            higher = " (a throughput: above 1 means B is faster)" if r["component"] == "tokens_per_s" else ""
            lines.append(f"{r['workload']} {r['component']}: {r['ratio']:.2f} x (A {r['median_a']:.4g}, "
                         f"B {r['median_b']:.4g}; one value per side, no interval){higher}")
        else:
            lines.append(f"{r['workload']} {r['component']}: {r['ratio']:.2f} x [{r['lo']:.2f}, {r['hi']:.2f}]"
                         f"   (A {r['median_a']:.4g} s, B {r['median_b']:.4g} s; {r['n_a']} / {r['n_b']} samples)")
    return lines


# ---------------------------------------------------------------- table


def _fmt(x: Any, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _load(xs: Any) -> str:
    return "/".join(f"{x:.2f}" for x in xs) if xs else "?"


def table(doc: dict[str, Any]) -> str:
    """Markdown: one row per workload, the medians of the split (seconds), tokens/s, peak RSS, MFU; workloads whose
    samples are not RL steps (sandbox, weight sync) give their own components in the last column."""
    m = doc.get("machine", {})
    head = (f"Suite v{doc.get('suite_version')}, {doc.get('mode')} mode, commit {str(doc.get('commit'))[:10]}"
            f"{' (dirty)' if doc.get('dirty') else ''}, {doc.get('date')}; {m.get('cores')} cores "
            f"({m.get('cpu_model')}), {_fmt(m.get('ram_gb'), '.0f')} GB RAM, load average {_load(m.get('load_before'))} "
            f"before, {_load(m.get('load_after'))} after; torch {m.get('torch')}. Medians in seconds over the timed "
            f"steps.")
    cols = ["workload", "status", "step", *SPLIT, "other", "tokens/s", "peak RSS MB", "MFU", "other samples (median)"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, w in doc.get("workloads", {}).items():
        med = w.get("median", {})
        cells = [name, w.get("status", "?") if w.get("status") == "ok" else f"{w.get('status')}: {w.get('reason', '')}"]
        cells += [_fmt(med.get(c), ".3f") for c in ("step", *SPLIT, "other")]
        cells += [_fmt(w.get("tokens_per_s"), ",.0f"), _fmt(w.get("peak_rss_mb"), ",.0f"),
                  "" if w.get("mfu") is None else f"{w['mfu']:.1%}"]
        cells.append(", ".join(f"{k} {v:.4g} s" for k, v in med.items() if k not in COMPONENTS))
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def replace_table(text: str, new: str) -> str:
    """`text` with what lies between the suite-table markers replaced by `new`."""
    i, j = text.find(START), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"the markers {START} / {END} are missing (or out of order)")
    return text[:i + len(START)] + "\n" + new.strip() + "\n" + text[j:]


def write_docs(doc: dict[str, Any], path: Path) -> None:
    path.write_text(replace_table(path.read_text(), table(doc)))
