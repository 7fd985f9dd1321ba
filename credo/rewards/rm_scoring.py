"""Scoring (prompt, response) pairs with a trained reward model: the batch layout, the pooled score, and a loaded
model shared per process. Used by the ``reward_model`` reward (:mod:`credo.rewards.reward_model`), its HTTP service
(:mod:`credo.rewards.rm_server`) and reward-model training (:mod:`credo.methods.reward_models.train`).

torch is imported inside the functions: reward worker processes that never score with a model start fast.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import torch

    from credo.models import ValueModel
    from credo.types import TrainBatch

_LOCK = threading.Lock()
_MODELS: dict[tuple[str, str], Any] = {}


def response_batch(tokenizer, prompts: list[str], responses: list[str]) -> TrainBatch:
    """Prompt + response (+ EOS) rows in credo's batch layout."""
    from credo.models.tokenizer import encode_prompt, encode_response
    from credo.models.batch import token_batch

    return token_batch([encode_prompt(tokenizer, p) for p in prompts],
                       [encode_response(tokenizer, r) for r in responses], pad_id=tokenizer.pad_token_id)


def rm_scores(rm: ValueModel, batch: TrainBatch, pooling: str = "last") -> torch.Tensor:
    """(B,) a response's reward: the head's output at its last token (``last``, the usual ORM), the mean of
    the head's outputs over its tokens (``mean``: every response token is judged where it is read), or their sum
    (``sum``; an implicit reward model, :mod:`credo.models.implicit`, always sums)."""
    pooling = getattr(rm, "pooling", None) or pooling
    device = next(rm.parameters()).device
    attn = batch.attention_mask.to(device)
    values = rm(batch.input_ids.to(device), attn, batch.position_ids.to(device))  # (B, L)
    if pooling in ("mean", "sum"):
        p, t = batch.prompt_len, batch.responses.shape[1]
        mask = batch.response_mask.to(device)  # (B, T): response token t sits at column P + t
        total = (values[:, p : p + t] * mask).sum(-1)
        return total if pooling == "sum" else total / mask.sum(-1).clamp(min=1.0)
    last = attn.shape[1] - 1 - attn.flip(-1).argmax(-1)  # (B,) index of the last 1
    return values.gather(1, last.unsqueeze(1)).squeeze(1)


class LocalRewardModel:
    """A loaded reward model that scores (prompt, response) batches."""

    def __init__(self, path: str | Path, *, device: str = "cpu", pooling: str = "last", batch_size: int = 64):
        import torch

        from credo.models import ValueModel, load_tokenizer
        from credo.models.hub import resolve_model_path

        path = resolve_model_path(path, key="reward model path")  # a hub id: its snapshot (credo.models.hub)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: not a saved reward model (no config.json); `credo rm train` writes "
                                    "RUN_DIR/reward_model")
        self.path, self.pooling, self.batch_size = str(path), pooling, batch_size
        with torch.random.fork_rng(devices=[]):  # building the head draws random weights: keep the trainer's RNG
            self.model = ValueModel.load(path, device).eval()
        self.tokenizer = load_tokenizer(path)

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        import torch

        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(prompts), self.batch_size):
                batch = response_batch(self.tokenizer, list(prompts[i : i + self.batch_size]),
                                       list(responses[i : i + self.batch_size]))
                out += rm_scores(self.model, batch, self.pooling).cpu().tolist()
        return out


def local_model(path: str, device: str = "cpu", pooling: str = "last", batch_size: int = 64) -> LocalRewardModel:
    """One loaded model per (path, device) per process."""
    key = (str(Path(path).resolve()), device)
    with _LOCK:
        if key not in _MODELS:
            _MODELS[key] = LocalRewardModel(path, device=device, pooling=pooling, batch_size=batch_size)
        model = _MODELS[key]
    model.pooling, model.batch_size = pooling, batch_size
    return model
