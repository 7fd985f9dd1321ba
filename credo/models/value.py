"""Critics: the policy's transformer backbone with a value head.

``values[b, i]`` is the value of the state after reading tokens ``0..i`` of row ``b``; for the
response token ``t`` (row layout of :class:`credo.types.TrainBatch`) the state before it is
column ``P - 1 + t``. Saved as a Hugging Face backbone directory plus ``value_head.safetensors`` and
``value_head.json`` (the head's kind and shape; a directory without it holds a scalar head).

Heads (``critic.head``):

- ``scalar``: one linear output, zero-initialised (PPO's critic, reward models).
- ``quantile``: DVPO's ensemble, ``heads`` x ``quantiles`` linear outputs (``quantiles``: (B, L, N, M));
  the value is the mean over heads and quantiles.
- ``vib``: VRPO's variational information bottleneck: ``h -> (mu, log sigma^2)`` of a ``z_dim`` Gaussian,
  ``z = mu + sigma * eps`` in training (``mu`` in eval; sigma starts near the prior's 1), the value head on ``z``; ``kl`` is
  KL(q(z|h) || N(0, I)) per position. An auxiliary scalar output on ``z`` (``aux``) serves VRPO's
  auxiliary target reading (:mod:`credo.algo.critic`).
- ``flow``: DFPO's value-flow head (:mod:`credo.methods.dfpo.flow_head`, registered from there): a velocity field
  v(z, tau | h) over virtual time; ``values`` is its single-step Euler readout and ``flow`` the field itself (the
  ``dfpo`` critic loss evaluates it).
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from credo.models.build import quiet_transformers
from credo.models.hub import resolve_model_path
from credo.registry import Registry

HEAD_FILE = "value_head.safetensors"
HEAD_CONFIG = "value_head.json"


@dataclass
class CriticOutput:
    """What a critic head says about each position (L = sequence length, or T after slicing to the response)."""

    values: torch.Tensor  # (B, L) float
    quantiles: torch.Tensor | None = None  # (B, L, N, M) quantile head: N heads x M quantile levels
    kl: torch.Tensor | None = None  # (B, L) vib head: KL(q(z|h) || N(0, I))
    aux: torch.Tensor | None = None  # (B, L) vib head: auxiliary prediction
    flow: Any = None  # flow head: its FlowField at these positions (credo.methods.dfpo.flow_head)

    def slice(self, start: int, stop: int) -> "CriticOutput":
        cut = lambda x: None if x is None else x[:, start:stop]  # noqa: E731
        flow = None if self.flow is None else self.flow.slice(start, stop)
        return CriticOutput(cut(self.values), cut(self.quantiles), cut(self.kl), cut(self.aux), flow)


class QuantileHead(torch.nn.Module):
    """N x M quantile outputs; small random weights so the heads start apart and values start near 0."""

    def __init__(self, hidden: int, heads: int = 3, quantiles: int = 200, init_std: float = 1e-3):
        super().__init__()
        if heads < 1 or quantiles < 1:
            raise ValueError(f"quantile head needs heads >= 1 and quantiles >= 1, got {heads}, {quantiles}")
        self.heads, self.quantiles = heads, quantiles
        self.proj = torch.nn.Linear(hidden, heads * quantiles)
        torch.nn.init.normal_(self.proj.weight, std=init_std)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> CriticOutput:
        q = self.proj(h).float().unflatten(-1, (self.heads, self.quantiles))  # (B, L, N, M)
        return CriticOutput(values=q.mean(dim=(-1, -2)), quantiles=q)


class VIBHead(torch.nn.Module):
    """VRPO's information-bottleneck head (module docstring)."""

    def __init__(self, hidden: int, z_dim: int = 32):
        super().__init__()
        self.encoder = torch.nn.Linear(hidden, 2 * z_dim)
        self.value = torch.nn.Linear(z_dim, 1)
        self.aux = torch.nn.Linear(z_dim, 1)
        for lin in (self.value, self.aux):
            torch.nn.init.zeros_(lin.weight)
            torch.nn.init.zeros_(lin.bias)

    def forward(self, h: torch.Tensor) -> CriticOutput:
        mu, logvar = self.encoder(h).float().chunk(2, dim=-1)  # (B, L, Z) each
        logvar = logvar.clamp(-20.0, 10.0)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp() if self.training else mu
        kl = 0.5 * (mu.square() + logvar.exp() - 1.0 - logvar).sum(-1)  # (B, L)
        z = z.to(self.value.weight.dtype)
        return CriticOutput(values=self.value(z).squeeze(-1).float(), kl=kl, aux=self.aux(z).squeeze(-1).float())


