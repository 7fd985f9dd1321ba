"""Generation throughput (tokens/s): vLLM's CPU build vs credo's HF engine with the lean decode loop.

Both engines continue the same token-id prompts (``--batch`` distinct random prompts of ``--prompt-len`` tokens,
fresh for every repetition so that vLLM's prefix cache never hits) at temperature 1.0 up to ``--max-new-tokens``;
tokens/s is the tokens actually generated (a row may stop early at EOS: both engines' counts are printed) over the
wall seconds of the call. Repetitions alternate HF, vLLM, HF, vLLM, ... after one warm-up call each, so machine
noise falls on both; vLLM's start-up (save the model, spawn, load) is timed separately and not counted. Prints per
model each engine's median (and best) tokens/s, the ratio vLLM / HF (median of the paired repetitions' ratios,
their min-max and a bootstrap 95% interval; the best repetitions' ratio, the least disturbed on a busy machine)
and which engine is faster (by the median paired ratio). The HF engine runs in this process on ``--threads``
torch threads; vLLM's worker process binds its own OpenMP threads (``--vllm-bind``, vLLM's
VLLM_CPU_OMP_THREADS_BIND: by default ``auto``, which on x86 leaves one core to vLLM's scheduler process, so on a
2-core machine the model runs on one core; ``--vllm-bind 0-1`` gives it both). vLLM logs at WARNING unless
VLLM_LOGGING_LEVEL says otherwise.

    python benchmarks/engine_throughput.py                    # demo model and SmolLM2-135M, 5 repetitions
    python benchmarks/engine_throughput.py --quick            # smoke check (demo model): tiny sizes, 2 repetitions
    python benchmarks/engine_throughput.py --vllm-bind 0-1    # vLLM's model runner on cores 0 and 1
    python benchmarks/engine_throughput.py --models smollm2 --batch 32 --max-new-tokens 64 --reps 3
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from credo.types import SamplingParams

DEFAULTS = {"demo": {"batch": 64, "max_new_tokens": 64}, "smollm2": {"batch": 16, "max_new_tokens": 32}}
QUICK = {"batch": 4, "max_new_tokens": 8, "prompt_len": 8, "reps": 2}


def build(name: str):
    """(model, tokenizer, what the weights are) for ``demo`` (credo's default tiny Qwen2) or ``smollm2``
    (the prepared SmolLM2-135M-Instruct weights, else its architecture with random weights and the demo tokenizer's
    special ids: prompts are token ids, so only EOS / pad matter)."""
    from credo.config import load_config
    from credo.models import build_model

    if name == "smollm2":
        from credo.models.smollm2 import SMOLLM2_DIR, smollm2_architecture

        if (SMOLLM2_DIR / "config.json").is_file():
            from credo.models import load_model

            model, tok = load_model(str(SMOLLM2_DIR))
            return model, tok, f"prepared weights ({SMOLLM2_DIR})"
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(smollm2_architecture())
        tok = build_model(load_config(None, []).model, seed=0)[1]
        return model, tok, "RANDOM weights (not prepared: credo model prepare smollm2)"
    model, tok = build_model(load_config(None, []).model, seed=0)
    return model, tok, "demo tiny Qwen2, seed 0"


def make_prompts(tokenizer, rows: int, length: int, seed: int) -> list[list[int]]:
    """``rows`` distinct random prompts of ``length`` ordinary (non-special) token ids."""
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(seed)
    return [[rng.choice(vocab) for _ in range(length)] for _ in range(rows)]


def timed(engine, prompts: list[list[int]], sp: SamplingParams) -> tuple[int, float]:
    """(tokens generated, wall seconds) of one ``continue_ids`` call."""
    t0 = time.perf_counter()
    outs = engine.continue_ids(prompts, sp)
    return sum(len(c.ids) for c in outs), time.perf_counter() - t0


def ratio_interval(vllm: list[float], hf: list[float], *, resamples: int = 2000):
    """The paired ratios vllm[i] / hf[i]: (median, min, max, (low, high)), where (low, high) is a bootstrap 95%
    interval of the median (the repetitions resampled with replacement)."""
    ratios = [v / h for v, h in zip(vllm, hf)]
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    low, high = boots[int(0.025 * resamples)], boots[int(0.975 * resamples) - 1]
    return statistics.median(ratios), min(ratios), max(ratios), (low, high)


def run_pairs(engines: dict, tok, sizes: dict) -> dict[str, list[tuple[int, float]]]:
    """One warm-up call per engine, then ``reps`` interleaved (HF, vLLM) calls on fresh prompts per repetition
    (the same prompts for both engines within a repetition). Returns each engine's (tokens, seconds) per rep."""
    sp = SamplingParams(temperature=1.0, max_new_tokens=sizes["max_new_tokens"])
    rows, plen = sizes["batch"], sizes["prompt_len"]
    warm = make_prompts(tok, rows, plen, seed=10_000)
    for engine in engines.values():
        timed(engine, warm, sp)
    runs: dict[str, list[tuple[int, float]]] = {name: [] for name in engines}
    for rep in range(sizes["reps"]):
        prompts = make_prompts(tok, rows, plen, seed=rep)
        for name, engine in engines.items():
            runs[name].append(timed(engine, prompts, sp))
    return runs


def report(name: str, weights: str, sizes: dict, startup_s: float, runs: dict) -> None:
    """Print one model's per-repetition numbers, medians, the vLLM / HF ratio and the recommendation."""
    print(f"model {name} ({weights}); {sizes['batch']} rows, prompt {sizes['prompt_len']}, up to "
          f"{sizes['max_new_tokens']} new tokens, temperature 1.0, {sizes['reps']} reps, "
          f"HF threads {sizes['threads']}, vLLM binding {os.environ['VLLM_CPU_OMP_THREADS_BIND']!r}")
    print(f"vllm start-up (excluded): {startup_s:.1f} s")
    rates = {}
    for engine, rs in runs.items():
        rates[engine] = [n / s for n, s in rs]
        print(f"{engine:<5} tokens: {', '.join(str(n) for n, _ in rs)}; "
              f"seconds: {', '.join(f'{s:.2f}' for _, s in rs)}")
        print(f"{engine:<5} tokens/s: {', '.join(f'{r:,.0f}' for r in rates[engine])} "
              f"(median {statistics.median(rates[engine]):,.0f}, best {max(rates[engine]):,.0f})")
    mid, lo, hi, (b_lo, b_hi) = ratio_interval(rates["vllm"], rates["hf"])
    print(f"vllm / hf: {mid:.2f}x (paired reps min {lo:.2f} - max {hi:.2f}; bootstrap 95% {b_lo:.2f} - {b_hi:.2f}); "
          f"best / best {max(rates['vllm']) / max(rates['hf']):.2f}x")
    verdict = "faster: vllm" if mid > 1 else "faster: hf"
    print(verdict + (" (the paired ratios straddle 1: within noise)" if lo <= 1 <= hi else ""))


def bench_model(name: str, sizes: dict) -> None:
    """Build the model, both engines (vLLM's start-up timed), run the interleaved repetitions and report."""
    from credo.rollout import HFRolloutEngine
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    model, tok, weights = build(name)
    model.eval()
    hf = HFRolloutEngine(model, tok, seed=0, lean=True)
    if hf.lean is None:
        raise SystemExit(f"{model.config.model_type} is not supported by the lean decode loop")
    t0 = time.perf_counter()
    vllm = VLLMRolloutEngine.from_model(model, tok, seed=0, options=VLLMOptions(dtype="float32"))
    startup_s = time.perf_counter() - t0
    try:
        runs = run_pairs({"hf": hf, "vllm": vllm}, tok, sizes)
    finally:
        vllm.close()
    report(name, weights, sizes, startup_s, runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=tuple(DEFAULTS), default=None,
                    help="default: demo smollm2 (--quick: demo)")
    ap.add_argument("--batch", type=int, default=None, help="rows per call (default 64 demo, 16 smollm2)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 64 demo, 32 smollm2")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per row (default 32)")
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions per engine (default 5)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for the HF engine")
    ap.add_argument("--vllm-bind", default=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
                    help="cores of vLLM's model runner (VLLM_CPU_OMP_THREADS_BIND: auto, nobind, 0-1, ...)")
    ap.add_argument("--quick", action="store_true", help="smoke check: 4 rows, prompt 8, 8 new tokens, 2 repetitions")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.vllm_bind  # read by vLLM's spawned processes
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    for name in args.models or (["demo"] if args.quick else list(DEFAULTS)):
        sizes = dict(DEFAULTS[name], prompt_len=32, reps=5, threads=args.threads) | (QUICK if args.quick else {})
        for key in ("batch", "max_new_tokens", "prompt_len", "reps"):  # given on the command line: wins over both
            if getattr(args, key) is not None:
                sizes[key] = getattr(args, key)
        bench_model(name, sizes)
        print()


if __name__ == "__main__":
    main()
