"""``credo rlep collect``: RLEP's pool of verified answers from a checkpoint (:mod:`credo.methods.rlep.recipe`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from credo.recipes.cli_common import config_args


def add_commands(sub) -> None:
    p = sub.add_parser("rlep", help="RLEP experience replay: collect a pool of verified answers from a checkpoint")
    rlep_sub = p.add_subparsers(dest="rlep_command", required=True, metavar="ACTION")
    q = rlep_sub.add_parser("collect", help="sample replay.collect_samples answers per training prompt, keep the "
                            "verified ones (replay.* settings) -> JSONL for replay.pool")
    q.add_argument("target", help="a run directory (final model or latest checkpoint), RUN/checkpoints/step_N, or a "
                   "Hugging Face model directory")
    q.add_argument("--out", default="replay_pool.jsonl", help="pool file to write (default replay_pool.jsonl)")
    config_args(q)
    q.set_defaults(func=cmd_rlep_collect)


def cmd_rlep_collect(args: argparse.Namespace) -> int:
    from credo.methods.rlep.recipe import rlep_collect

    stats = rlep_collect(Path(args.target), Path(args.out), args.config, args.overrides)
    print(f"pool: {args.out} ({stats['stored_answers']} answers of {stats['stored_prompts']}/{stats['prompts']} "
          f"prompts; sampled accuracy {stats['sampled_accuracy']:.3f})")
    return 0
