"""BiRM's model (``seed-algorithms.md`` §16, ``BiVerifier``): a causal LM initialised from the generator, with two
scalar heads on the last hidden state, a reward head and a value head. Each head computes
``Linear(Dropout_0.2(g * h + b))`` with learned scalars ``g`` (1) and ``b`` (0); the linear weight starts as the mean
output-embedding vector (bias 0). Raw regression outputs, no sigmoid. The LM head is kept for the optional
next-token loss (``loss_on_llm``). Saved as the LM's Hugging Face directory plus ``birm_heads.safetensors``.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HEADS_FILE = "birm_heads.safetensors"


class BiHead(torch.nn.Module):
    def __init__(self, hidden: int, init_weight: torch.Tensor | None = None, dropout: float = 0.2):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(()))
        self.shift = torch.nn.Parameter(torch.zeros(()))
        self.dropout = torch.nn.Dropout(dropout)
        self.linear = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.linear.bias)
        if init_weight is not None:
            with torch.no_grad():
                self.linear.weight.copy_(init_weight.reshape(1, hidden))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(self.dropout(self.gain * h + self.shift)).squeeze(-1).float()  # (B, L)


class BiRewardModel(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm
        hidden = lm.config.hidden_size
        mean_embedding = lm.get_output_embeddings().weight.detach().float().mean(0)  # (H,)
        self.reward_head = BiHead(hidden, mean_embedding)
        self.value_head = BiHead(hidden, mean_embedding)
        for head in (self.reward_head, self.value_head):
            head.to(dtype=next(lm.parameters()).dtype)

    @classmethod
    def from_policy(cls, policy: torch.nn.Module) -> "BiRewardModel":
        """A BiRM initialised from the generator (a copy; the policy is not shared)."""
        return cls(copy.deepcopy(policy))

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "BiRewardModel":
        from transformers import AutoModelForCausalLM

        from credo.models.build import quiet_transformers

        quiet_transformers()
        path = Path(path)
        model = cls(AutoModelForCausalLM.from_pretrained(path, local_files_only=True))
        heads = load_file(path / HEADS_FILE)
        for name in ("reward_head", "value_head"):
            getattr(model, name).load_state_dict({k.split(".", 1)[1]: v for k, v in heads.items()
                                                  if k.startswith(name + ".")})
        return model.to(device)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(path, safe_serialization=True)
        heads = {f"{name}.{k}": v.contiguous() for name in ("reward_head", "value_head")
                 for k, v in getattr(self, name).state_dict().items()}
        save_file(heads, path / HEADS_FILE)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                with_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(reward (B, L), value (B, L), LM logits (B, L, V) if ``with_logits``)."""
        out = self.lm.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 use_cache=False)
        h = out.last_hidden_state
        logits = self.lm.get_output_embeddings()(h) if with_logits else None
        return self.reward_head(h), self.value_head(h), logits
