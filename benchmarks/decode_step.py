"""Time per decode step: transformers' generic forward (A) vs credo's lean Llama / Qwen2 loop (B), R = B / A.

Both sides start from the same prefilled cache (B rows, P prompt tokens), each in its own cache, and feed one token
per row per step. The steps alternate A B A B ... (benchmarks/harness.py `run_inprocess`), so decode step i of A and
step i of B run back to back at the same cache length: they are paired, and the result is the median of the
per-step ratios lean / generic with a bootstrap 95% interval over the pairs, printed as
`lean / generic decode step: R x [lo, hi]` (below 1: the lean loop is faster); the first `--warmup` pairs are left
out. The deterministic proxy beside it is tokens per decode step (one per row, the same on both sides). The raw
series go to a JSON file (--json, default runs/bench/).

    python benchmarks/decode_step.py                      # the demo's tiny Qwen2, 64 rows
    python benchmarks/decode_step.py --model smollm2 --batch 32   # SmolLM2-135M (prepared weights, else random)
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import DynamicCache

import harness  # benchmarks/ (this script's directory) is on sys.path
from credo.rollout.lean import lean_decoder


def build(name: str):
    if name == "smollm2":
        from credo.models.smollm2 import SMOLLM2_DIR, smollm2_architecture

        if (SMOLLM2_DIR / "config.json").is_file():
            from credo.models import load_model

            return load_model(str(SMOLLM2_DIR))[0]
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(smollm2_architecture())
    from credo.config import load_config
    from credo.models import build_model

    return build_model(load_config(None, []).model, seed=0)[0]


class Decoder:
    """One side's decode state from a fresh prefill of `ids` (B, P); each call feeds one token per row."""

    def __init__(self, model, lean, ids: torch.Tensor, steps: int, use_lean: bool):
        b, p = ids.shape
        self.model, self.lean, self.use_lean, self.p, self.s = model, lean, use_lean, p, 0
        self.attn = torch.ones(b, p, dtype=torch.long)
        with torch.no_grad():
            cache = model(input_ids=ids, attention_mask=self.attn, position_ids=torch.arange(p).expand(b, p),
                          cache=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1).cache
        self.cache = cache
        self.state = lean.start(cache, self.attn, steps) if use_lean else None  # room for `steps` new tokens
        self.nxt = ids[:, -1]  # (B,): the fed token does not change the work per step

    @torch.no_grad()
    def __call__(self) -> None:
        pos = torch.full((self.nxt.shape[0], 1), self.p + self.s)  # (B, 1)
        self.s += 1
        if self.use_lean:
            self.lean.step(self.state, self.nxt, pos)
            return
        self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=-1)  # (B, P + s)
        self.model(input_ids=self.nxt.unsqueeze(-1), attention_mask=self.attn, position_ids=pos, cache=self.cache,
                   use_cache=True, logits_to_keep=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--batch", type=int, default=64, help="rows decoded together")
    ap.add_argument("--prompt", type=int, default=40, help="prompt tokens prefilled per row")
    ap.add_argument("--steps", type=int, default=60, help="timed decode steps per side (pairs)")
    ap.add_argument("--warmup", type=int, default=4, help="first pairs of steps left out")
    ap.add_argument("--order", choices=("alternate", "balanced"), default="alternate",
                    help="A B A B ..., or each pair in a seeded random order")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="prompt ids, pair order and bootstrap seed")
    ap.add_argument("--json", help="raw series and metadata (default: runs/bench/<name>-<time>.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = build(args.model).eval()
    lean = lean_decoder(model)
    if lean is None:
        raise SystemExit(f"{model.config.model_type} is not supported by the lean decode loop")
    total = args.warmup + args.steps
    if args.prompt + total > model.config.max_position_embeddings:
        raise SystemExit(f"--prompt + --warmup + --steps = {args.prompt + total} exceeds the model's "
                         f"{model.config.max_position_embeddings} positions")
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt),
                        generator=torch.Generator().manual_seed(args.seed))
    generic, fast = Decoder(model, lean, ids, total, False), Decoder(model, lean, ids, total, True)
    print(f"model {args.model}; {args.batch} rows, prompt {args.prompt}, {args.steps} timed decode steps per side "
          f"after {args.warmup} warm-up pairs, {args.threads} threads", flush=True)
    cmp = harness.run_inprocess(generic, fast, repeats=args.steps, warmup=args.warmup, order=args.order,
                                seed=args.seed, name="lean / generic decode step", labels=("generic", "lean"),
                                proxy=harness.Proxy("tokens / decode step", args.batch, args.batch))
    cmp.meta["benchmark"] = vars(args)
    harness.report(cmp, Path(args.json) if args.json else None)


if __name__ == "__main__":
    main()
