"""An implicit reward model (DPO's reading of a policy as a reward model): ``r(x, y) = beta * sum_t [log pi(y_t | x,
y_<t) - log pi_ref(y_t | x, y_<t)]``, with ``pi`` trained and ``pi_ref`` the frozen model it started from.

It plugs into the reward-model code as a :class:`credo.models.ValueModel` does: ``forward`` returns per-position
values (B, L) — column ``c`` holds ``beta * (log pi - log pi_ref)`` of the token *at* ``c`` (column 0 holds 0) — and
``pooling = "sum"`` makes :func:`credo.rewards.rm_scoring.rm_scores` sum them over the response. Trained with the
Bradley-Terry loss this is DPO; the CRM spec (§17) notes CRM extends to such implicit rewards. Saved as the trained
LM's directory, the reference under ``reference/``, and ``value_head.json`` (``{"kind": "implicit"}``), so
:meth:`credo.models.ValueModel.load` (and the ``reward_model`` reward) load it.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

HEAD_CONFIG = "value_head.json"


class ImplicitRewardModel(torch.nn.Module):
    pooling = "sum"  # rm_scores: the response's reward is the sum of its tokens' values

    def __init__(self, lm: torch.nn.Module, reference: torch.nn.Module, beta: float = 0.1):
        super().__init__()
        self.lm, self.beta = lm, float(beta)
        self.reference = [reference.eval().requires_grad_(False)]  # a list: not a submodule (no grads, not saved)

    @classmethod
    def from_policy(cls, policy: torch.nn.Module, beta: float = 0.1) -> "ImplicitRewardModel":
        return cls(copy.deepcopy(policy), copy.deepcopy(policy), beta)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "ImplicitRewardModel":
        from transformers import AutoModelForCausalLM

        path = Path(path)
        beta = json.loads((path / HEAD_CONFIG).read_text())["args"]["beta"]
        lm = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        ref = AutoModelForCausalLM.from_pretrained(path / "reference", local_files_only=True)
        return cls(lm.to(device), ref.to(device), beta)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        self.lm.save_pretrained(path, safe_serialization=True)
        self.reference[0].save_pretrained(path / "reference", safe_serialization=True)
        (path / HEAD_CONFIG).write_text(json.dumps({"kind": "implicit", "args": {"beta": self.beta}}) + "\n")

    def to(self, *args, **kwargs):
        self.reference[0].to(*args, **kwargs)
        return super().to(*args, **kwargs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        lp = token_logprobs(self.lm, input_ids, attention_mask, position_ids)  # (B, L-1)
        with torch.no_grad():
            ref = token_logprobs(self.reference[0], input_ids, attention_mask, position_ids)
        values = torch.zeros(input_ids.shape, dtype=lp.dtype, device=lp.device)  # (B, L)
        values[:, 1:] = self.beta * (lp - ref)
        return values


def token_logprobs(lm: torch.nn.Module, input_ids, attention_mask, position_ids) -> torch.Tensor:
    """log pi(x_c | x_<c) of every token but the first: (B, L) ids -> (B, L-1), column c-1 holds token c's."""
    logits = lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=False).logits[:, :-1].float()  # (B, L-1, V) predicts columns 1..L-1
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
