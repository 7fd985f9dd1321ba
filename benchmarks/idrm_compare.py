"""Interaction Distillation against plain Bradley-Terry on the generated reversal pairs (spec B.5).

For each label-noise rate: a BT value-head run (``rm.method=bt``), then ID-RM arms (``both``: intra + inter, ``intra``
only, ``inter`` only) that share one teacher (trained by the first ID-RM arm, loaded by the others through
``idrm.teacher``). Every model is scored on the same held-out pairs: accuracy overall and by corruption kind, the
EOS row's attention mass per fifth, and accuracy against a masked prefix.

    OMP_NUM_THREADS=1 python benchmarks/idrm_compare.py --noise 0,0.2,0.4 --arms bt,both,intra,inter \
        --out /tmp/idrm.json [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from credo.config import load_config
from credo.methods.reward_models.idrm.evaluate import masked_prefix_accuracy, student_by_kind
from credo.methods.reward_models.idrm.student import eos_attention_mass
from credo.methods.reward_models.config import RmRunConfig
from credo.methods.reward_models.pairs import preference_data
from credo.methods.reward_models.recipe import rm_train
from credo.models import ValueModel, load_tokenizer

ARMS = {"bt": ["rm.method=bt"], "both": ["rm.method=idrm"],
        "intra": ["rm.method=idrm", "idrm.inter_coef=0"], "inter": ["rm.method=idrm", "idrm.intra_coef=0"]}


def score(run: Path, cfg) -> dict[str, float]:
    rm = ValueModel.load(run / "reward_model").eval()
    tok = load_tokenizer(run / "reward_model")
    _, held_out, _ = preference_data(cfg)
    out = {f"acc/{k}": v for k, v in student_by_kind(rm, tok, held_out).items()}
    out |= {f"mass_q{i + 1}": float(m) for i, m in enumerate(eos_attention_mass(rm, tok, held_out))}
    out |= {f"masked/{k}": v for k, v in masked_prefix_accuracy(rm, tok, held_out).items()}
    summary = json.loads((run / "summary.json").read_text())
    out |= {k: v for k, v in summary.items()
            if k.startswith("teacher") or k in ("train_wall_s", "final/eval/pairwise_acc")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--noise", default="0,0.2,0.4")
    ap.add_argument("--arms", default="bt,both,intra,inter")
    ap.add_argument("--root", default="/tmp/idrm_compare")
    ap.add_argument("--out", default="/tmp/idrm_compare.json")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    for noise in [float(x) for x in args.noise.split(",")]:
        teacher = None
        for arm in args.arms.split(","):
            key = f"{noise}/{arm}"
            run = Path(args.root) / f"noise{noise}-{arm}"
            extra = [f"idrm.teacher={teacher}"] if teacher and arm != "bt" else []
            cfg = load_config(None, [*ARMS[arm], f"rm.noise={noise}", "log.progress=false", "log.tensorboard=false",
                                     *args.overrides, *extra], root=RmRunConfig)
            if key not in results:
                t0 = time.perf_counter()
                try:
                    rm_train(cfg, run_dir=run, overwrite=True)
                    results[key] = score(run, cfg) | {"wall_s": round(time.perf_counter() - t0, 1)}
                except ValueError as exc:  # the teacher gate
                    results[key] = {"error": str(exc)}
                Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
            print(key, json.dumps(results[key]), flush=True)
            if arm != "bt" and teacher is None and (run / "teacher").is_dir():
                teacher = run / "teacher"


if __name__ == "__main__":
    main()
