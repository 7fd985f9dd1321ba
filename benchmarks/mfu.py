"""Achieved FLOP/s of credo's update step as a fraction of the machine's practical float32 matmul limit.

The update step is credo's training forward + backward of the policy loss plus the AdamW step
(`credo.train.update.actor_loss`), on a batch of sequences. Its work is counted as 6 * N * tokens (N = parameters,
the tied output projection counted once; attention's quadratic term is left out, so this slightly understates it).
The baseline, measured in the same run, is the FLOP/s of a large float32 matmul (2 n^3 per product), which is what
the machine's BLAS reaches at best.

    python benchmarks/mfu.py                         # SmolLM2-135M (the prepared weights if present, else its
                                                     # architecture with random weights: the FLOPs are the same)
    python benchmarks/mfu.py --model-path DIR --batch 8 --length 256
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from credo.algo import AggNorm
from credo.config import load_config
from credo.models.smollm2 import SMOLLM2_DIR, smollm2_architecture
from credo.models.batch import collate
from credo.train.optim import build_optimizer
from credo.train.forward import ForwardOptions
from credo.train.update import LossSpec, actor_loss
from credo.types import Example, RewardResult, Trajectory


def matmul_flops(n: int, repeats: int) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help=f"Hugging Face directory (default: {SMOLLM2_DIR} if present)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=256, help="tokens per sequence (prompt 32 + response; every prompt distinct, so no prompt sharing)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--matmul-n", type=int, default=4096)
    args = ap.parse_args()

    path = args.model_path or (str(SMOLLM2_DIR) if (SMOLLM2_DIR / "config.json").is_file() else None)
    if path:
        from credo.models import load_model

        model, _ = load_model(path)
        source = path
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(smollm2_architecture())
        source = "SmolLM2-135M architecture, random weights"
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prompt = 32
    trajs = []
    for i in range(args.batch):
        ids = torch.randint(0, vocab, (args.length,), generator=g).tolist()
        r = args.length - prompt
        trajs.append(Trajectory(example=Example(str(i), "", str(i)), group_id=i // 4, prompt_ids=ids[:prompt],
                                response_ids=ids[prompt:], rollout_logprobs=[0.0] * r, response_mask=[1] * r,
                                finish_reason="eos"))
    batch = collate(trajs, [RewardResult(float(i % 2)) for i in range(args.batch)], pad_id=0)
    batch.old_logprobs = torch.zeros_like(batch.rollout_logprobs) - 5.0
    batch.advantages = torch.randn(batch.responses.shape, generator=g) * batch.response_mask
    cfg = load_config(None, [])
    spec, fwd = LossSpec.of(cfg), ForwardOptions.of(cfg)
    opt = build_optimizer(model, lr=1e-6)  # credo's (fused) AdamW
    norm = AggNorm.of(batch.response_mask)
    tokens = int(batch.attention_mask.sum())

    def update() -> float:
        t0 = time.perf_counter()
        loss, _, _ = actor_loss(spec, model, batch, norm, None, forward=fwd)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    update()  # warm-up
    seconds = statistics.median(update() for _ in range(args.repeats))
    achieved = 6 * n_params * tokens / seconds
    peak = matmul_flops(args.matmul_n, args.repeats)
    print(f"model: {source} ({n_params / 1e6:.1f} M parameters); batch {args.batch} x {args.length} = {tokens:,} "
          f"tokens; torch threads {torch.get_num_threads()}")
    print(f"update step: {seconds:.3f} s (median of {args.repeats}) -> {achieved / 1e9:,.1f} GFLOP/s (6 N tokens)")
    print(f"float32 matmul {args.matmul_n}^3: {peak / 1e9:,.1f} GFLOP/s (the machine's practical limit)")
    print(f"MFU (update / matmul): {achieved / peak:.1%}")


if __name__ == "__main__":
    main()
