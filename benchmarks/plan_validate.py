"""Validate credo's cost model (credo.plan.model) against measured memory and counted FLOPs on the CPU.

For three Qwen2 models built from config (the demo's 0.5M, ~5M, ~20M parameters, credo's character vocabulary),
one training step on a micro-batch of B sequences of P prompt + R response tokens runs credo's training path: the
backbone (``model.model``), then the response positions' log-probs and entropy through the chunked head
(credo.algo.chunked, default chunk), a loss, backward, and the fused AdamW step (credo.train.optim).

Measured:
- activations: bytes still allocated after the forward (the tensors autograd keeps, plus the loss), from the torch
  profiler's memory events (``profile_memory=True``: every CPU allocation and free with its size; their running
  sum is the live memory);
- step peak: parameters + AdamW moments (counted from the tensors) + the peak of that running sum over a second
  step's zero_grad / forward / backward / optimizer step (the moments exist by then). Limits on the CPU: only
  allocations through torch's CPU allocator are seen (not the BLAS/oneDNN scratch buffers, not Python objects,
  not the allocator's fragmentation), so this is a lower bound of what RSS would show; RSS deltas are not used (the
  glibc allocator keeps freed pages, so RSS does not return to a baseline between phases);
- KV cache: bytes of the ``past_key_values`` tensors of a use_cache forward over P + R tokens;
- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over the forward + backward with eager attention (it has no
  formula for the CPU flash-attention kernel; eager's QK^T and AV are bmm's over the full s x s, as the model
  counts); elementwise ops are not counted, as in the model.

    OMP_NUM_THREADS=1 python benchmarks/plan_validate.py [--batch 8 --prompt 32 --response 32]
    python benchmarks/plan_validate.py --predict     # only the predicted 0.5B / 1.5B / 7B table (8 x 80 GB)
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from credo.algo.chunked import chunked_logprobs_entropy
from credo.config import load_config
from credo.models.build import build_model
from credo.plan.cli import shape_of
from credo.plan.model import (GIB, QWEN2_SHAPES, Workload, activation_bytes, kv_cache_bytes, memory_per_rank,
                              param_count, step_flops)
from credo.train.optim import build_optimizer

SIZES = {  # name: model.* overrides
    "demo ~0.5M": [],
    "~5M": ["model.hidden_size=256", "model.intermediate_size=1024", "model.num_layers=5", "model.num_heads=8",
            "model.num_kv_heads=4"],
    "~20M": ["model.hidden_size=512", "model.intermediate_size=2048", "model.num_layers=5", "model.num_heads=8",
             "model.num_kv_heads=4"],
}


def live_bytes(prof) -> tuple[int, int]:
    """(peak, final) of the running sum of the profiler's allocation events (bytes, relative to its start)."""
    cur = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak, cur


