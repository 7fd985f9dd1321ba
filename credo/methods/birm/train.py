"""BiRM in practice: step labels by Monte-Carlo rollouts, training, scoring, best-of-N and step-level beam search.

    samples = label_steps(engine, runner, examples, samples=4, rollouts=8, step_tokens=2)  # generate + verify
    train_birm(model, tokenizer, samples, steps=..., batch_size=..., lr=...)
    scores  = score_responses(model, tokenizer, prompt_ids, response_ids, step_tokens=2, beta=1.0)
    best_of_n(...) / beam_search(...)

The math (labels, loss, score) is :mod:`credo.methods.birm.algo`; the model :class:`credo.methods.birm.model.BiRewardModel`.
Steps are fixed chunks of ``step_tokens`` response tokens (credo's tasks have no step delimiter); a step's head
outputs are read at its last token.
"""
from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch

from credo.methods.birm.algo import birm_loss, birm_score, mc_labels, step_ends
from credo.models.batch import token_batch
from credo.train.optim import build_optimizer, build_scheduler, clip_and_step
from credo.types import Example, SamplingParams


@dataclass
class StepSample:
    """One sampled response with its per-step labels (response coordinates)."""

    example: Example
    prompt_ids: list[int]
    response_ids: list[int]
    ends: list[int]  # each step's last token
    reward_labels: list[float]
    value_labels: list[float]
    correct: bool


def label_steps(engine, runner, tokenizer, examples: list[Example], *, samples: int, rollouts: int, step_tokens: int,
                sampling: SamplingParams, reward_label: str = "hard") -> list[StepSample]:
    """Sample ``samples`` responses per example; label every step prefix by ``rollouts`` continuations (at most the
    response budget ``sampling.max_new_tokens`` in all) that the verifier scores; the last step's labels are the
    response's own outcome. ``reward_label``: hard (any continuation accepted) or soft (the share)."""
    if reward_label not in ("hard", "soft"):
        raise ValueError(f"reward_label must be hard or soft, got {reward_label!r}")
    trajs = engine.generate(examples, samples, sampling)
    outcomes = runner.score([t.response_text for t in trajs], [t.example for t in trajs])
    jobs = defaultdict(list)  # prefix length -> [(sample index, step index)]
    ends = [step_ends(len(t.response_ids), step_tokens) for t in trajs]
    for i, e in enumerate(ends):
        for s, end in enumerate(e[:-1]):
            jobs[end + 1].append((i, s))
    successes = [[0.0] * len(e) for e in ends]
    for length, items in sorted(jobs.items()):
        rows = [i for i, _ in items for _ in range(rollouts)]  # sample index of every continuation
        sp = dataclasses.replace(sampling, max_new_tokens=max(sampling.max_new_tokens - length, 1))
        conts = engine.continue_ids([trajs[i].prompt_ids + trajs[i].response_ids[:length] for i in rows], sp)
        texts = [tokenizer.decode(trajs[i].response_ids[:length] + c.ids, skip_special_tokens=True)
                 for i, c in zip(rows, conts)]
        results = runner.score(texts, [trajs[i].example for i in rows])
        for k, (i, s) in enumerate(items):
            successes[i][s] = sum(float(r.correct) for r in results[k * rollouts : (k + 1) * rollouts])
    out = []
    for t, e, succ, res in zip(trajs, ends, successes, outcomes):
        soft, hard = mc_labels(torch.tensor(succ[:-1]), rollouts)
        value = soft.tolist() + [float(res.correct)]
        reward = (hard if reward_label == "hard" else soft).tolist() + [float(res.correct)]
        out.append(StepSample(t.example, t.prompt_ids, t.response_ids, e, reward, value, bool(res.correct)))
    return out


def step_batch(tokenizer, prompt_ids: list[list[int]], response_ids: list[list[int]]):
    """Rows in credo's batch layout (:class:`credo.types.TrainBatch`) for prompt + response token ids."""
    return token_batch(prompt_ids, response_ids, pad_id=tokenizer.pad_token_id)


def _heads(model, batch):
    """Reward and value head outputs at every response position (B, T) (the step's last token reads its state)."""
    return model.step_heads(batch)


