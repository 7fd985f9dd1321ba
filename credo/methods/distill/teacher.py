"""The distillation teacher: a frozen local Hugging Face model on the student's device (``distill.teacher.path``)
or a vLLM server (``distill.teacher.url``, :class:`ServerTeacher`), and its scoring pass.

The teacher is never checkpointed: a resumed run loads it again from ``distill.teacher.path`` (or reconnects).
"""
from __future__ import annotations

import dataclasses

import torch

from credo.config import ConfigError, RunConfig
from credo.models import load_model
from credo.models.batch import PIXEL_VALUES
from credo.rollout.vllm_transport import VLLMScorer
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
        if cfg.rollout.temperature != 1.0:
            raise ConfigError(f"distill.teacher.url scores at temperature 1 (vLLM's prompt log-probs are the raw "
                              f"log-softmax) but rollout.temperature={cfg.rollout.temperature:g}; sample at 1 or "
                              "use distill.teacher.path")
        return ServerTeacher(d.teacher.url, student_tokenizer, timeout_s=d.teacher.timeout_s)
    with torch.random.fork_rng(devices=[]):  # loading leaves the run's random stream as it was (same seed, same run)
        teacher, tokenizer = load_model(d.teacher.path, dataclasses.replace(cfg.model, path=d.teacher.path),
                                        key="distill.teacher.path")
    check_same_vocab(student_tokenizer, tokenizer, f"distill.teacher.path={d.teacher.path}")
    return teacher.eval().requires_grad_(False)


def teacher_logprobs(cfg: RunConfig, teacher: torch.nn.Module | ServerTeacher, batch: TrainBatch) -> torch.Tensor:
    """(B, T) the teacher's log-probs of the batch's response tokens, at the batch's sampling temperature (as the
    student's), micro-batched like the policy's passes; zero off the response."""
    if isinstance(teacher, ServerTeacher):
        return teacher.logprobs(batch)
    logprobs, _ = batched_logprobs(teacher, batch, micro_batch_size=cfg.train.micro_batch_size,
                                   micro_batch_tokens=cfg.train.micro_batch_tokens, temperature=batch.temperature,
                                   opts=ForwardOptions.of(cfg))
    return logprobs * batch.response_mask.to(logprobs.dtype)


VOCAB_PROBE = 1024  # student ids (evenly spread, the last included) the server must decode as the student does
PROBE_CHUNK = 128


def check_server_vocab(scorer: VLLMScorer, student_tokenizer, where: str) -> None:
    """Refuse a server whose token ids mean other tokens than the student's: it must decode up to
    :data:`VOCAB_PROBE` of the student's ids (all of them for a smaller vocabulary; the last id included), in chunks
    of :data:`PROBE_CHUNK`, to the text the student's tokenizer decodes them to (ConfigError otherwise)."""
    n = len(student_tokenizer)
    ids = list(range(n)) if n <= VOCAB_PROBE else sorted({i * (n - 1) // (VOCAB_PROBE - 1) for i in range(VOCAB_PROBE)})
    for k in range(0, len(ids), PROBE_CHUNK):
        chunk = ids[k : k + PROBE_CHUNK]
        served, own = scorer.detokenize(chunk), student_tokenizer.decode(chunk)
        if served != own:
            raise ConfigError(f"{where}: the server's tokenizer differs from the student's (ids "
                              f"{chunk[0]}..{chunk[-1]} decode to {served[:40]!r} there, {own[:40]!r} here; student "
                              f"vocab size {n}); on-policy distillation scores the student's token ids, so both "
                              "need the same vocabulary")


class ServerTeacher:
    """``distill.teacher.url``: the teacher is a vLLM OpenAI-compatible server (any; no RL routes needed) that
    scores the student's prompt + response ids with ``prompt_logprobs`` (credo.rollout.vllm_transport.VLLMScorer):
    raw log-softmax, temperature 1, in the server's dtype. Its vocabulary is checked at start
    (:func:`check_server_vocab`)."""

    def __init__(self, url: str, student_tokenizer, *, timeout_s: float = 600.0, concurrency: int = 16) -> None:
        where = f"distill.teacher.url={url}"
        try:
            self.scorer = VLLMScorer(url, timeout_s=timeout_s, concurrency=concurrency)
        except OSError as exc:  # URLError, connection refused, timeouts
            raise ConfigError(f"{where}: cannot reach a vLLM server there ({exc})") from None
        check_server_vocab(self.scorer, student_tokenizer, where)

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """(B, T) the server's log-probs of each row's response tokens given its prompt and the response before
        them; 0 off the response mask (NaN where the server gave none)."""
        if batch.temperature != 1.0:
            raise ValueError(f"distill.teacher.url scores at temperature 1, the batch was sampled at "
                             f"{batch.temperature:g}")
        if PIXEL_VALUES in batch.extras:
            raise ValueError("distill.teacher.url scores token ids only; a vision batch needs distill.teacher.path")
        real = batch.attention_mask.bool()  # (B, P + T): left-padded prompts, right-padded responses
        seqs = [batch.input_ids[b][real[b]].tolist() for b in range(batch.batch_size)]
        starts = real[:, : batch.prompt_len].sum(-1).tolist()  # each row's prompt length
        scored = self.scorer.score(seqs)
        out = torch.zeros(batch.responses.shape, dtype=torch.float32)  # (B, T)
        for b, (lp, start) in enumerate(zip(scored, starts)):
            resp = torch.tensor(lp[start:], dtype=torch.float32)  # (r_b,)
            out[b, : resp.numel()] = resp
        return torch.where(batch.response_mask > 0, out, torch.zeros_like(out))

    def close(self) -> None:
        self.scorer.close()
