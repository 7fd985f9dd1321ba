"""Pieces shared by the ``credo`` subcommands, including those that method packages and ``credo plan`` add
(:func:`credo.methods.reward_models.cli.add_commands`, :func:`credo.methods.rlep.cli.add_commands`). They sit
here, below the method packages, rather than in :mod:`credo.cli` (the top layer, which nothing imports)."""
from __future__ import annotations

import argparse
import contextlib
from datetime import datetime
from pathlib import Path

from credo.tracking.rundir import MARKER


def config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="PRESET", help="YAML file or preset name in configs/")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (it may register environments, AgentGym adapters, rewards, tasks); "
                   "repeatable; recorded in the run's config as plugins")
    p.set_defaults(overrides=[])  # filled from key=value arguments anywhere on the line
    p.epilog = ("Any number of key=value config overrides may appear anywhere on the line, e.g. "
                "train.steps=20 algo.policy_loss_args.clip_high=0.28 (reference: README, 'Configuration').")


def run_dir_args(p: argparse.ArgumentParser, default: str) -> None:
    """``--run-dir`` and ``--overwrite`` of a command that writes a run directory."""
    p.add_argument("--run-dir", metavar="DIR", help=f"output directory (default {default})")
    p.add_argument("--overwrite", action="store_true", help="delete what a previous credo run wrote in the run "
                   "directory first (a new run refuses a non-empty one; a folder without credo's .credo-run marker "
                   "is refused, files credo did not write are kept)")


@contextlib.contextmanager
def no_half_made_run_dir(run_dir: Path):
    """Remove ``run_dir`` again if this command created it and fails while it holds nothing but the run's
    ``config.yaml`` and credo's marker (a data or model error after the preflight)."""
    created = not run_dir.exists()
    try:
        yield
    except BaseException:
        if created and run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {"config.yaml", MARKER}:
            (run_dir / "config.yaml").unlink(missing_ok=True)
            (run_dir / MARKER).unlink(missing_ok=True)
            run_dir.rmdir()
        raise


def target_run_dir(cfg, run_dir: str | None, default_name: str) -> Path:
    """The run directory a new run will use: ``--run-dir``, else ``output_dir/run_name``; without a ``run_name``
    one is chosen here (``DEFAULT_NAME-YYYYmmdd-HHMMSS``, the name the recipe would choose) and set in ``cfg``, so
    that a failed start can remove the folder it made (:func:`no_half_made_run_dir`)."""
    if run_dir:
        return Path(run_dir)
    if not cfg.run_name:
        cfg.run_name = f"{default_name}-{datetime.now():%Y%m%d-%H%M%S}"
    return Path(cfg.output_dir) / cfg.run_name
