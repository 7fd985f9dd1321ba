"""Seconds and bytes per weight sync into vLLM for a LoRA policy (the adapter only: credo.rollout.vllm_lora) against
the same model's whole weights (the engine's default whole-weight sync), in process and to a server credo starts,
on the demo model (tiny Qwen2) with ``model.lora`` r = 8 on every attention and MLP projection. Run in the vLLM
venv; docs/lora.md records its output.

    python benchmarks/vllm_lora_sync.py                 # both modes, 5 syncs each
    python benchmarks/vllm_lora_sync.py --modes inprocess --reps 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def policies(root: Path):
    """(plain demo model, the same model with r = 8 adapters whose B is non-zero, tokenizer, base folder)."""
    import copy

    from credo.config import ModelConfig
    from credo.config.schema import LoraConfig
    from credo.models import build_model, save_model
    from credo.models.lora import apply_lora

    model, tok = build_model(ModelConfig(), seed=0)
    save_model(model, tok, root / "base")
    lora = apply_lora(copy.deepcopy(model), LoraConfig(r=8, alpha=16.0), seed=0)
    lora.credo_lora_base = str((root / "base").resolve())
    return model, lora, tok, root / "base"


def kick(model, seed: int) -> None:
    """Move every trainable tensor a little (a stand-in for an optimizer step)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 1e-3)


def timed_syncs(engine, model, reps: int) -> list[float]:
    out = []
    for v in range(1, reps + 1):
        kick(model, v)
        t0 = time.perf_counter()
        engine.update_weights(model, version=v)
        out.append(time.perf_counter() - t0)
    assert engine.served_version() == str(reps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="inprocess,server")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from credo.models.lora import adapter_state
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_transport import VLLMOptions

    root = Path(tempfile.mkdtemp(prefix="credo-lora-sync-"))
    plain, lora, tok, base = policies(root)
    rows = []
    for mode in args.modes.split(","):
        opts = VLLMOptions(dtype="float32", mode=mode)
        for kind, model in (("adapter", lora), ("whole", plain)):
            engine = VLLMRolloutEngine.from_model(model, tok, options=opts, scratch=root, log_dir=root / mode)
            try:
                times = timed_syncs(engine, model, args.reps)
            finally:
                engine.close()
            size = engine.lora.last_sync["bytes"] if kind == "adapter" else (base / "model.safetensors").stat().st_size
            tensors = adapter_state(lora) if kind == "adapter" else plain.state_dict()
            rows.append({"mode": mode, "sync": kind, "median_s": round(statistics.median(times), 4),
                         "min_s": round(min(times), 4), "file_bytes": int(size),
                         "tensor_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                         "weight_sync": opts.weight_sync if kind == "whole" else "lora"})
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
