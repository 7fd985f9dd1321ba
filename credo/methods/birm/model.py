"""BiRM's model (docs/reward_models.md, BiRM; the reference's ``BiVerifier``): a causal LM initialised from the
generator, with two
scalar heads on the last hidden state, a reward head and a value head. Each head computes
``Linear(Dropout_0.2(g * h + b))`` with learned scalars ``g`` (1) and ``b`` (0); the linear weight starts as the mean
output-embedding vector (bias 0). Raw regression outputs, no sigmoid. The LM head is kept for the optional
next-token loss (``loss_on_llm``). Saved as the LM's Hugging Face directory plus ``birm_heads.safetensors``.

:class:`LogRatioBiRM` (``birm.heads=logratio``, a credo extension) reads both heads from the LM's token
log-ratios against the frozen generator (:func:`credo.methods.birm.algo.logratio_heads`); saved with the generator under
``reference/`` and ``birm.json``. :meth:`BiRewardModel.load` loads either kind.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HEADS_FILE = "birm_heads.safetensors"
KIND_FILE = "birm.json"  # {"heads": "logratio", "beta": ...}; absent = the linear heads


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
    def load(cls, path: str | Path, device: str = "cpu") -> "BiRewardModel | LogRatioBiRM":
        from credo.models.hub import resolve_model_path

        path = resolve_model_path(path, key="BiRM path")  # a hub id: its snapshot (credo.models.hub)
        if (path / KIND_FILE).is_file():
            return LogRatioBiRM.load(path, device)
        model = cls(_load_lm(path))
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

    def step_heads(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Reward and value head outputs at every response position of a :class:`TrainBatch`, (B, T) each."""
        device = next(self.parameters()).device
        reward, value, _ = self(batch.input_ids.to(device), batch.attention_mask.to(device),
                                batch.position_ids.to(device))
        p, t = batch.prompt_len, batch.responses.shape[1]
        return reward[:, p : p + t], value[:, p : p + t]


def _load_lm(path: Path):
    from transformers import AutoModelForCausalLM

    from credo.models.build import quiet_transformers

    quiet_transformers()
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True)


class LogRatioBiRM(torch.nn.Module):
    """BiRM whose two heads read the LM's token log-ratios against the frozen generator: ``Q_t = beta *
    sum_{s<=t} log pi(y_s)/pi_ref(y_s)``, ``R_t = sigmoid(Q_t + b_R)``, ``V_t = sigmoid(Q_t + b_V)`` (learned
    biases, 0 at the start). The LM starts as the generator's copy; the reference is the generator, frozen."""

    def __init__(self, lm: torch.nn.Module, reference: torch.nn.Module, beta: float = 0.3):
        super().__init__()
        self.lm, self.beta = lm, float(beta)
        self.reference = [reference.eval().requires_grad_(False)]  # a list: not a submodule (no grads)
        self.reward_bias = torch.nn.Parameter(torch.zeros(()))
        self.value_bias = torch.nn.Parameter(torch.zeros(()))

    @classmethod
    def from_policy(cls, policy: torch.nn.Module, beta: float = 0.3) -> "LogRatioBiRM":
        return cls(copy.deepcopy(policy), copy.deepcopy(policy), beta)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "LogRatioBiRM":
        path = Path(path)
        meta = json.loads((path / KIND_FILE).read_text())
        model = cls(_load_lm(path), _load_lm(path / "reference"), meta["beta"])
        biases = load_file(path / HEADS_FILE)
        with torch.no_grad():
            model.reward_bias.copy_(biases["reward_bias"])
            model.value_bias.copy_(biases["value_bias"])
        return model.to(device)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(path, safe_serialization=True)
        self.reference[0].save_pretrained(path / "reference", safe_serialization=True)
        save_file({"reward_bias": self.reward_bias.detach().clone(), "value_bias": self.value_bias.detach().clone()},
                  path / HEADS_FILE)
        (path / KIND_FILE).write_text(json.dumps({"heads": "logratio", "beta": self.beta}) + "\n")

    def to(self, *args, **kwargs):
        self.reference[0].to(*args, **kwargs)
        return super().to(*args, **kwargs)

    @staticmethod
    def _response_logprobs(lm: torch.nn.Module, batch, device) -> torch.Tensor:
        """(B, T) log-probs of the batch's response tokens (the implicit reward model's token log-probs, sliced)."""
        from credo.models.implicit import token_logprobs

        p, t = batch.prompt_len, batch.responses.shape[1]
        lp = token_logprobs(lm, batch.input_ids.to(device), batch.attention_mask.to(device),
                            batch.position_ids.to(device))  # (B, L-1): column c-1 holds token c
        return lp[:, p - 1 : p - 1 + t]

    def step_heads(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        from credo.methods.birm.algo import logratio_heads

        device = self.reward_bias.device
        lp = self._response_logprobs(self.lm, batch, device)  # (B, T)
        with torch.no_grad():
            ref = self._response_logprobs(self.reference[0], batch, device)
        return logratio_heads(lp, ref, batch.response_mask.to(device), beta=self.beta,
                              reward_bias=self.reward_bias, value_bias=self.value_bias)

    def forward(self, input_ids, attention_mask, position_ids, with_logits: bool = True):
        """The LM's logits only (``loss_on_llm``); the heads need the response span: :meth:`step_heads`."""
        logits = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False).logits
        return None, None, logits
