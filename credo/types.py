"""Typed records passed between pipeline stages.

    prompts -> rollout -> rewards -> advantages -> per-token losses -> update

Every stage consumes and produces one of these small dataclasses instead of dicts of unknown keys.
Tensor shapes are written in comments: B = sequences in the batch, T = padded response length,
P = padded prompt length.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from credo.registry import Registry

if TYPE_CHECKING:  # torch stays out of this module so reward worker processes start fast
    import torch

FinishReason = Literal["eos", "length"]


@dataclass(frozen=True)
class Example:
    """One task instance: the text shown to the model and what a verifier needs to score an answer."""

    prompt: str
    answer: str  # reference answer (exact-match target, Countdown target spec, math solution, ...)
    uid: str = ""  # stable identifier (task name + split + index, or file + line)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    max_new_tokens: int = 16
    greedy: bool = False
    seed: int | None = None  # per-call seed (like vLLM's per-request seed); None = the engine's own RNG stream

    @classmethod
    def of(cls, rollout) -> "SamplingParams":
        """A run's training sampling: the ``rollout`` config section's temperature, top-p, top-k and length cap."""
        return cls(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                   max_new_tokens=rollout.max_new_tokens)


@dataclass
class Trajectory:
    """One sampled response to one prompt, as the rollout engine produced it."""

    example: Example
    group_id: int  # index of the prompt in the step's batch; samples of one prompt share it
    prompt_ids: list[int]
    response_ids: list[int]  # includes the EOS token when finish_reason == "eos"
    rollout_logprobs: list[float]  # sampler's log-prob of each response token (temperature-scaled, unfiltered)
    response_mask: list[int]  # 1 where the token counts in the loss
    finish_reason: FinishReason
    response_text: str = ""  # decoded response without special tokens
    # multi-turn episodes: [start, end) of each assistant turn in response coordinates, and episode facts
    turns: list[tuple[int, int]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    policy_version: int = 0  # the policy (optimizer steps taken) whose weights sampled this response
    # partial rollouts (rollout.partial): the policy version of each response token (empty: all policy_version)
    token_versions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RewardResult:
    """What a verifier says about one response."""

    score: float
    correct: bool = False  # whether the answer is judged correct (accuracy metrics count this)
    failed: bool = False  # the verifier raised or timed out; `score` is then the configured failure score
    error: str = ""  # short description of the failure ("timeout after 5.0s", "ValueError: ...")
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rollouts:
    """One step's collected samples and their rewards, as a collector returns them."""

    trajs: list[Trajectory]  # the samples to train on (group ids renumbered 0..K-1)
    results: list[RewardResult]
    metrics: dict[str, float] = field(default_factory=dict)
    sampling: SamplingParams | None = None  # how the engine sampled them (None: a checkpoint older than the field)


@dataclass
class TrainBatch:
    """A padded batch ready for the policy forward pass.

    Row layout: ``input_ids = [left-padded prompt (P) | right-padded response (T)]`` so the logits
    that predict response token t sit at column ``P - 1 + t`` for every row.
    """

    input_ids: torch.Tensor  # (B, P + T) long
    attention_mask: torch.Tensor  # (B, P + T) long
    position_ids: torch.Tensor  # (B, P + T) long
    responses: torch.Tensor  # (B, T) long, pad where response_mask == 0
    response_mask: torch.Tensor  # (B, T) float 0/1
    prompt_len: int  # P
    rollout_logprobs: torch.Tensor  # (B, T)
    scores: torch.Tensor  # (B,) verifier scores
    group_ids: torch.Tensor  # (B,) long
    old_logprobs: torch.Tensor | None = None  # (B, T)
    ref_logprobs: torch.Tensor | None = None  # (B, T)
    advantages: torch.Tensor | None = None  # (B, T)
    returns: torch.Tensor | None = None  # (B, T)
    entropy: torch.Tensor | None = None  # (B, T) from the old-log-prob pass
    values: torch.Tensor | None = None  # (B, T) critic values at collection time
    # how the rows were sampled, set once by credo.models.batch.collate: the trainer's forwards use this temperature
    temperature: float = 1.0  # the sampling temperature (rollout_logprobs are temperature-scaled at it)

    # the tensors only some runs have (the sampled flags, images, quantile and flow critics' inputs and targets, the
    # reference's entropy, the token rewards, a method's own), under names their writers declare
    # (:data:`BATCH_EXTRAS`): (B, ...) per row, or (B, T, ...) per response token (sliced with the rows by
    # ``select``, and with the columns by micro-batch trims when declared per token)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.responses.shape[0])

    def select(self, idx: torch.Tensor) -> "TrainBatch":
        """Rows ``idx`` of every tensor field and extra (for mini- and micro-batches)."""
        out = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            out[name] = v[idx] if hasattr(v, "index_select") else v
        out["extras"] = {k: v[idx] if hasattr(v, "index_select") else v for k, v in self.extras.items()}
        return TrainBatch(**out)

    def extra(self, name: str) -> Any:
        """The extra ``name`` (declared in :data:`BATCH_EXTRAS`; KeyError naming the writer when it is absent)."""
        if name not in self.extras:
            spec = BATCH_EXTRAS.get(name)  # UnknownName (with a suggestion) for an undeclared name
            raise KeyError(f"batch extra {name!r} is absent: its writer did not run on this batch ({spec})")
        return self.extras[name]

    def set_extra(self, name: str, value: Any) -> None:
        """Add or replace the declared extra ``name``."""
        BATCH_EXTRAS.get(name)
        self.extras[name] = value


@dataclass(frozen=True)
class ExtraSpec:
    """A declared batch extra: who writes it, its shape and meaning (``description``), and whether it is laid out
    per response token, (B, T, ...) (``per_token``: micro-batch trims cut its columns), or per row, (B, ...)."""

    description: str
    per_token: bool = True

    def __str__(self) -> str:
        return self.description


# batch extra name -> its ExtraSpec; a module declares the extras it writes once (``declare_extra``), so a misspelt
# name fails with a suggestion instead of reading nothing. The built-ins: collate's sampled flags and images
# (credo.models.batch), the critic pass's value quantiles (credo.train.forward), DFPO's flow targets and weights
# (credo.train.flow_targets), the step's reference entropy, token rewards and return quantiles
# (credo.recipes.step), distillation's teacher log-probs (credo.methods.distill.terms)
BATCH_EXTRAS: Registry[ExtraSpec] = Registry(
    "batch extra", builtins=("credo.models.batch", "credo.train.forward", "credo.train.flow_targets",
                             "credo.recipes.step", "credo.methods.distill.terms"), same=lambda a, b: a == b)


def declare_extra(name: str, description: str, *, per_token: bool = True) -> str:
    """Declare the batch extra ``name`` (``description``: its writer, shape and meaning; ``per_token``: (B, T, ...)
    per response token, else (B, ...) per row); returns the name."""
    BATCH_EXTRAS.add(name, ExtraSpec(description, per_token))
    return name


@dataclass
class LossOutput:
    """A policy loss after aggregation."""

    loss: torch.Tensor  # scalar, differentiable w.r.t. logprobs
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class AdvantageOutput:
    advantages: torch.Tensor  # (B, T), zero outside response_mask
    returns: torch.Tensor | None = None  # (B, T) where the estimator defines returns
    return_quantiles: torch.Tensor | None = None  # (B, T, M) distributional critics' quantile targets
    metrics: dict[str, float] = field(default_factory=dict)
