"""``credo export RUN_DIR [--checkpoint step_N] --out DIR``: a plain Hugging Face directory of a run's policy.

A LoRA run's policy (``model.lora``) is an adapter directory naming its base (credo.models.lora): the adapter is
merged into the base (W <- W + (alpha / r) B A, PEFT's ``merge_and_unload``) and the result saved as an ordinary
model directory that ``transformers.AutoModelForCausalLM.from_pretrained`` loads without peft or credo. A full
fine-tuning run's policy already is such a directory: it is copied.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path



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
    intact checkpoint's."""
    from credo.train.checkpoint import CKPT_DIR, STEP_NAME, checkpoint_problem, latest_checkpoint  # torch: lazily

    if checkpoint is not None:
        if not STEP_NAME.fullmatch(checkpoint):
            raise ValueError(f"--checkpoint {checkpoint!r}: give a checkpoint name such as step_000040")
        ckpt = run_dir / CKPT_DIR / checkpoint
        problem = checkpoint_problem(ckpt) if ckpt.is_dir() else f"{ckpt} does not exist"
        if problem:
            raise FileNotFoundError(problem)
        return ckpt / "model"
    if (run_dir / "final").is_dir():
        return run_dir / "final"
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir} has neither a final model nor an intact checkpoint")
    return ckpt / "model"


def export(run_dir: Path, out: Path, *, checkpoint: str | None = None) -> Path:
    """Write the run's policy to ``out`` as a plain Hugging Face directory; returns ``out``."""
    from credo.models.build import merged_adapter_model, save_model
    from credo.models.lora import is_adapter_dir

    source = policy_dir(run_dir, checkpoint)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"--out {out} is not empty")
    if not is_adapter_dir(source):
        if not (source / "config.json").is_file():
            raise FileNotFoundError(f"{source} is not a model directory (no config.json)")
        shutil.copytree(source, out, dirs_exist_ok=True)
        return out
    model, tokenizer = merged_adapter_model(source)
    save_model(model, tokenizer, out)
    return out
