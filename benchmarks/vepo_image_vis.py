"""VEPO with images: which response tokens react to each image perturbation (docs/algorithms/vepo.md "Images").

SFTs the ``vepo_vision`` preset's tiny LLaVA on ``shapes`` colour questions, teacher-forces held-out questions
with their answers, and prints a markdown row per perturbation: mean Vis (JSD + positive entropy gap) on the
colour word's first character (the token the image decides), on the following characters (fixed by the text) and
on EOS, and the share of VEPO's top 20% by Vis x H that falls on the colour token and on EOS.

    OMP_NUM_THREADS=1 python benchmarks/vepo_image_vis.py --sft-steps 300 --seed 0

``--seeds 0,1,2,3,4 --json PATH`` instead compares, per seed (SFT seed and data draw), the tokens VEPO selects
(top 20% by Vis x H; arm ``vepo``: Vis from the preset's perturbation, ``gaussian`` std 0.74; arm ``vepo_grey``:
``grey``) with the tokens entropy-only selection keeps (top 20% by H, the ``token_select.type=entropy`` arm) on the same model and batch, and writes
credo compare's JSON shape (``credo.report.stats.write_compare_json``; baseline ``entropy``). The visual
sensitivity of a selection is measured with an independent perturbation, ``resample`` (the scene re-rendered with
the queried colour redrawn; another seed than the selection's), so VEPO is not scored by its own criterion; the
share of the selection on the colour token (the one token the image decides) is the ground truth.
"""
from __future__ import annotations

import argparse
import time

import torch

from credo.config import load_config
from credo.data.source import load_task_data
from credo.methods.vepo.algo import grounding_sensitivity, top_fraction_mask
from credo.methods.vepo.select import grounding_stats, perturbed_image_batch, select
from credo.models import build_model
from credo.models.vision import expand_image_prompts
from credo.train.forward import ForwardOptions
from credo.train.sft import demonstration_batch, run_sft
from credo.types import Trajectory

PERTURBATIONS = (("gaussian", {}), ("gaussian", {"std": 0.25}), ("patch_blacken", {}), ("grey", {}), ("blur", {}),
                 ("blur", {"radius": 2.0}), ("resample", {}))
SELECT_PERTURBS = {"vepo": ("gaussian", {"std": 0.74}),  # the vepo_vision preset's
                   "vepo_grey": ("grey", {})}  # the perturbation that removes the colour (the sweep's best)
PROBE_PERTURB = ("resample", {})  # the independent measure of visual sensitivity


def setup(seed: int, sft_steps: int, examples: int):
    """(model, batch, trajs, token masks {valid, colour, rest, eos}) after ``sft_steps`` SFT steps at ``seed``."""
    cfg = load_config("vepo_vision")
    model, tok = build_model(cfg.model, seed=seed)
    data = expand_image_prompts(load_task_data(cfg.task, seed=seed), model)
    evals = data.eval[:examples]
    batch = demonstration_batch(tok, evals, lambda e: e.answer)
    trajs = [Trajectory(example=e, group_id=0, prompt_ids=[], response_ids=[], rollout_logprobs=[],
                        response_mask=[], finish_reason="eos") for e in evals]
    mask = batch.response_mask.bool()
    eos = (batch.responses == tok.eos_token_id) & mask
    first = torch.zeros_like(mask)
    first[:, 0] = True
    if sft_steps:
        run_sft(model, tok, data.train, data.demonstration, steps=sft_steps, batch_size=32, lr=3e-3,
                warmup_steps=5, seed=seed)
    return model, batch, trajs, {"valid": mask, "colour": first & mask, "rest": mask & ~eos & ~first, "eos": eos}


