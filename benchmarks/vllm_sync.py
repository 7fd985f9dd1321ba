"""Seconds per weight sync into vLLM (credo's ``credo_safetensors`` backend through vLLM's RL weight-transfer API:
chunks of safetensors, layer-wise reload), in process and to a server credo starts, for the demo model and
SmolLM2-135M (prepared weights if present, else its architecture with random weights). Run in the vLLM venv.

    python benchmarks/vllm_sync.py                  # both models, both modes, 5 syncs each
    python benchmarks/vllm_sync.py --models demo --modes inprocess --reps 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def build(name: str):
    from credo.config import load_config
    from credo.models import build_model

    if name == "smollm2":
        from credo.models.smollm2 import SMOLLM2_DIR

        if (SMOLLM2_DIR / "config.json").is_file():
            from credo.models import load_model

            return (*load_model(str(SMOLLM2_DIR)), "prepared weights")
        from transformers import AutoModelForCausalLM

        from credo.models.smollm2 import smollm2_architecture

        _, tok = build_model(load_config(None, []).model)
        return AutoModelForCausalLM.from_config(smollm2_architecture()), tok, "RANDOM weights"
    return (*build_model(load_config(None, []).model, seed=0), "demo tiny Qwen2")


def measure(model, tok, mode: str, reps: int) -> tuple[float, list[float]]:
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    t0 = time.perf_counter()
    engine = VLLMRolloutEngine.from_model(model, tok, options=VLLMOptions(mode=mode, dtype="float32"))
    start = time.perf_counter() - t0
    times = []
    try:
        for v in range(1, reps + 1):
            state = {k: p + 0.0 for k, p in model.state_dict().items()}  # fresh tensors, as after an update
            t0 = time.perf_counter()
            engine.update_weights(state, version=v)
            times.append(time.perf_counter() - t0)
        assert engine.served_version() == str(reps)
    finally:
        engine.close()
    return start, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["demo", "smollm2"], choices=("demo", "smollm2"))
    ap.add_argument("--modes", nargs="+", default=["inprocess", "server"], choices=("inprocess", "server"))
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    for name in args.models:
        model, tok, what = build(name)
        size = sum(p.numel() * p.element_size() for p in model.state_dict().values()) / 2**20
        for mode in args.modes:
            start, times = measure(model, tok, mode, args.reps)
            print(f"{name} ({what}, {size:.0f} MiB float32) {mode}: start-up {start:.1f} s; sync median "
                  f"{statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}, {len(times)} syncs)",
                  flush=True)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