# critic.head -> factory(hidden, **head_args) -> the head module (positional hidden: the flow head has a `hidden` arg);
# a method's head registers from its package, named among the built-ins (DFPO's ``flow``)
CRITIC_HEADS: Registry[Any] = Registry("critic head", builtins=("credo.methods.dfpo.flow_head",))
CRITIC_HEADS.add("quantile", QuantileHead)
CRITIC_HEADS.add("vib", VIBHead)


@CRITIC_HEADS.register("scalar")
def scalar_head(hidden: int, /, **_ignored) -> torch.nn.Module:  # head_args were never checked for it
    head = torch.nn.Linear(hidden, 1)
    torch.nn.init.zeros_(head.weight)  # V = 0 at the start: advantages = raw returns
    torch.nn.init.zeros_(head.bias)
    return head


def build_head(kind: str, hidden: int, /, **args) -> torch.nn.Module:
    """The critic head ``kind`` (UnknownName, a ValueError, for an unregistered kind)."""
    return CRITIC_HEADS.get(kind)(hidden, **args)


class ValueModel(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module, head: str = "scalar", **head_args):
        super().__init__()
        self.backbone = backbone
        self.head_kind, self.head_args = head, dict(head_args)
        hidden = backbone.config.get_text_config().hidden_size  # a vision-language backbone's text width
        self.value_head = build_head(head, hidden, **head_args)
        self.value_head.to(dtype=next(backbone.parameters()).dtype)  # e.g. a bfloat16 backbone

    @classmethod
    def from_policy(cls, policy: torch.nn.Module, head: str = "scalar", **head_args) -> "ValueModel":
        """A critic initialised from the policy's backbone (a copy; the policy is not shared). A LoRA policy's
        backbone is copied with its adapters merged into plain weights, every one of them trained by the critic."""
        from credo.models.lora import merged_copy

        lora = any("lora_" in name for name, _ in policy.base_model.named_parameters())
        backbone = merged_copy(policy.base_model) if lora else copy.deepcopy(policy.base_model)
        model = cls(backbone, head, **head_args)
        return model.to(next(policy.parameters()).device)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", *, key: str = "critic.path") -> "ValueModel":
        """A saved critic / reward model (:meth:`save`) from a local directory or a hub id (credo.models.hub)."""
        quiet_transformers()
        path = resolve_model_path(path, key=key)
        spec = json.loads((path / HEAD_CONFIG).read_text()) if (path / HEAD_CONFIG).is_file() else {"kind": "scalar"}
        if spec["kind"] == "implicit":  # a DPO-style reward model (credo.models.implicit), loaded the same way
            from credo.models.implicit import ImplicitRewardModel

            return ImplicitRewardModel.load(path, device)
        model = cls(AutoModel.from_pretrained(path, local_files_only=True), spec["kind"], **spec.get("args", {}))
        model.value_head.load_state_dict(load_file(path / HEAD_FILE))
        return model.to(device)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path, safe_serialization=True)
        save_file({k: v.contiguous() for k, v in self.value_head.state_dict().items()}, path / HEAD_FILE)
        (path / HEAD_CONFIG).write_text(json.dumps({"kind": self.head_kind, "args": self.head_args}) + "\n")

    def outputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, pixel_values: torch.Tensor | None = None) -> CriticOutput:
        images = {} if pixel_values is None else {"pixel_values": pixel_values}  # a vision-language backbone
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, **images)
        head = self.value_head(out.last_hidden_state)
        if isinstance(head, torch.Tensor):  # a scalar head: (B, L, 1)
            return CriticOutput(values=head.squeeze(-1).float())
        # a head gives its CriticOutput, or an object that reads one out (DFPO's flow field: its value readout)
        return head if isinstance(head, CriticOutput) else head.critic_output()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self.outputs(input_ids, attention_mask, position_ids).values  # (B, L)
