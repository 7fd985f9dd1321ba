"""The distillation teacher: a frozen local Hugging Face model on the student's device, and its scoring pass.

The teacher is never checkpointed: a resumed run loads it again from ``distill.teacher.path``.
"""
from __future__ import annotations

import dataclasses

import torch

from credo.config import ConfigError, RunConfig
from credo.models import load_model
from credo.train.forward import ForwardOptions, batched_logprobs
from credo.types import TrainBatch


def check_same_vocab(student_tokenizer, teacher_tokenizer, where: str) -> None:
    """Refuse a teacher whose token ids mean other tokens than the student's (it scores the student's ids)."""
    s, t = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if s != t:
        differ = sum(1 for tok, i in s.items() if t.get(tok) != i) + sum(1 for tok in t if tok not in s)
        raise ConfigError(f"{where}: the teacher's tokenizer differs from the student's ({differ} tokens differ, "
                          f"vocab sizes {len(t)} vs {len(s)}); on-policy distillation scores the student's token ids, "
                          "so both need the same vocabulary")


def load_teacher(cfg: RunConfig, student_tokenizer) -> torch.nn.Module | None:
    """The frozen teacher of ``distill.teacher`` (None when ``distill`` is off), in eval mode, on ``model.device``
    with ``model.dtype``; ConfigError when its tokenizer is not the student's."""
    d = cfg.distill
    if d is None:
        return None
    if d.teacher.url is not None:
        raise NotImplementedError("distill.teacher.url: scoring with a vLLM server's prompt_logprobs is not "
                                  "implemented; set distill.teacher.path to a local Hugging Face directory instead")
    with torch.random.fork_rng(devices=[]):  # loading leaves the run's random stream as it was (same seed, same run)
        teacher, tokenizer = load_model(d.teacher.path, dataclasses.replace(cfg.model, path=d.teacher.path))
    check_same_vocab(student_tokenizer, tokenizer, f"distill.teacher.path={d.teacher.path}")
    return teacher.eval().requires_grad_(False)


def teacher_logprobs(cfg: RunConfig, teacher: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
    """(B, T) the teacher's log-probs of the batch's response tokens, at the batch's sampling temperature (as the
    student's), micro-batched like the policy's passes; zero off the response."""
    logprobs, _ = batched_logprobs(teacher, batch, micro_batch_size=cfg.train.micro_batch_size,
                                   micro_batch_tokens=cfg.train.micro_batch_tokens, temperature=batch.temperature,
                                   opts=ForwardOptions.of(cfg))
    return logprobs * batch.response_mask.to(logprobs.dtype)
