"""Peak memory and time of credo's chunked log-prob + entropy vs the naive full-logits computation.

Both compute, from final hidden states (B*T, H) and an output projection (V, H), the sampled tokens' log-probs
and the entropy of every position: the naive way materialises the (B*T, V) float32 logits (as TRL and verl do),
credo's way (`credo.algo.chunked`) works in chunks of rows and recomputes them in the backward. Each measurement
runs in a fresh subprocess and reports the growth of its peak resident memory over the memory held before the
computation (inputs included in neither); a run killed by the operating system is reported as such.

    python benchmarks/logprob_memory.py                        # V=151,936, T=4,096, B=2, H=896 (Qwen2-0.5B head)
    python benchmarks/logprob_memory.py --tokens 1024 --grad   # forward + backward at a size where naive fits
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def child(args) -> None:
    import torch

    from credo.algo.chunked import chunked_logprobs_entropy
    from credo.algo.logprobs import entropy_from_logits

    torch.manual_seed(0)
    n = args.batch * args.tokens
    hidden = (torch.randn(n, args.hidden) * 0.5).requires_grad_(args.grad)
    weight = (torch.randn(args.vocab, args.hidden) * 0.02).requires_grad_(args.grad)
    labels = torch.randint(0, args.vocab, (n,))
    before = _rss_mb()
    t0 = time.perf_counter()
    with torch.set_grad_enabled(args.grad):
        if args.impl == "naive":
            logits = hidden @ weight.T  # (N, V) float32
            logprobs = logits.log_softmax(-1).gather(-1, labels[:, None]).squeeze(-1)
            entropy = entropy_from_logits(logits)
            del logits
        else:
            logprobs, entropy = chunked_logprobs_entropy(hidden, weight, labels, chunk_size=args.chunk_size or None)
        if args.grad:
            (logprobs.sum() + 0.1 * entropy.sum()).backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB -> MB
    print(json.dumps({"peak_mb": peak - before, "seconds": seconds, "checksum": float(logprobs.sum().detach())}))


def measure(args, impl: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--impl", impl, "--vocab", str(args.vocab), "--tokens",
           str(args.tokens), "--batch", str(args.batch), "--hidden", str(args.hidden), "--chunk-size",
           str(args.chunk_size)] + (["--grad"] if args.grad else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        reason = "killed (out of memory)" if proc.returncode in (-9, 137) else proc.stderr.strip().splitlines()[-1:]
        return {"error": reason}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--tokens", type=int, default=4096, help="T: tokens per sequence")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--chunk-size", type=int, default=0, help="rows per chunk (0 = credo's default, 2^26 / V)")
    ap.add_argument("--grad", action="store_true", help="forward + backward (the update) instead of no-grad")
    ap.add_argument("--impl", choices=("naive", "chunked"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    mode = "forward + backward" if args.grad else "no-grad forward (the old / reference log-prob pass)"
    from credo.algo.chunked import auto_chunk_size

    chunk = args.chunk_size or auto_chunk_size(args.vocab)
    print(f"V={args.vocab:,} T={args.tokens:,} B={args.batch} H={args.hidden} chunk={chunk} rows; {mode}")
    res = {impl: measure(args, impl) for impl in ("naive", "chunked")}
    for impl, r in res.items():
        if "error" in r:
            print(f"{impl:<8} {r['error']}")
        else:
            print(f"{impl:<8} peak +{r['peak_mb']:>9,.0f} MB   {r['seconds']:>7.2f} s")
    if all("error" not in r for r in res.values()):
        n, c = res["naive"], res["chunked"]
        print(f"memory ratio chunked / naive: {c['peak_mb'] / n['peak_mb']:.3f}   "
              f"time ratio chunked / naive: {c['seconds'] / n['seconds']:.2f}   "
              f"|checksum difference|: {abs(c['checksum'] - n['checksum']):.3g}")


if __name__ == "__main__":
    main()
