"""Update throughput with packed (padding-free) vs padded batches on a length-skewed batch.

Builds a batch where most responses are short and a few are long (as RLVR batches are: a handful of rambling
samples set the padded width), then times the training forward + backward of the policy loss both ways with the
same model, in the same process, alternating the two so that machine noise hits both. Tokens/s counts real
(non-padding) tokens only.

    python benchmarks/padding.py                      # the demo's tiny model
    python benchmarks/padding.py --hidden 576 --layers 6 --long 1024
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from credo.config import ModelConfig
from credo.models import build_model
from credo.models.batch import collate
from credo.train.forward import ForwardOptions, policy_logprobs
from credo.types import Example, RewardResult, Trajectory


def skewed_batch(tok, *, n: int, short: int, long: int, long_every: int, prompt: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        r = long if i % long_every == 0 else int(torch.randint(short // 2, short + 1, (1,), generator=g))
        ids = torch.randint(4, len(tok), (prompt + r,), generator=g).tolist()
        trajs.append(Trajectory(example=Example(str(i), "", str(i)), group_id=i, prompt_ids=ids[:prompt],
                                response_ids=ids[prompt:], rollout_logprobs=[0.0] * r, response_mask=[1] * r,
                                finish_reason="eos"))
    return collate(trajs, [RewardResult(0.0)] * n, pad_id=tok.pad_token_id)


def update_seconds(model, batch, opts: ForwardOptions) -> float:
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logprobs, _ = policy_logprobs(model, batch, opts=opts)
    (-(logprobs * batch.response_mask).sum() / batch.response_mask.sum()).backward()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=None, help="default 4 x hidden")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--short", type=int, default=48, help="short responses: uniform in [short/2, short] tokens")
    ap.add_argument("--long", type=int, default=512, help="length of the long responses")
    ap.add_argument("--long-every", type=int, default=8, help="one long response per this many sequences")
    ap.add_argument("--row-tokens", type=int, default=None, help="packed row length (default: the longest sequence)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = ModelConfig(hidden_size=args.hidden, intermediate_size=args.intermediate or 4 * args.hidden,
                      num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.heads // 2 or 1,
                      max_position_embeddings=args.prompt + args.long + 8)
    model, tok = build_model(cfg, seed=0)
    model.train()
    batch = skewed_batch(tok, n=args.sequences, short=args.short, long=args.long, long_every=args.long_every,
                         prompt=args.prompt)
    real = int(batch.attention_mask.sum())
    row = args.row_tokens or int(batch.attention_mask.sum(-1).max())
    variants = {"padded": ForwardOptions(pack=False), "packed": ForwardOptions(pack=True, row_tokens=row)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for name, opts in variants.items():  # warm-up
        update_seconds(model, batch, opts)
    for _ in range(args.repeats):
        for name, opts in variants.items():
            times[name].append(update_seconds(model, batch, opts))
    print(f"model: hidden {args.hidden}, {args.layers} layers; batch: {args.sequences} sequences, "
          f"{real:,} real tokens in a padded {tuple(batch.input_ids.shape)} ({real / batch.input_ids.numel():.0%} "
          f"real); packed rows of {row} tokens; median of {args.repeats}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for name in variants:
        print(f"{name:<8}{med[name]:>8.3f} s/update   {real / med[name]:>10,.0f} real tokens/s")
    print(f"speed-up packed vs padded: {med['padded'] / med['packed']:.2f}x")


if __name__ == "__main__":
    main()
