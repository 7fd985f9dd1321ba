"""The weight_sync guard's probe on vLLM (credo.guards.weights): d = mean |engine - trainer| log-prob over the fixed
32-token probe, for the demo model in an in-process vLLM engine of each dtype, (a) as started, (b) after an
ordinary sync of perturbed weights, (c) after a stale sync (the weight transfer made a no-op) of (c1) one AdamW
step at the RL default lr 3e-4 and (c2) noise of standard deviation 0.02 on every weight. Run in the vLLM venv:

    OMP_NUM_THREADS=1 timeout 600 python benchmarks/vllm_probe.py
"""
from __future__ import annotations

import torch

from credo.config import ModelConfig
from credo.guards.weights import model_token_logprobs, probe_ids
from credo.models import build_model
from credo.rollout.vllm_engine import VLLMRolloutEngine
from credo.rollout.vllm_transport import VLLMOptions


def probe_d(model: torch.nn.Module, engine: VLLMRolloutEngine) -> float:
    ids = probe_ids(len(engine.tokenizer))
    served = torch.tensor(engine.score_ids([ids], [1])[0])  # (31,)
    local = torch.tensor(model_token_logprobs(model, [ids], [1])[0])  # (31,)
    return float((served - local).abs().mean())


def adamw_step(model: torch.nn.Module, tok, lr: float) -> None:
    """One AdamW step on the NLL of a few demo strings."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    x = torch.tensor([tok("rev abc=cba")["input_ids"]])
    logits = model(input_ids=x).logits[:, :-1]
    torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:]).backward()
    opt.step()
    opt.zero_grad()


def noise(model: torch.nn.Module, std: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * std)


def main() -> None:
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(1)
        model, tok = build_model(ModelConfig(), seed=0)
        eng = VLLMRolloutEngine.from_model(model, tok, options=VLLMOptions(dtype=dtype))
        row = {"started": probe_d(model, eng)}
        noise(model, 0.02)
        eng.update_weights(model, version=1)
        row["synced"] = probe_d(model, eng)
        eng.transport.sync = lambda state, version: None  # every later sync is lost
        adamw_step(model, tok, 3e-4)
        eng.update_weights(model, version=2)
        row["stale_adamw_3e-4"] = probe_d(model, eng)
        noise(model, 0.02)
        eng.update_weights(model, version=3)
        row["stale_noise_0.02"] = probe_d(model, eng)
        eng.close()
        print(f"vLLM {dtype} engine, float32 trainer: " + ", ".join(f"{k} d={v:.2g}" for k, v in row.items()),
              flush=True)


if __name__ == "__main__":
    main()
