"""Interaction Distillation's teacher: a tiny bidirectional cross-encoder (docs/reward_models.md, [derived]).

``transformers.BertModel(BertConfig(...), add_pooling_layer=True)`` built from scratch with eager attention (the only
kind that returns its maps) and a linear head on the pooler output: logit = g(pooler) for "the first response is
preferred". It reads ``[CLS] x [SEP] y_a [SEP] y_b [SEP]`` with ``token_type_ids`` 0 / 1 / 2 for prompt / first /
second response, and shares credo's character tokenizer (ids ``len(tokenizer)`` and ``len(tokenizer) + 1`` are
[CLS] and [SEP]), so its tokens align one to one with the student's (:func:`student_positions`).

Training: BCE on the logit, each pair shown in a random order (a position-bias guard); accuracy is reported in both
orders and averaged (:func:`teacher_accuracy`). Saved as a Hugging Face directory plus ``teacher_head.safetensors``.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel

from credo.config import ConfigError
from credo.methods.reward_models.pairs import PreferencePair
from credo.models.build import quiet_transformers
from credo.models.hub import resolve_model_path
from credo.models.tokenizer import build_char_tokenizer
from credo.train.optim import build_optimizer, build_scheduler, clip_and_step

log = logging.getLogger(__name__)
HEAD_FILE = "teacher_head.safetensors"


def check_char_tokenizer(tokenizer) -> None:
    """Refuse a tokenizer other than credo's character tokenizer: the token alignment rests on it (a BPE tokenizer
    would need an offset mapping from teacher to student tokens, not implemented)."""
    if tokenizer.get_vocab() != build_char_tokenizer().get_vocab():
        raise ConfigError("rm.method=idrm: the teacher aligns tokens one to one through credo's character tokenizer; "
                          "this model's tokenizer differs (a BPE tokenizer needs an offset mapping, not implemented)")


@dataclass
class TeacherBatch:
    input_ids: torch.Tensor  # (B, Lt) [CLS] x [SEP] y_a [SEP] y_b [SEP], right-padded
    token_type_ids: torch.Tensor  # (B, Lt) 0 prompt (with [CLS] and the first [SEP]), 1 first, 2 second response
    attention_mask: torch.Tensor  # (B, Lt)
    first_start: list[int]  # position of y_a's first token; its [SEP] at first_start + len(y_a)
    second_start: list[int]  # position of y_b's first token; its [SEP] at second_start + len(y_b)


def encode_pairs(tokenizer, prompts: list[str], first: list[str], second: list[str]) -> TeacherBatch:
    """The teacher's input rows (module docstring)."""
    cls_id, sep_id, pad = len(tokenizer), len(tokenizer) + 1, tokenizer.pad_token_id
    enc = lambda s: list(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    rows, types, starts_a, starts_b = [], [], [], []
    for x, a, b in zip(prompts, first, second):
        xi, ai, bi = enc(x), enc(a), enc(b)
        rows.append([cls_id, *xi, sep_id, *ai, sep_id, *bi, sep_id])
        types.append([0] * (len(xi) + 2) + [1] * (len(ai) + 1) + [2] * (len(bi) + 1))
        starts_a.append(len(xi) + 2)
        starts_b.append(len(xi) + len(ai) + 3)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    tt = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, types)):
        ids[i, : len(r)], tt[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), torch.tensor(t), 1
    return TeacherBatch(ids, tt, mask, starts_a, starts_b)


def student_positions(prompt_len: int, width: int, prompt_lens: list[int], response_lens: list[int],
                      starts: list[int]) -> torch.Tensor:
    """(B, L) teacher position of every column of student rows ``<bos> x y <eos>`` (prompts left-padded to
    ``prompt_len``, responses right-padded; -1 = padding): <bos> -> [CLS] (0), the k-th prompt character -> k, the
    t-th response character -> start + t, <eos> -> the [SEP] after that response (start + len(y)).

    ``prompt_lens`` count <bos>; ``response_lens`` count <eos>; ``starts`` is where the response sits in the teacher
    row (:class:`TeacherBatch`)."""
    out = torch.full((len(prompt_lens), width), -1, dtype=torch.long)
    for b, (p, r, s) in enumerate(zip(prompt_lens, response_lens, starts)):
        out[b, prompt_len - p : prompt_len] = torch.arange(p)
        out[b, prompt_len : prompt_len + r] = s + torch.arange(r)
    return out


