"""A critic: the policy's transformer backbone with a scalar value head.

``values[b, i]`` is the value of the state after reading tokens ``0..i`` of row ``b``; for the
response token ``t`` (row layout of :class:`credo.types.TrainBatch`) the state before it is
column ``P - 1 + t``. Saved as a Hugging Face backbone directory plus ``value_head.safetensors``.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from credo.models.build import quiet_transformers

HEAD_FILE = "value_head.safetensors"


class ValueModel(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module):
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        self.value_head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.value_head.weight)  # V = 0 at the start: advantages = raw returns
        torch.nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy: torch.nn.Module) -> "ValueModel":
        """A critic initialised from the policy's backbone (a copy; the policy is not shared)."""
        backbone = copy.deepcopy(policy.base_model)
        model = cls(backbone)
        return model.to(next(policy.parameters()).device)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "ValueModel":
        quiet_transformers()
        path = Path(path)
        model = cls(AutoModel.from_pretrained(path, local_files_only=True))
        model.value_head.load_state_dict(load_file(path / HEAD_FILE))
        return model.to(device)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path, safe_serialization=True)
        save_file({k: v.contiguous() for k, v in self.value_head.state_dict().items()}, path / HEAD_FILE)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
        return self.value_head(out.last_hidden_state).squeeze(-1).float()  # (B, L)
