"""Time per decode step: credo's lean Llama / Qwen2 loop (credo.rollout.lean) vs transformers' generic forward.

Both start from the same prefilled cache (B rows, P prompt tokens) and feed S - 1 tokens one step at a time;
repetitions alternate between the two so that machine noise falls on both. Prints each repetition's ms / step.

    python benchmarks/decode_step.py                      # the demo's tiny Qwen2, 64 rows
    python benchmarks/decode_step.py --model smollm2 --batch 32   # SmolLM2-135M (prepared weights, else random)
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

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


@torch.no_grad()
def per_step(model, lean, ids: torch.Tensor, steps: int, use_lean: bool) -> float:
    b, p = ids.shape
    attn = torch.ones(b, p, dtype=torch.long)
    cache = DynamicCache(config=model.config)
    cache = model(input_ids=ids, attention_mask=attn, position_ids=torch.arange(p).expand(b, p), cache=cache,
                  use_cache=True, logits_to_keep=1).cache
    state = lean.start(cache, attn, steps) if use_lean else None
    nxt = ids[:, -1]
    t0 = time.perf_counter()
    for s in range(steps - 1):
        pos = torch.full((b, 1), p + s)
        if use_lean:
            lean.step(state, nxt, pos)
        else:
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=-1)
            model(input_ids=nxt.unsqueeze(-1), attention_mask=attn, position_ids=pos, cache=cache, use_cache=True,
                  logits_to_keep=1)
    return (time.perf_counter() - t0) / (steps - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=40)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = build(args.model).eval()
    lean = lean_decoder(model)
    if lean is None:
        raise SystemExit(f"{model.config.model_type} is not supported by the lean decode loop")
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {"lean": [], "transformers": []}
    for _ in range(args.repeats):
        times["lean"].append(per_step(model, lean, ids, args.steps, True))
        times["transformers"].append(per_step(model, lean, ids, args.steps, False))
    print(f"model {args.model}; {args.batch} rows, prompt {args.prompt}, {args.steps - 1} decode steps, "
          f"{args.threads} threads")
    for name, ts in times.items():
        print(f"{name:<13} ms / step: {', '.join(f'{t * 1000:.1f}' for t in ts)} (median {statistics.median(ts) * 1000:.1f})")
    print(f"lean / transformers: {statistics.median(times['lean']) / statistics.median(times['transformers']):.2f}x")


if __name__ == "__main__":
    main()