def loss_of(model, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # (B, S, H)
    h = hidden[:, prompt - 1 : -1, :].reshape(-1, hidden.shape[-1])  # (B R, H): positions predicting responses
    labels = ids[:, prompt:].reshape(-1)  # (B R,)
    lp, ent = chunked_logprobs_entropy(h, model.lm_head.weight, labels)
    return -(lp.mean() + 0.01 * ent.mean())


def measure(overrides: list[str], batch: int, prompt: int, response: int) -> dict:
    cfg = load_config(None, overrides)
    model, _ = build_model(cfg.model)
    shape = shape_of(cfg.model)
    ids = torch.randint(4, shape.vocab, (batch, prompt + response))
    opt = build_optimizer(model, lr=1e-4)
    w = Workload(sequences=batch, prompt_tokens=prompt, new_tokens=response, micro_batch=batch, gen_batch=batch,
                 masked=False)  # no padding here, so no mask: SDPA's GQA, k and v not repeated
    pred = memory_per_rank(shape, w, "ddp", 1)

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = loss_of(model, ids, prompt)
    acts = live_bytes(prof)[1]
    loss.backward()
    opt.step()  # creates the moments
    opt.zero_grad(set_to_none=True)
    del loss
    static = sum(p.numel() * p.element_size() for p in model.parameters())
    static += sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                  if torch.is_tensor(t) and t.dim() > 0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        opt.zero_grad(set_to_none=True)
        loss_of(model, ids, prompt).backward()
        opt.step()
    step_peak = static + live_bytes(prof)[0]
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    model.set_attn_implementation("eager")  # FlopCounterMode has no formula for the CPU flash-attention kernel
    opt.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        loss_of(model, ids, prompt).backward()
    flops = counter.get_total_flops()
    f = step_flops(shape, w)
    return {"params": sum(p.numel() for p in model.parameters()),
            "act": (activation_bytes(shape, w), acts),
            "peak": (pred.params + pred.grads + pred.optimizer + pred.activations, step_peak),
            "kv": (kv_cache_bytes(shape, w), kv), "flops": (f.training, flops)}


def err(pred: float, meas: float) -> str:
    return f"{100 * (pred - meas) / meas:+.1f}%"


def predict_table(gpus: int = 8, mem_gb: float = 80.0) -> None:
    """Predicted (not measured) per-rank memory and step FLOPs of Qwen2-shaped 0.5B / 1.5B / 7B models: 64
    prompts x 8 samples, 512 prompt + 1024 new tokens, micro-batch 4 and generation batch 64 per rank."""
    print(f"predicted, {gpus} x {mem_gb:g} GiB GPUs: 512 sequences of 512 prompt + 1024 new tokens; per rank "
          "micro-batch 4, generation batch 64; no reference, no old-log-prob pass")
    print("| model | params | dtype | P+G+O DDP / FSDP2 (GiB) | activations (GiB) | KV cache (GiB) "
          "| peak DDP / FSDP2 (GiB) | fits DDP / FSDP2 | FLOPs per step |")
    print("|---|---:|---|---:|---:|---:|---:|---|---:|")
    for name, shape in QWEN2_SHAPES.items():
        for dtype in ("float32", "bfloat16"):
            w = Workload(sequences=512, prompt_tokens=512, new_tokens=1024, micro_batch=4, gen_batch=64, dtype=dtype)
            d, f = memory_per_rank(shape, w, "ddp", gpus), memory_per_rank(shape, w, "fsdp2", gpus)
            pgo = [(m.params + m.grads + m.optimizer) / GIB for m in (d, f)]
            fit = ["yes" if m.peak <= mem_gb * GIB else "no" for m in (d, f)]
            print(f"| {name} | {param_count(shape) / 1e9:.2f}B | {dtype} | {pgo[0]:.1f} / {pgo[1]:.1f} "
                  f"| {d.activations / GIB:.1f} | {d.kv_cache / GIB:.1f} | {d.peak / GIB:.1f} / {f.peak / GIB:.1f} "
                  f"| {fit[0]} / {fit[1]} | {step_flops(shape, w).total:.3g} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=32)
    ap.add_argument("--predict", action="store_true", help="only print the predicted 0.5B / 1.5B / 7B table")
    args = ap.parse_args()
    if args.predict:
        predict_table()
        return
    torch.manual_seed(0)
    mib = 1024**2
    print(f"micro-batch {args.batch} x ({args.prompt} prompt + {args.response} response) tokens, float32, CPU")
    print("| model | params | activations pred / meas (MiB) | err | step peak pred / meas (MiB) | err "
          "| KV cache pred / meas (MiB) | err | train FLOPs pred / counted | err |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, overrides in SIZES.items():
        r = measure(overrides, args.batch, args.prompt, args.response)
        cells = [name, f"{r['params']:,}"]
        for key, scale, fmt in (("act", mib, "{:.2f}"), ("peak", mib, "{:.2f}"), ("kv", mib, "{:.3f}"),
                                ("flops", 1, "{:.4g}")):
            p, m = r[key]
            cells += [f"{fmt.format(p / scale)} / {fmt.format(m / scale)}", err(p, m)]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
