"""Rollout with a Hugging Face causal LM: batched sampling with a KV cache.

Prompts are left-padded so every row decodes at the same column. Per step the logits are scaled
by the temperature; the recorded ``rollout_logprobs`` are log-probs of the sampled token under
that temperature-scaled, *unfiltered* distribution, which is what the trainer recomputes as
``old_logprobs`` (top-k / top-p only restrict which tokens can be drawn). A row stops at EOS
(kept as the last response token, inside the loss mask) or at ``max_new_tokens``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from credo.models.tokenizer import encode_prompt
from credo.types import Example, SamplingParams, Trajectory


class HFRolloutEngine:
    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, seed: int = 0, max_batch_size: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    # -------------------------------------------------------------- protocol

    def generate(self, prompts: list[Example], n: int, sampling: SamplingParams) -> list[Trajectory]:
        prompt_ids = [self.encode(ex.prompt) for ex in prompts]
        rows = [(g, ex, ids) for g, (ex, ids) in enumerate(zip(prompts, prompt_ids)) for _ in range(n)]
        outs = self.continue_ids([r[2] for r in rows], sampling)
        return [self._trajectory(row, out) for row, out in zip(rows, outs)]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    # -------------------------------------------------------------- token-level API (agent loops)

    def continue_ids(self, prefixes: list[list[int]], sampling: SamplingParams, *, stop_ids: tuple[int, ...] = (),
                     top_logprobs: int = 0, stop_sequences: tuple[tuple[int, ...], ...] = ()) -> list[Continuation]:
        """Sample a continuation of every token-id prefix, in batches of ``max_batch_size``.

        A row stops after EOS or any ``stop_ids`` token, or once its generated tokens end with one of
        ``stop_sequences`` (vLLM's ``stop``; the sequence is kept), or at ``max_new_tokens``.
        ``top_logprobs > 0`` also records the k largest log-probs at every generated position.
        """
        gen = self.generator
        if sampling.seed is not None:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(sampling.seed)
        stops = tuple({self.eos_id, *stop_ids})
        out: list[Continuation] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(prefixes), self.max_batch_size):
                out.extend(self._decode(prefixes[start : start + self.max_batch_size], sampling, gen, stops,
                                        top_logprobs, tuple(tuple(q) for q in stop_sequences if q)))
        finally:
            self.model.train(was_training)
        return out

    # -------------------------------------------------------------- internals

    def encode(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    @torch.no_grad()
    def _decode(self, prefixes: list[list[int]], sp: SamplingParams, gen: torch.Generator, stops: tuple[int, ...],
                top_k: int, stop_sequences: tuple[tuple[int, ...], ...] = ()) -> list[Continuation]:
        batch = len(prefixes)
        plen = max(len(ids) for ids in prefixes)
        input_ids = torch.full((batch, plen), self.pad_id, dtype=torch.long)
        attn = torch.zeros((batch, plen), dtype=torch.long)
        for i, ids in enumerate(prefixes):
            input_ids[i, plen - len(ids) :] = torch.tensor(ids)
            attn[i, plen - len(ids) :] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        cache = DynamicCache(config=self.model.config)
        stop_t = torch.tensor(stops, device=self.device)
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        finished_at: list[int | None] = [None] * batch
        tokens, logps, tops = [], [], []
        step_ids, step_pos = input_ids, positions
        for t in range(sp.max_new_tokens):
            out = self.model(input_ids=step_ids, attention_mask=attn, position_ids=step_pos, cache=cache, use_cache=True)
            cache = out.cache
            logits = out.logits[:, -1, :].float()  # (B, V)
            nxt, lp, full = self._sample(logits, sp, gen)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
            tokens.append(nxt)
            logps.append(torch.where(done, torch.zeros_like(lp), lp))
            if top_k:
                tops.append(torch.topk(full, min(top_k, full.shape[-1]), dim=-1).values.cpu())
            newly = (~done) & torch.isin(nxt, stop_t)
            if stop_sequences:
                newly = newly | self._ends_with(tokens, done, stop_sequences)
            for i in newly.nonzero().flatten().tolist():
                finished_at[i] = t + 1
            done = done | newly
            if bool(done.all()):
                break
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=-1)  # finished rows' outputs are discarded
            step_ids = nxt.unsqueeze(-1)
            step_pos = step_pos[:, -1:] + 1
        tokens_t = torch.stack(tokens, 1).cpu()  # (B, T)
        logps_t = torch.stack(logps, 1).cpu()  # (B, T)
        tops_t = torch.stack(tops, 1) if top_k else None  # (B, T, k)
        outs = []
        for i in range(batch):
            length = finished_at[i] if finished_at[i] is not None else tokens_t.shape[1]
            outs.append(Continuation(ids=tokens_t[i, :length].tolist(), logprobs=logps_t[i, :length].tolist(),
                                     finish_reason="stop" if finished_at[i] is not None else "length",
                                     top_logprobs=tops_t[i, :length] if tops_t is not None else None))
        return outs

    @staticmethod
    def _ends_with(tokens: list[torch.Tensor], done: torch.Tensor,
                   sequences: tuple[tuple[int, ...], ...]) -> torch.Tensor:
        """(B,) bool: active rows whose generated tokens so far end with one of ``sequences``."""
        hit = torch.zeros_like(done)
        for seq in sequences:
            if len(seq) > len(tokens):
                continue
            tail = torch.stack(tokens[-len(seq):], 1)  # (B, len(seq))
            hit |= (tail == torch.tensor(seq, device=tail.device)).all(-1)
        return hit & ~done

    def _sample(self, logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator):
        """(token (B,), its log-prob (B,), full log-probs (B, V)) under the temperature-scaled logits."""
        if sp.greedy or sp.temperature == 0:
            logprobs = logits.log_softmax(-1)
            tok = logits.argmax(-1)
            return tok, logprobs.gather(-1, tok.unsqueeze(-1)).squeeze(-1), logprobs
        logits = logits / sp.temperature
        logprobs = logits.log_softmax(-1)  # (B, V)
        filtered = filter_logits(logits, top_k=sp.top_k, top_p=sp.top_p)
        probs = filtered.softmax(-1).cpu()
        tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1).to(logits.device)
        return tok, logprobs.gather(-1, tok.unsqueeze(-1)).squeeze(-1), logprobs

    def _trajectory(self, row, cont: Continuation) -> Trajectory:
        group_id, example, prompt_ids = row
        ids = cont.ids
        ended = cont.finish_reason == "stop"
        text_ids = ids[:-1] if ended else ids
        return Trajectory(
            example=example, group_id=group_id, prompt_ids=prompt_ids, response_ids=ids,
            rollout_logprobs=cont.logprobs, response_mask=[1] * len(ids),
            finish_reason="eos" if ended else "length",
            response_text=self.tokenizer.decode(text_ids, skip_special_tokens=True),
        )


@dataclass
class Continuation:
    """What :meth:`HFRolloutEngine.continue_ids` sampled for one prefix."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS or a stop id, kept as the last token) | "length"
    top_logprobs: torch.Tensor | None = None  # (len(ids), k) when requested


def filter_logits(logits: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / nucleus(top-p) set to -inf. (B, V) -> (B, V)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest prefix reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits
