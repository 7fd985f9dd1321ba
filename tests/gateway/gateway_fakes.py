"""Fakes of the gateway tests: a scripted engine (fixed outputs: the exact-output cases: tool calls, stop strings,
rendering) and the tiny model's config with room for chat prompts (the token-exactness cases)."""
from __future__ import annotations

import threading


from credo.config import ModelConfig
from credo.rollout.hf import Continuation
from credo.types import SamplingParams

# the tiny model of tests/conftest.py with room for a chat-template prompt (one token per character)
ROOMY = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    max_position_embeddings=512)


class ScriptedEngine:
    """An engine whose completions are scripted texts (encoded without special tokens, then ``end`` when given),
    each token's log-prob -0.25; records every batch's prefixes and caps. Calls beyond the script repeat the
    last text."""

    def __init__(self, tokenizer, texts: list[str], *, end: int | None, max_context: int = 4096):
        self.tokenizer, self.texts, self.end = tokenizer, list(texts), end
        self.batches: list[list[list[int]]] = []
        self.caps: list[int] = []
        self.model_config = type("Config", (), {"max_position_embeddings": max_context})()
        self.policy_version = 7
        self._lock = threading.Lock()
        self.served = 0

    def continue_ids(self, prefixes, sampling: SamplingParams, *, stop_ids=(), stop_sequences=(), **kw):
        with self._lock:
            self.batches.append([list(p) for p in prefixes])
            self.caps.append(sampling.max_new_tokens)
            out = []
            for _ in prefixes:
                text = self.texts[min(self.served, len(self.texts) - 1)]
                self.served += 1
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                ids += [self.end] if self.end is not None else []
                finish = "stop" if self.end is not None else "length"
                if len(ids) > sampling.max_new_tokens:
                    ids, finish = ids[:sampling.max_new_tokens], "length"
                out.append(Continuation(ids=ids, logprobs=[-0.25] * len(ids), finish_reason=finish))
            return out
