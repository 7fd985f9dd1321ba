"""``credo config show [--config P] [key=value ...] [--given] [--json]``: the effective configuration of a
``credo train`` run, each key with its source (``default``, ``preset`` or ``override``) and, for a key the run will
not read, the setting it would need (:mod:`credo.config.reads`; docs/guarantees.md, "No silent no-ops").

Nothing is built or run; a key ``credo train`` would refuse is marked ``REFUSED`` here (the command still prints
the whole configuration, and exits 2 so a script can gate on it)."""
from __future__ import annotations

import argparse
import json
from typing import Any

from credo.config.loader import load_config_sources
from credo.config.reads import leaf_keys, unread_keys, verdicts
from credo.recipes.cli_common import config_args

EXIT_REFUSED = 2


def add_commands(sub) -> None:
    p = sub.add_parser("config", help="the effective configuration: each key's value, source and whether the run "
                       "reads it")
    config_sub = p.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    q = config_sub.add_parser("show", help="print the effective configuration with each key's source (default, "
                              "preset, override), marking the keys the run will not read")
    config_args(q)
    q.add_argument("--given", action="store_true", help="only the keys a preset or an override gives")
    q.add_argument("--json", action="store_true", help="one JSON object: key -> {value, source, read, needs}")
    q.set_defaults(func=cmd_config_show)


def rows(cfg: Any, sources: dict[str, str]) -> list[dict[str, Any]]:
    """One row per key: ``key, value, source, read`` (bool), ``needs`` (what a key not read would need), and
    ``refused`` / ``warned``: what ``credo train`` does with it (credo.config.reads.verdicts)."""
    unread, judged, out = unread_keys(cfg), verdicts(cfg, sources), []
    for key, (value, _, _) in leaf_keys(cfg).items():
        u, verdict = unread.get(key), judged.get(key, (None,))[0]
        out.append({"key": key, "value": value, "source": sources.get(key, "default"), "read": u is None,
                    "needs": None if u is None else u.says(), "refused": verdict == "refuse",
                    "warned": verdict == "warn"})
    return out


def format_rows(table: list[dict[str, Any]]) -> str:
    width = max((len(r["key"]) for r in table), default=0)
    lines = []
    for r in table:
        mark = "" if r["read"] else f"  # not read: only with {r['needs']}"
        if r["refused"]:
            mark += " (REFUSED: credo train refuses a given key it would not read)"
        elif r["warned"]:
            mark += " (a warning: harmless, or an override turned its stage off)"
        lines.append(f"{r['key']:<{width}} = {json.dumps(r['value'], default=str):<24} [{r['source']}]{mark}")
    return "\n".join(lines)


def cmd_config_show(args: argparse.Namespace) -> int:
    cfg, sources = load_config_sources(args.config, args.overrides)
    table = rows(cfg, sources)
    shown = [r for r in table if r["source"] != "default"] if args.given else table
    if args.json:
        print(json.dumps({r["key"]: {k: v for k, v in r.items() if k != "key"} for r in shown}, indent=1,
                         default=str))
    else:
        print(format_rows(shown))
        unread = sum(not r["read"] for r in table)
        print(f"# {len(table)} keys, {unread} not read by this run, "
              f"{sum(r['refused'] for r in table)} refused")
    return EXIT_REFUSED if any(r["refused"] for r in table) else 0
