"""Seconds per weight sync into vLLM, in process and to a server credo starts, for the demo model and SmolLM2-135M
(prepared weights if present, else its architecture with random weights), interleaving the backends on one engine
(started with ``credo_torchdist``, which also takes safetensors syncs) so every ratio compares syncs of the same
run (docs/distributed.md, "Weight sync"). Run in the vLLM venv.

- ``safetensors``: the state as safetensors chunks inside the update requests (the fallback; the "before").
- ``torchdist``: a gloo group with vLLM's worker, metadata in the request, tensors broadcast in buckets; every
  tensor sent (the change tracker reset first, so the checksums are paid and find everything new).
- ``torchdist-1layer``: one decoder layer's weight changed since the last sync: only that layer travels.
- ``torchdist-nosum``: every tensor, no checksums (what the change tracker costs when everything changed).

    python benchmarks/vllm_sync.py                  # both models, both modes, 5 rounds each
    python benchmarks/vllm_sync.py --models smollm2 --modes inprocess server --reps 5 --bucket-mb 32
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

KINDS = ("safetensors", "torchdist", "torchdist-1layer", "torchdist-nosum")


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


def measure(model, tok, mode: str, reps: int, bucket_mb: int) -> tuple[float, dict[str, list[float]], int]:
    from credo.rollout.torchdist_sync import TorchDistWeightSync
    from credo.rollout.vllm_engine import VLLMRolloutEngine
    from credo.rollout.vllm_sync import LLMClient, SafetensorsSync
    from credo.rollout.vllm_transport import VLLMOptions

    t0 = time.perf_counter()
    engine = VLLMRolloutEngine.from_model(model, tok, options=VLLMOptions(
        mode=mode, dtype="float32", weight_sync="torchdist", weight_sync_bucket_mb=bucket_mb))
    start = time.perf_counter() - t0
    t = engine.transport
    client = LLMClient(t.llm) if mode == "inprocess" else t.weights
    torchdist: TorchDistWeightSync = t.weights if mode == "inprocess" else t.sender
    safetensors = SafetensorsSync(client)
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    version = 0
    layer = next(n for n in model.state_dict() if ".layers.1." in n and n.endswith("down_proj.weight"))
    try:
        for rep in range(reps):
            # fresh tensors of new content, as after an optimizer step
            state = {k: p + 1e-4 * (rep + 1) for k, p in model.state_dict().items()}
            for kind in KINDS[rep % len(KINDS):] + KINDS[:rep % len(KINDS)]:  # each kind in each place in turn
                version += 1
                if kind == "torchdist-1layer":  # one layer changed since the last sync (of whichever kind)
                    if torchdist.tracker.version != str(version - 1):
                        torchdist.only_changed = True
                        torchdist.sync(state, version=version)  # not timed: the tracker learns the state
                        version += 1
                    state[layer] = state[layer] * 1.001
                torchdist.only_changed = kind != "torchdist-nosum"
                if kind == "torchdist":
                    torchdist.tracker.forget()
                t0 = time.perf_counter()
                (safetensors if kind == "safetensors" else torchdist).sync(state, version=version)
                times[kind].append(time.perf_counter() - t0)
                assert engine.served_version() == str(version)
                if kind == "torchdist-1layer":
                    assert torchdist.stats.tensors < torchdist.stats.tensors_total
    finally:
        engine.close()
    nbytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    return start, times, nbytes


def _wire_receiver(port: int, sizes: list[int], rounds: int) -> None:
    from credo.rollout.torchdist_sync import broadcast, open_group

    group = open_group("127.0.0.1", port, rank=1, world_size=2, timeout_s=120)
    for _ in range(rounds):
        for n in sizes:
            broadcast(group, torch.empty(n, dtype=torch.uint8)).wait()


def wire(model, reps: int, bucket_mb: int) -> list[float]:
    """Seconds to pack and broadcast the whole state to another process on loopback (the transport alone, no
    vLLM: what the engine's load adds on top is the rest of a torchdist sync)."""
    import multiprocessing as mp

    from credo.rollout.torchdist_sync import broadcast, free_port, open_group, pack, plan_buckets

    state = model.state_dict()
    buckets = plan_buckets(state.items(), bucket_mb << 20)
    port = free_port()
    proc = mp.get_context("spawn").Process(target=_wire_receiver, args=(port, [b["nbytes"] for b in buckets], reps))
    proc.start()
    group = open_group("127.0.0.1", port, rank=0, world_size=2, timeout_s=120)
    out = []
    bufs = [torch.empty(max(b["nbytes"] for b in buckets), dtype=torch.uint8) for _ in range(2)]
    for _ in range(reps):
        t0 = time.perf_counter()
        work = None
        for i, meta in enumerate(buckets):
            buf = pack([state[n] for n in meta["names"]], meta, bufs[i % 2])
            if work is not None:
                work.wait()
            work = broadcast(group, buf)
        work.wait()
        out.append(time.perf_counter() - t0)
    proc.join(60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["demo", "smollm2"], choices=("demo", "smollm2"))
    ap.add_argument("--modes", nargs="+", default=["inprocess", "server"], choices=("inprocess", "server"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bucket-mb", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of this (the trainer's) process: on a 2-core machine 2 threads contend with "
                         "vLLM's own processes, and a server's made the trainer's checksums 15x slower")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    medians: dict[tuple[str, str], dict[str, float]] = {}
    for name in args.models:
        model, tok, what = build(name)
        nbytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
        w = wire(model, args.reps, args.bucket_mb)
        print(f"{name} wire only (pack + gloo broadcast to another process, loopback, {args.bucket_mb} MiB buckets): "
              f"median {statistics.median(w):.3f} s, {nbytes / statistics.median(w) / 1e9:.2f} GB/s "
              f"(min {min(w):.3f}, max {max(w):.3f})", flush=True)
        for mode in args.modes:
            start, times, nbytes = measure(model, tok, mode, args.reps, args.bucket_mb)
            med = medians[(name, mode)] = {k: statistics.median(v) for k, v in times.items()}
            base = med["safetensors"]
            print(f"{name} ({what}, {nbytes / 2**20:.0f} MiB float32) {mode}: start-up {start:.1f} s; "
                  f"median of {args.reps} interleaved rounds:", flush=True)
            for kind in KINDS:
                v = times[kind]
                print(f"  {kind:17s} {med[kind]:.3f} s (min {min(v):.3f}, max {max(v):.3f})  "
                      f"{nbytes / med[kind] / 1e9:5.2f} GB/s of the state  x{base / med[kind]:.2f} vs safetensors",
                      flush=True)
        if {"inprocess", "server"} <= set(args.modes):
            for kind in KINDS:
                print(f"{name} {kind}: server / in process = "
                      f"{medians[(name, 'server')][kind] / medians[(name, 'inprocess')][kind]:.2f}", flush=True)


if __name__ == "__main__":
    main()