def label_tensors(samples: list[StepSample], width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(reward labels, value labels, label mask), each (B, width), at the step ends."""
    rew, val, mask = (torch.zeros(len(samples), width) for _ in range(3))
    for b, s in enumerate(samples):
        idx = torch.tensor(s.ends)
        rew[b, idx], val[b, idx], mask[b, idx] = torch.tensor(s.reward_labels), torch.tensor(s.value_labels), 1.0
    return rew, val, mask


def lm_loss(model, batch) -> torch.Tensor:
    """Mean next-token loss on the response tokens (BiRM's ``loss_on_llm``)."""
    device = next(model.parameters()).device
    _, _, logits = model(batch.input_ids.to(device), batch.attention_mask.to(device),
                         batch.position_ids.to(device), with_logits=True)
    p, t = batch.prompt_len, batch.responses.shape[1]
    pred = logits[:, p - 1 : p - 1 + t].float()  # (B, T, V) predicts response token t
    nll = torch.nn.functional.cross_entropy(pred.flatten(0, 1), batch.responses.to(device).flatten(),
                                            reduction="none").view_as(batch.response_mask)
    mask = batch.response_mask.to(device)
    return (nll * mask).sum() / mask.sum().clamp(min=1.0)


def train_birm(model, tokenizer, samples: list[StepSample], *, steps: int, batch_size: int, lr: float,
               loss_on_llm: bool = False, seed: int = 0, grad_clip: float = 1.0, warmup_steps: int = 0,
               on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
    """BiRM training on random mini-batches of labelled responses (:func:`credo.methods.birm.algo.birm_loss`, plus the
    next-token loss with ``loss_on_llm``)."""
    rng = random.Random(f"credo/birm/{seed}")
    opt = build_optimizer(model, lr=lr)
    sched = build_scheduler(opt, warmup_steps=warmup_steps, total_steps=steps)
    model.train()
    for step in range(steps):
        chosen = rng.sample(samples, min(batch_size, len(samples)))
        batch = step_batch(tokenizer, [s.prompt_ids for s in chosen], [s.response_ids for s in chosen])
        reward, value = _heads(model, batch)
        rew_y, val_y, mask = (x.to(reward.device) for x in label_tensors(chosen, reward.shape[1]))
        loss, metrics = birm_loss(reward, value, rew_y, val_y, mask)
        if loss_on_llm:
            lm = lm_loss(model, batch)
            loss = loss + lm
            metrics["birm/lm_loss"] = float(lm.detach())
        loss.backward()
        metrics |= {"birm/loss": float(loss.detach()), "birm/grad_norm": clip_and_step(model, opt, sched, grad_clip)}
        if on_step is not None:
            on_step(step + 1, metrics)


@torch.no_grad()
def score_responses(model, tokenizer, prompt_ids: list[list[int]], response_ids: list[list[int]], *,
                    step_tokens: int, beta: float = 1.0, agg: str = "mean", batch_size: int = 128
                    ) -> dict[str, torch.Tensor]:
    """Per response (B,): ``score`` (BiRM), ``value`` (V at the last step), ``reward`` (mean R over the steps)."""
    was = model.training
    model.eval()
    out: dict[str, list[torch.Tensor]] = {"score": [], "value": [], "reward": []}
    for i in range(0, len(prompt_ids), batch_size):
        resp = [r or [tokenizer.pad_token_id] for r in response_ids[i : i + batch_size]]
        batch = step_batch(tokenizer, prompt_ids[i : i + batch_size], resp)
        reward, value = (x.cpu() for x in _heads(model, batch))
        ends = [step_ends(len(r), step_tokens) for r in resp]
        s_max = max(len(e) for e in ends)
        idx = torch.tensor([e + [e[-1]] * (s_max - len(e)) for e in ends])  # (B, S)
        mask = torch.tensor([[1.0] * len(e) + [0.0] * (s_max - len(e)) for e in ends])
        r_steps, v_steps = reward.gather(1, idx), value.gather(1, idx)
        out["score"].append(birm_score(r_steps, v_steps, mask, beta=beta, agg=agg))
        out["value"].append(birm_score(r_steps, v_steps, mask, beta=0.0))
        out["reward"].append((r_steps * mask).sum(-1) / mask.sum(-1))
    model.train(was)
    return {k: torch.cat(v) for k, v in out.items()}
