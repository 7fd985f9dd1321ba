"""``credo export RUN_DIR [--checkpoint step_N] --out DIR``: a plain Hugging Face directory of a run's policy.

A LoRA run's policy (``model.lora``) is an adapter directory naming its base (credo.models.lora): the adapter is
merged into the base (W <- W + (alpha / r) B A, PEFT's ``merge_and_unload``) and the result saved as an ordinary
model directory that ``transformers.AutoModelForCausalLM.from_pretrained`` loads without peft or credo. A full
fine-tuning run's policy already is such a directory: it is copied.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def add_commands(sub) -> None:
    p = sub.add_parser("export", help="write a run's policy as a plain Hugging Face directory (a LoRA adapter is "
                       "merged into its base)")
    p.add_argument("run_dir", help="a run directory")
    p.add_argument("--checkpoint", default=None, metavar="step_N",
                   help="export this checkpoint (default: the final model, else the latest checkpoint)")
    p.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    out = export(Path(args.run_dir), Path(args.out), checkpoint=args.checkpoint)
    print(f"exported {out}")
    return 0


def policy_dir(run_dir: Path, checkpoint: str | None = None) -> Path:
    """The policy directory of a run: ``checkpoints/step_N/model`` when asked, else ``final``, else the latest
    intact checkpoint's. The run directory must hold no link (credo.tracking.rundir.check_run_dir) and the chosen
    folder must match its manifest (``final/MANIFEST.json``, written since credo marks its runs; an older
    ``final`` without one is accepted with a warning)."""
    from credo.tracking.rundir import check_run_dir
    from credo.train.checkpoint import (CKPT_DIR, MANIFEST, STEP_NAME, checkpoint_problem, latest_checkpoint,
                                        manifest_problem)  # torch: lazily

    check_run_dir(run_dir, "credo export")
    if checkpoint is not None:
        if not STEP_NAME.fullmatch(checkpoint):
            raise ValueError(f"--checkpoint {checkpoint!r}: give a checkpoint name such as step_000040")
        ckpt = run_dir / CKPT_DIR / checkpoint
        problem = checkpoint_problem(ckpt) if ckpt.is_dir() else f"{ckpt} does not exist"
        if problem:
            raise FileNotFoundError(problem)
        return ckpt / "model"
    final = run_dir / "final"
    if final.is_dir():
        if (final / MANIFEST).is_file():
            problem = manifest_problem(final)
            if problem:
                raise FileNotFoundError(f"credo export: {problem}")
        else:
            log.warning("%s has no %s (written by an older credo): its files are not checksummed", final, MANIFEST)
        return final
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir} has neither a final model nor an intact checkpoint")
    return ckpt / "model"


def export(run_dir: Path, out: Path, *, checkpoint: str | None = None) -> Path:
    """Write the run's policy to ``out`` as a plain Hugging Face directory; returns ``out``. Files are copied
    without following links (a link is refused, never copied through)."""
    from credo.models.build import merged_adapter_model, save_model
    from credo.models.lora import is_adapter_dir

    source = policy_dir(run_dir, checkpoint)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"--out {out} is not empty")
    if not is_adapter_dir(source):
        if not (source / "config.json").is_file():
            raise FileNotFoundError(f"{source} is not a model directory (no config.json)")
        copy_without_links(source, out)
        record_base_model(run_dir, out)
        return out
    model, tokenizer = merged_adapter_model(source)
    save_model(model, tokenizer, out)
    record_base_model(run_dir, out)
    return out


BASE_RECORD = "credo_base_model.json"


def record_base_model(run_dir: Path, out: Path) -> None:
    """``OUT/credo_base_model.json`` ({"repo_id", "revision"}) when the run started from a hub model: its
    ``config.yaml`` names it pinned to a commit (credo.recipes.preflight.pin_hub_ids; docs/bring-your-own.md)."""
    import json

    from credo.config.hub_ref import parse_hub_id
    from credo.config.yaml_safe import YamlConfigError, read_mapping

    try:
        model = read_mapping(run_dir / "config.yaml").get("model") or {}
    except (OSError, YamlConfigError):
        return
    ref = parse_hub_id(model.get("path")) if isinstance(model, dict) else None
    if ref is not None and not Path(str(model.get("path"))).expanduser().exists():
        (out / BASE_RECORD).write_text(json.dumps({"repo_id": ref.repo_id, "revision": ref.revision}) + "\n")


def copy_without_links(source: Path, out: Path) -> None:
    """Copy the regular files under ``source`` to ``out`` (not ``MANIFEST.json``), each opened with
    ``O_NOFOLLOW``: a link, even one planted after the checks, is an error and nothing is read through it."""
    import os

    for dirpath, dirnames, filenames in os.walk(source):
        rel = Path(dirpath).relative_to(source)
        for name in dirnames:
            if (Path(dirpath) / name).is_symlink():
                raise ValueError(f"credo export: {Path(dirpath) / name} is a symlink: not copied")
        (out / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            if rel == Path(".") and name == "MANIFEST.json":
                continue
            fd = os.open(Path(dirpath) / name, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as src, open(out / rel / name, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