class CrossEncoder(torch.nn.Module):
    """The teacher: BertModel (eager attention) + a linear head on the pooler output."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.bert = bert
        self.head = torch.nn.Linear(bert.config.hidden_size, 1)

    def forward(self, batch: TeacherBatch, output_attentions: bool = False):
        """(logits (B,), attentions: one (B, H, Lt, Lt) per layer, or None)."""
        device = self.head.weight.device
        out = self.bert(input_ids=batch.input_ids.to(device), token_type_ids=batch.token_type_ids.to(device),
                        attention_mask=batch.attention_mask.to(device), output_attentions=output_attentions)
        logits = self.head(out.pooler_output).squeeze(-1).float()
        return logits, (out.attentions if output_attentions else None)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.bert.save_pretrained(path, safe_serialization=True)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, path / HEAD_FILE)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "CrossEncoder":
        quiet_transformers()
        path = resolve_model_path(path, key="idrm teacher path")  # a hub id: its snapshot (credo.models.hub)
        if not (path / HEAD_FILE).is_file():
            raise FileNotFoundError(f"{path}: not a saved idrm teacher (no {HEAD_FILE}); a run writes RUN_DIR/teacher")
        model = cls(BertModel.from_pretrained(path, local_files_only=True, attn_implementation="eager"))
        model.head.load_state_dict(load_file(path / HEAD_FILE))
        return model.to(device)


def build_teacher(tokenizer, *, hidden: int = 64, layers: int = 2, heads: int = 4, intermediate: int = 128,
                  seed: int = 0) -> CrossEncoder:
    """A freshly initialised teacher (the sizes docs/reward_models.md gives, by default), seeded."""
    quiet_transformers()
    config = BertConfig(vocab_size=len(tokenizer) + 2, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate, max_position_embeddings=512,
                        type_vocab_size=3, pad_token_id=tokenizer.pad_token_id, attn_implementation="eager")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CrossEncoder(BertModel(config, add_pooling_layer=True)).eval()  # train_teacher switches to train


def ordered(pairs: list[PreferencePair], chosen_first: list[bool], tokenizer) -> TeacherBatch:
    """Teacher rows with each pair's chosen response first where ``chosen_first[i]``, else second."""
    first = [p.chosen if c else p.rejected for p, c in zip(pairs, chosen_first)]
    second = [p.rejected if c else p.chosen for p, c in zip(pairs, chosen_first)]
    return encode_pairs(tokenizer, [p.prompt for p in pairs], first, second)


def train_teacher(teacher: CrossEncoder, tokenizer, pairs: list[PreferencePair], *, steps: int, batch_size: int,
                  lr: float, grad_clip: float = 1.0, seed: int = 0, log_every: int = 250) -> float:
    """BCE on "the first response is preferred", each pair in a random order; returns the last loss."""
    rng = random.Random(f"credo/idrm/teacher/{seed}")
    opt = build_optimizer(teacher, lr=lr)
    sched = build_scheduler(opt, warmup_steps=0, total_steps=steps)
    teacher.train()
    loss = torch.zeros(())
    for step in range(steps):
        batch = rng.sample(pairs, min(batch_size, len(pairs)))
        order = [rng.random() < 0.5 for _ in batch]
        logits, _ = teacher(ordered(batch, order, tokenizer))
        loss = F.binary_cross_entropy_with_logits(logits, torch.tensor(order, dtype=torch.float32,
                                                                       device=logits.device))
        loss.backward()
        clip_and_step(teacher, opt, sched, grad_clip)
        if log_every and (step + 1) % log_every == 0:
            log.info("idrm teacher step %d/%d: loss %.4f", step + 1, steps, float(loss.detach()))
    teacher.eval()
    return float(loss.detach())


@torch.no_grad()
def teacher_accuracy(teacher: CrossEncoder, tokenizer, pairs: list[PreferencePair],
                     batch_size: int = 64) -> dict[str, float]:
    """Pairwise accuracy with the chosen response first (logit > 0), second (logit < 0), and their mean; also the
    per-pair correctness averaged over the orders (``per_pair``, a list) for breakdowns."""
    was = teacher.training
    teacher.eval()
    first, second = [], []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        first.append(teacher(ordered(chunk, [True] * len(chunk), tokenizer))[0] > 0)
        second.append(teacher(ordered(chunk, [False] * len(chunk), tokenizer))[0] < 0)
    teacher.train(was)
    a, b = torch.cat(first).float(), torch.cat(second).float()
    return {"chosen_first": float(a.mean()), "chosen_second": float(b.mean()), "mean": float((a + b).mean() / 2),
            "per_pair": ((a + b) / 2).tolist()}
