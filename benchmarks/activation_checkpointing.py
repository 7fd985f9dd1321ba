"""Activation memory with and without ``train.activation_checkpointing`` on the CPU, against credo's cost model.

One float32 training forward + backward (credo's path as in benchmarks/plan_validate.py: the backbone, the chunked
log-prob + entropy head) of a Qwen2 model built from config, on a micro-batch of B x (P + R) tokens, measured with
the torch profiler's memory events (every CPU allocation and free; their running sum is the live memory):
- after forward: bytes still allocated once the forward returned (what autograd keeps for the backward + the loss);
- fwd+bwd peak: the peak of the running sum over the forward and backward (gradients included);
and the bytes of the tensors autograd saves in the forward (``saved_tensors_hooks``; a tensor saved by several ops
counted each time, parameters included), deterministic. Predicted: credo.plan.model.activation_bytes.

    OMP_NUM_THREADS=1 python benchmarks/activation_checkpointing.py [--batch 4 --prompt 128 --response 128]
    OMP_NUM_THREADS=1 python benchmarks/activation_checkpointing.py --time 7   # + paired fwd+bwd seconds, off / on
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_validate import SIZES, live_bytes, loss_of  # noqa: E402

from credo.config import load_config  # noqa: E402
from credo.models.build import build_model  # noqa: E402
from credo.plan.cli import shape_of  # noqa: E402
from credo.plan.model import Workload, activation_bytes  # noqa: E402
from credo.train.activation_checkpointing import enable_activation_checkpointing  # noqa: E402

MIB = 2 ** 20


def saved_bytes(model, ids, prompt) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, ids, prompt)
    loss.backward()
    return total


def measure(overrides: list[str], batch: int, prompt: int, response: int, ckpt: bool) -> dict:
    cfg = load_config(None, overrides)
    model, _ = build_model(cfg.model)
    model.train()
    if ckpt:
        enable_activation_checkpointing(model)
    shape = shape_of(cfg.model)
    ids = torch.randint(4, shape.vocab, (batch, prompt + response), generator=torch.Generator().manual_seed(0))
    w = Workload(sequences=batch, prompt_tokens=prompt, new_tokens=response, micro_batch=batch, gen_batch=batch,
                 masked=False, activation_checkpointing=ckpt)
    loss_of(model, ids, prompt).backward()  # warm-up: lazily created buffers, gradients allocated
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = loss_of(model, ids, prompt)
    after = live_bytes(prof)[1]
    del loss
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss_of(model, ids, prompt).backward()
    peak = live_bytes(prof)[0]
    model.zero_grad(set_to_none=True)
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"pred": activation_bytes(shape, w), "after": after, "peak": peak, "grads": grads,
            "saved": saved_bytes(model, ids, prompt)}


def paired_times(overrides: list[str], batch: int, prompt: int, response: int, pairs: int) -> tuple[float, float]:
    """Median forward + backward seconds without / with checkpointing, the two alternating step by step."""
    cfg = load_config(None, overrides)
    plain, _ = build_model(cfg.model)
    ckpt = enable_activation_checkpointing(copy.deepcopy(plain))
    ids = torch.randint(4, shape_of(cfg.model).vocab, (batch, prompt + response),
                        generator=torch.Generator().manual_seed(0))
    times: dict[int, list[float]] = {0: [], 1: []}
    for i in range(2 * pairs + 2):
        model = (plain, ckpt)[i % 2]
        model.train()
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss_of(model, ids, prompt).backward()
        if i >= 2:  # the first pair warms up
            times[i % 2].append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--time", type=int, default=0, help="also time N alternating fwd+bwd pairs (off / on)")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"micro-batch {args.batch} x ({args.prompt} + {args.response}) tokens, float32; MiB")
    print("| model | checkpointing | predicted A | after forward | fwd+bwd peak (grads incl.) | gradients | saved for backward |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in ("~5M", "~20M"):
        for ckpt in (False, True):
            r = measure(SIZES[name] + ["model.num_layers=8"], args.batch, args.prompt, args.response, ckpt)
            print(f"| {name} 8 layers | {'on' if ckpt else 'off'} | {r['pred'] / MIB:.1f} "
                  f"| {r['after'] / MIB:.1f} | {r['peak'] / MIB:.1f} | {r['grads'] / MIB:.1f} | {r['saved'] / MIB:.1f} |", flush=True)
    if args.time:
        print("| model | fwd+bwd off (s) | on (s) | on / off |")
        print("|---|---:|---:|---:|")
        for name in ("~5M", "~20M"):
            off, on = paired_times(SIZES[name] + ["model.num_layers=8"], args.batch, args.prompt, args.response, args.time)
            print(f"| {name} | {off:.3f} | {on:.3f} | {on / off:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