def selection_rows(sel: torch.Tensor, vis_probe: torch.Tensor, entropy: torch.Tensor,
                   masks: dict[str, torch.Tensor]) -> dict[str, float]:
    """What one selection (bool (B, T)) holds: the mean probe Vis and entropy of its tokens, and its shares on the
    colour token and on EOS."""
    n = max(float(sel.sum()), 1.0)
    return {"vis_resample": float(vis_probe[sel].mean()), "entropy": float(entropy[sel].mean()),
            "colour_share": float((sel & masks["colour"]).sum()) / n, "eos_share": float((sel & masks["eos"]).sum()) / n}


def compare_seed(seed: int, sft_steps: int, examples: int, top_fraction: float = 0.2) -> dict[str, dict[str, float]]:
    """{arm: {metric: value}} for arms ``vepo`` and ``entropy`` on one seed's model and batch."""
    model, batch, trajs, masks = setup(seed, sft_steps, examples)
    mask = batch.response_mask
    name, kwargs = PROBE_PERTURB
    probe_b = perturbed_image_batch(batch, trajs, perturb=name, perturb_args=kwargs, regions="whole",
                                    seed=seed + 1000, step=1)
    probe = grounding_stats(model, batch, probe_b, opts=ForwardOptions())
    vis_probe = grounding_sensitivity(probe.jsd, probe.gap, mask)
    entropy_only = top_fraction_mask(probe.entropy, mask, fraction=top_fraction)  # k = ceil(f n) by H alone
    out = {"entropy": selection_rows(entropy_only, vis_probe, probe.entropy, masks)}
    for arm, (name, kwargs) in SELECT_PERTURBS.items():
        pb = perturbed_image_batch(batch, trajs, perturb=name, perturb_args=kwargs, regions="whole", seed=seed,
                                   step=0)
        st = grounding_stats(model, batch, pb, opts=ForwardOptions())
        out[arm] = selection_rows(select(st, mask, top_fraction=top_fraction).selected, vis_probe, st.entropy,
                                  masks)
    return out


def run_seeds(seeds: list[int], sft_steps: int, examples: int, out: str, command: str) -> dict:
    from credo.report.stats import metric_block, write_compare_json

    per_seed = []
    for seed in seeds:
        t0 = time.perf_counter()
        per_seed.append(compare_seed(seed, sft_steps, examples))
        print(f"seed {seed} ({time.perf_counter() - t0:.0f} s): {per_seed[-1]}", flush=True)
    metrics = {}
    for key in per_seed[0]["vepo"]:
        metrics[f"selected/{key}@mean"] = metric_block(
            {arm: [s[arm][key] for s in per_seed] for arm in per_seed[0]}, "entropy")
    write_compare_json(out, name="vepo_visual_sensitivity", command=command, baseline="entropy", seeds=seeds,
                       metrics=metrics, extra={"setup": {"sft_steps": sft_steps, "examples": examples,
                                                         "top_fraction": 0.2, "select_perturb":
                                                         {"vepo": "gaussian std 0.74", "vepo_grey": "grey 0.5"},
                                                         "probe_perturb": "resample"}})
    return metrics


def table(args) -> None:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, batch, trajs, masks = setup(args.seed, args.sft_steps, args.examples)
    first, rest, eos = masks["colour"], masks["rest"], masks["eos"]
    print(f"SFT {args.sft_steps} steps in {time.perf_counter() - t0:.0f} s, seed {args.seed}; colour tokens are "
          f"{float(first.sum()) / float(masks['valid'].sum()):.0%} of the tokens")
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


def main(argv: list[str] | None = None) -> None:
    import sys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=96)
    ap.add_argument("--seeds", default=None, help="comma-separated seeds: the VEPO vs entropy-only comparison")
    ap.add_argument("--json", default="docs/evidence/data/vepo_visual_sensitivity.json")
    args = ap.parse_args(argv)
    if args.seeds is None:
        table(args)
        return
    torch.set_num_threads(1)
    command = "python benchmarks/vepo_image_vis.py " + " ".join(sys.argv[1:] if argv is None else argv)
    run_seeds([int(s) for s in args.seeds.split(",")], args.sft_steps, args.examples, args.json, command)


if __name__ == "__main__":
    main()
