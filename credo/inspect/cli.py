"""``credo inspect RUN --step N [--losses a,b] [--estimators x,y] [--out FILE] [--format html|json]``."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_commands(sub) -> None:
    p = sub.add_parser("inspect", help="replay a dumped rollout step through losses and estimators: per-token "
                       "advantages, ratios, gradient weights, clip regions, disagreements (HTML or JSON)")
    p.add_argument("run_dir", help="a run directory trained with log.rollouts_every=N")
    p.add_argument("--step", type=int, required=True, help="the dumped step (rollouts.jsonl's step)")
    p.add_argument("--losses", default=None, help="comma-separated policy losses (default: the run's)")
    p.add_argument("--estimators", default=None, help="comma-separated advantage estimators (default: the run's)")
    p.add_argument("--format", choices=("html", "json"), default="html")
    p.add_argument("--out", default=None, help="output file (default RUN/inspect/step_N.html or .json; - = stdout)")
    p.add_argument("--samples", type=int, default=None, help="per-sample sections on the page (default all)")
    p.add_argument("--device", default=None, help="device for recomputing log-probs (default the run's model.device)")
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    from credo.inspect.core import inspect_run
    from credo.inspect.page import render_html, to_json
    from credo.tracking.atomic import atomic_write_text
    from credo.tracking.rundir import check_run_dir

    check_run_dir(Path(args.run_dir), "credo inspect")  # no links out of the run (credo.tracking.rundir)
    ins = inspect_run(Path(args.run_dir), args.step, losses=args.losses, estimators=args.estimators,
                      device=args.device)
    text = json.dumps(to_json(ins)) if args.format == "json" else render_html(ins, max_samples=args.samples)
    if args.out == "-":
        print(text)
        return 0
    out = Path(args.out) if args.out else Path(args.run_dir) / "inspect" / f"step_{args.step}.{args.format}"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)
    print(out)
    for s in ins.skipped:
        print(f"skipped {s.kind} {s.name}: {s.reason}")
    return 0
