"""VEPO with images: which response tokens react to each image perturbation (docs/algorithms/vepo.md "Images").

SFTs the ``vepo_vision`` preset's tiny LLaVA on ``shapes`` colour questions, teacher-forces held-out questions
with their answers, and prints a markdown row per perturbation: mean Vis (JSD + positive entropy gap) on the
colour word's first character (the token the image decides), on the following characters (fixed by the text) and
on EOS, and the share of VEPO's top 20% by Vis x H that falls on the colour token and on EOS.

    OMP_NUM_THREADS=1 python benchmarks/vepo_image_vis.py --sft-steps 300 --seed 0
"""
from __future__ import annotations

import argparse
import time

import torch

from credo.config import load_config
from credo.data.source import load_task_data
from credo.methods.vepo.algo import grounding_sensitivity
from credo.methods.vepo.select import grounding_stats, perturbed_image_batch, select
from credo.models import build_model
from credo.models.vision import expand_image_prompts
from credo.train.forward import ForwardOptions
from credo.train.sft import demonstration_batch, run_sft
from credo.types import Trajectory

PERTURBATIONS = (("gaussian", {}), ("gaussian", {"std": 0.25}), ("patch_blacken", {}), ("grey", {}), ("blur", {}),
                 ("blur", {"radius": 2.0}), ("resample", {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=96)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config("vepo_vision")
    model, tok = build_model(cfg.model, seed=args.seed)
    data = expand_image_prompts(load_task_data(cfg.task, seed=args.seed), model)
    evals = data.eval[: args.examples]
    batch = demonstration_batch(tok, evals, lambda e: e.answer)
    trajs = [Trajectory(example=e, group_id=0, prompt_ids=[], response_ids=[], rollout_logprobs=[],
                        response_mask=[], finish_reason="eos") for e in evals]
    mask = batch.response_mask.bool()
    eos = (batch.responses == tok.eos_token_id) & mask
    first = torch.zeros_like(mask)
    first[:, 0] = True
    rest = mask & ~eos & ~first
    t0 = time.perf_counter()
    if args.sft_steps:
        run_sft(model, tok, data.train, data.demonstration, steps=args.sft_steps, batch_size=32, lr=3e-3,
                warmup_steps=5, seed=args.seed)
    print(f"SFT {args.sft_steps} steps in {time.perf_counter() - t0:.0f} s, seed {args.seed}; colour tokens are "
          f"{float(first.sum()) / float(mask.sum()):.0%} of the tokens")
    print("| perturbation | Vis colour token | Vis following characters | Vis EOS | H colour token "
          "| top 20% on the colour token | top 20% on EOS |")
    print("|---|---|---|---|---|---|---|")
    for name, kwargs in PERTURBATIONS:
        pb = perturbed_image_batch(batch, trajs, perturb=name, perturb_args=kwargs, regions="whole", seed=0, step=0)
        st = grounding_stats(model, batch, pb, opts=ForwardOptions())
        vis = grounding_sensitivity(st.jsd, st.gap, batch.response_mask)
        sel = select(st, batch.response_mask, top_fraction=0.2).selected
        n = max(float(sel.sum()), 1.0)
        label = name + "".join(f" {k} {v}" for k, v in kwargs.items())
        print(f"| `{label}` | {vis[first].mean():.4f} | {vis[rest].mean():.4f} | {vis[eos].mean():.4f} "
              f"| {st.entropy[first].mean():.3f} | {float((sel & first).sum()) / n:.0%} "
              f"| {float((sel & eos).sum()) / n:.0%} |", flush=True)


if __name__ == "__main__":
    main()
