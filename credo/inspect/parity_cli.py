"""``credo parity MODEL [--engine hf|vllm] [--dtype D] [--rows N] [--seed S] [--json] [--out FILE]
[--max-out-of-range FRAC] [key=value ...]``: trainer / engine log-prob parity (:mod:`credo.inspect.parity`,
docs/parity.md). MODEL is a local Hugging Face directory, a hub id (credo.models.hub; the cache alone with
HF_HUB_OFFLINE=1) or ``tiny``: the model ``credo train`` builds with model.path=null (sizes from ``model.*``).

Exit 0, or 1 with ``--max-out-of-range FRAC`` when some comparison's share of tokens outside [0.9, 1.1] exceeds
FRAC (a gate for CI and GPU scripts)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from credo.recipes.cli_common import config_args

DTYPES = ("float32", "bfloat16", "float16")


def add_commands(sub) -> None:
    p = sub.add_parser("parity", help="per-token log-prob differences between the trainer's forward and the "
                       "engine's sampler, per layout, and the first diverging layer (docs/parity.md)")
    p.add_argument("model", metavar="MODEL", help="a model directory, a hub id, or 'tiny' (a freshly built model "
                   "from model.*)")
    config_args(p)
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="the sampler: credo's HF engine "
                   "(default) or vLLM (rollout.vllm.* apply)")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="parameter dtype of both sides (default model.dtype)")
    p.add_argument("--rows", type=int, default=16, metavar="N", help="sampled rows (rollout.group_size per prompt)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="prompts, draws and a tiny model's weights")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    p.add_argument("--out", metavar="FILE", default=None, help="also write the JSON report to FILE")
    p.add_argument("--max-out-of-range", type=float, default=None, metavar="FRAC",
                   help="exit 1 when a comparison's share of tokens with exp(trainer - engine) outside [0.9, 1.1] "
                   "exceeds FRAC")
    p.add_argument("--layer-tol", type=float, default=None, metavar="X",
                   help="relative per-layer difference counted as divergence (default 1e-4)")
    p.add_argument("--no-layers", action="store_true", help="skip the per-layer localisation")
    p.set_defaults(func=cmd_parity)


def load_policy(name: str, cfg, seed: int):
    """(model, tokenizer) of MODEL: ``tiny`` builds ``cfg.model``'s sizes (seeded), anything else is loaded."""
    from credo.models.build import build_model, load_model

    if name == "tiny":
        return build_model(dataclasses.replace(cfg.model, path=None), seed=seed)
    return load_model(name, cfg.model)


def cmd_parity(args: argparse.Namespace) -> int:
    from credo.config import load_config
    from credo.inspect.parity import ParityOptions, measure
    from credo.inspect.parity_layers import LAYER_TOL

    if args.rows < 1:
        raise ValueError("--rows must be >= 1")
    cfg = load_config(args.config, args.overrides)
    if args.dtype is not None:
        cfg.model.dtype = args.dtype
    model, tok = load_policy(args.model, cfg, args.seed)
    opts = ParityOptions(engine=args.engine, rows=args.rows, seed=args.seed, layers=not args.no_layers,
                         layer_tol=LAYER_TOL if args.layer_tol is None else args.layer_tol)
    report = {"model": args.model, **measure(model, tok, cfg, opts)}
    gate = args.max_out_of_range
    report["max_out_of_range"] = gate
    report["passed"] = gate is None or (report["worst_out_of_range"] or 0.0) <= gate
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text if args.json else render(report))
    if not report["passed"]:
        print(f"credo parity: {report['worst_out_of_range']:.4%} of tokens outside [0.9, 1.1] exceeds "
              f"--max-out-of-range {gate}", file=sys.stderr)
        return 1
    return 0


def _num(x, fmt: str = ".2e") -> str:
    return "-" if x is None else format(x, fmt)


def render(report: dict) -> str:
    """The report as a readable table."""
    lines = [f"credo parity: {report['model']}  engine={report['engine']}  dtype={report['dtype']}  "
             f"device={report['device']}  rows={report['rows']} ({report['prompts']} prompts)  seed={report['seed']}",
             f"|logprob(trainer) - logprob(engine)| per token; out = share of tokens with exp(diff) outside "
             f"[{report['bounds'][0]}, {report['bounds'][1]}]", ""]
    head = f"{'comparison':<30} {'tokens':>6} {'mean':>9} {'p99':>9} {'max':>9} {'out':>8}  notes"
    lines += [head, "-" * len(head)]
    for v in report["variants"]:
        notes = [f"{k}={v[k]}" for k in ("reused_tokens", "cached_tokens", "prefix_caching") if k in v]
        if v.get("vs_padded_max_abs") is not None:
            notes.insert(0, f"vs padded {v['vs_padded_max_abs']:.1e}")
        if v["name"].startswith("trainer:shared_prompt") and not report["shared_prompts"]:
            notes.append("no two rows share a prompt: the padded forward")
        lines.append(f"{v['name']:<30} {v['tokens']:>6} {_num(v['mean_abs']):>9} {_num(v['p99_abs']):>9} "
                     f"{_num(v['max_abs']):>9} {_num(v['out_of_range'], '.2%'):>8}  {', '.join(notes)}")
    layers = report.get("layers")
    if layers:
        lines += ["", f"first diverging layer (max |a - b| / max |a| > {layers['tol']:g}; layers: "
                  f"{' '.join(layers['names'])})"]
        for c in layers["comparisons"]:
            pair = f"{c['a']} vs {c['b']}"
            if "skipped" in c:
                lines.append(f"  {pair}: not compared: {c['skipped']}")
                continue
            rel = " ".join(f"{r['rel']:.1e}" for r in c["per_layer"])
            lines.append(f"  {pair}: {c['first_diverging'] or 'none'}  (per layer: {rel})")
        if layers.get("note"):
            lines.append(f"  note: {layers['note']}")
    if report.get("max_out_of_range") is not None:
        lines += ["", f"worst out-of-range share {_num(report['worst_out_of_range'], '.4%')} vs gate "
                  f"{report['max_out_of_range']}: {'passed' if report['passed'] else 'FAILED'}"]
    return "\n".join(lines)
