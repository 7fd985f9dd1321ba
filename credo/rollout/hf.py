"""Rollout with a Hugging Face causal LM: batched sampling with a KV cache.

Prompts are left-padded so every row decodes at the same column. Per step the logits are scaled
by the temperature; the recorded ``rollout_logprobs`` are log-probs of the sampled token under
that temperature-scaled, *unfiltered* distribution, which is what the trainer recomputes as
``old_logprobs`` (top-k / top-p only restrict which tokens can be drawn). A row stops at EOS
(kept as the last response token, inside the loss mask) or at ``max_new_tokens``.

Partial rollouts (``rollout.partial``, :mod:`credo.distributed.staleness`): a :class:`DecodeHook` set as
``engine.decode_hook`` runs before each decode step of the calls it applies to, may load newer weights there (the
generation continues under them), and the engine then records every token's policy version
(``Continuation.versions``, ``Trajectory.token_versions``). At a switch the prefix's KV cache is kept (computed by
the older policy) or, with ``hook.recompute_kv``, recomputed by a prefill of prompt + tokens so far.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from transformers import DynamicCache

from credo.guards.weights import model_token_logprobs, weights_fingerprint
from credo.models.compat import cache_kwargs, output_cache
from credo.models.lora import adapter_state, is_lora, load_adapter_state
from credo.models.vision import example_pixels, image_token_id, is_vision_model
from credo.models.tokenizer import encode_prompt
from credo.rollout.base import OnDone
from credo.rollout.kv_reuse import KVSession, assemble, save_rows
from credo.rollout.lean import lean_decoder
from credo.types import Example, SamplingParams, Trajectory


class DecodeHook(Protocol):
    """Between decode steps of a partial rollout (module docstring)."""

    recompute_kv: bool  # after a weight switch, recompute the prefix's KV cache with the new weights
    generator: torch.Generator  # the keys of the calls it applies to (instead of the engine's generator)

    def applies(self) -> bool:
        """Whether the calling generation is a partial rollout (e.g. the pipeline's thread, not an evaluation)."""

    def before_step(self, step: int) -> bool:
        """Called before decode step ``step`` is sampled (0: before the prefill); True if it changed the weights."""


class HFRolloutEngine:
    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, seed: int = 0, max_batch_size: int = 256,
                 lean: bool = True):
        self.model = model
        # Llama / Qwen2: decode steps through credo's lean loop on a preallocated cache (credo.rollout.lean)
        self.lean = lean_decoder(model) if lean else None
        # agent turns on KV sessions (credo.rollout.kv_reuse): full-attention Llama-family caches, text only
        self.kv_sessions = lean_decoder(model) is not None
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.policy_version = 0  # which policy the weights are (update_weights); recorded on every trajectory
        # a vision-language policy never samples its image placeholder (a response holding one would not match the
        # image features); its log-probs are then those of the distribution without it
        self.banned = torch.tensor([image_token_id(model.config)]) if is_vision_model(model) else None
        self.decode_hook: DecodeHook | None = None  # partial rollouts: may switch weights between decode steps

    # -------------------------------------------------------------- protocol

    def generate(self, prompts: list[Example], n: int, sampling: SamplingParams, on_done: OnDone | None = None,
                 *, stream: tuple[int, int] | None = None) -> list[Trajectory]:
        """``stream=(key, first_row)``: sample as rows ``first_row, ...`` of a call whose draws are keyed ``key``
        (a pool worker's share of a larger batch samples exactly what one engine would, :func:`uniform_draws`);
        None draws a fresh key from this engine's generator."""
        prompt_ids = [self.encode(ex.prompt) for ex in prompts]
        rows = [(g, ex, ids) for g, (ex, ids) in enumerate(zip(prompts, prompt_ids)) for _ in range(n)]
        on_finish = None if on_done is None else (lambda i, cont: on_done(i, self._trajectory(rows[i], cont)))
        images = example_pixels(prompts)  # (len(prompts), 3, H, W) for a vision-language policy, else None
        outs = self.continue_ids([r[2] for r in rows], sampling, on_finish=on_finish, stream=stream,
                                 pixel_values=None if images is None else images.repeat_interleave(n, dim=0))
        return [self._trajectory(row, out) for row, out in zip(rows, outs)]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    @property
    def model_config(self) -> Any:
        return self.model.config

    def close(self) -> None:
        """Nothing to release (the engine runs in this process); pools of remote engines release workers."""

    def update_weights(self, weights: torch.nn.Module | dict[str, torch.Tensor], *, version: int) -> None:
        """Serve ``weights`` (a module, or a state dict of whole weights) from now on, as policy ``version``
        (recorded on every trajectory). This engine may sample from the trainer's own module: then only the version
        changes."""
        if isinstance(weights, torch.nn.Module):
            if weights is not self.model and is_lora(weights):  # a LoRA policy: only its adapter tensors travel
                load_adapter_state(self.model, adapter_state(weights))
            elif weights is not self.model:
                self.model.load_state_dict(weights.state_dict())
        else:
            self.model.load_state_dict(weights)
        self.policy_version = version

    def weights_fingerprint(self) -> dict[str, tuple[float, float]]:
        """The served weights' fingerprint (credo.guards.weights): the weight_sync guard compares it with the
        trainer's after every sync."""
        return weights_fingerprint(self.model)

    def score_ids(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        """Log-probs of given token ids under the served weights (the vLLM engine's contract, temperature 1)."""
        return model_token_logprobs(self.model, sequences, starts)

    # -------------------------------------------------------------- token-level API (agent loops)

    def continue_ids(self, prefixes: list[list[int]], sampling: SamplingParams, *, stop_ids: tuple[int, ...] = (),
                     top_logprobs: int = 0, stop_sequences: tuple[tuple[int, ...], ...] = (),
                     on_finish: Callable[[int, Continuation], None] | None = None,
                     stream: tuple[int, int] | None = None,
                     pixel_values: torch.Tensor | None = None,
                     sessions: list[KVSession] | None = None) -> list[Continuation]:
        """Sample a continuation of every token-id prefix, in batches of ``max_batch_size``.

        A row stops after EOS or any ``stop_ids`` token, or once its generated tokens end with one of
        ``stop_sequences`` (vLLM's ``stop``; the sequence is kept), or at ``max_new_tokens``.
        ``top_logprobs > 0`` also records the k largest log-probs at every generated position.
        ``on_finish(index, continuation)`` is called as each row completes, while the others still decode.
        Row i's draw at step t is :func:`uniform_draws` of (key, first_row + i, t): the key is drawn once per call
        from the engine's generator (or ``sampling.seed``'s) unless ``stream=(key, first_row)`` gives it, so how
        the rows are split into batches or over workers does not change what they sample. ``pixel_values``
        (len(prefixes), 3, H, W): each prefix's image, read at the prefill (vision-language policies).
        ``sessions`` (one :class:`~credo.rollout.kv_reuse.KVSession` per prefix, updated in place): reuse the keys
        and values of an earlier call's tokens and keep this call's for the next (agent turns; ignored and cleared
        where this engine cannot keep them: another architecture, images, a partial rollout's hook).
        """
        if stream is None:
            gen = self.generator
            if self.decode_hook is not None and self.decode_hook.applies():
                gen = self.decode_hook.generator  # a partial rollout's own stream (evaluations do not move it)
            if sampling.seed is not None:
                gen = torch.Generator(device="cpu")
                gen.manual_seed(sampling.seed)
            stream = (draw_key(gen), 0)
        key, first_row = stream
        stops = tuple({self.eos_id, *stop_ids})
        out: list[Continuation] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(prefixes), self.max_batch_size):
                notify = None if on_finish is None else (lambda i, c, s=start: on_finish(s + i, c))
                end = start + self.max_batch_size
                images = None if pixel_values is None else pixel_values[start:end]
                out.extend(self._decode(prefixes[start:end], sampling, (key, first_row + start), stops,
                                        top_logprobs, tuple(tuple(q) for q in stop_sequences if q), notify, images,
                                        None if sessions is None else sessions[start:end]))
        finally:
            self.model.train(was_training)
        return out

    # -------------------------------------------------------------- internals

    def encode(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    @torch.no_grad()
    def _decode(self, prefixes: list[list[int]], sp: SamplingParams, stream: tuple[int, int], stops: tuple[int, ...],
                top_k: int, stop_sequences: tuple[tuple[int, ...], ...] = (),
                on_finish: Callable[[int, Continuation], None] | None = None,
                pixel_values: torch.Tensor | None = None,
                sessions: list[KVSession] | None = None) -> list[Continuation]:
        """Decode every prefix; identical prefixes share one prefill (its KV is copied to each), and finished rows
        leave the batch once a quarter of it has finished (the KV cache is compacted), so no work is spent on them.
        Each (row, step) draws its own uniform number (keyed by ``stream``) whatever the batch holds, so results do
        not depend on when rows are compacted. With ``sessions``, rows prefill only what their session does not hold
        and leave their keys / values in it (credo.rollout.kv_reuse)."""
        batch, steps = len(prefixes), sp.max_new_tokens
        width = max(steps, 1)
        tokens, logps = torch.full((batch, width), self.pad_id, dtype=torch.long), torch.zeros((batch, width))
        tops = torch.zeros((batch, width, top_k)) if top_k else None
        lengths, finished = torch.zeros(batch, dtype=torch.long), torch.zeros(batch, dtype=torch.bool)
        hook = self.decode_hook if self.decode_hook is not None and self.decode_hook.applies() else None
        vers = torch.full((batch, width), -1, dtype=torch.long) if hook is not None else None  # token versions
        sessions = self._usable_sessions(sessions, hook, pixel_values)
        if steps == 0:
            return self._continuations(tokens, logps, tops, lengths, finished, on_finish)
        if sessions is not None:
            cache, attn, logits, active = self._prefill_sessions(prefixes, sessions)
        else:
            cache, attn, logits, active = self._prefill(prefixes, pixel_values, hook)
        filled = attn.shape[1]  # the prefill's columns; decode step t writes column filled + t
        state = self.lean.start(cache, attn, steps) if self.lean is not None else None

        def keep_kv(positions: torch.Tensor) -> None:  # rows at these batch positions leave: store their KV
            if sessions is not None and len(positions):
                save_rows(sessions, self._layers_kv(state, cache), positions.tolist(), active[positions].tolist(),
                          attn[:, :filled], filled, prefixes, tokens, lengths, self.policy_version)

        draws = uniform_draws(stream[0], stream[1] + torch.arange(batch), torch.arange(steps))  # (B, steps)
        step_pos = (attn.sum(-1, keepdim=True) - 1)  # (A, 1) position of the last prefix token
        stop_t = torch.tensor(stops, device=self.device)
        done = torch.zeros(len(active), dtype=torch.bool, device=self.device)  # finished rows still in the batch
        for t in range(steps):
            u = draws[active.cpu(), t]  # one draw per original row and step
            nxt, lp, full = self._sample(logits.float(), sp, u.to(self.device))
            self._record(t, active, done, nxt, lp, full, tokens, logps, lengths, vers, tops)
            newly = self._stopped(t, nxt, done, active, stop_t, stop_sequences, tokens)
            finished[active[newly].cpu()] = True
            done |= newly
            if on_finish is not None:
                for i in active[newly].tolist():
                    on_finish(i, self._continuation(tokens, logps, tops, i, int(lengths[i]), True, vers))
            if bool(done.all()) or t == steps - 1:
                break
            if int(done.sum()) * 4 >= len(done):  # compact: drop the finished rows from the batch and the cache
                keep_kv(done.nonzero().flatten())
                keep = (~done).nonzero().flatten()
                state.select(keep) if state is not None else cache.reorder_cache(keep)
                active, attn, step_pos, nxt, done = active[keep], attn[keep], step_pos[keep], nxt[keep], done[keep]
            if hook is not None and hook.before_step(t + 1) and not self._keeps_kv(hook, state):
                cache, attn, logits, state, step_pos = self._refill(prefixes, tokens, active, t + 1, pixel_values)
                continue
            step_pos = step_pos + 1
            if state is not None:
                logits = self.lean.step(state, nxt, step_pos)
                continue
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=-1)
            out = self.model(input_ids=nxt.unsqueeze(-1), attention_mask=attn, position_ids=step_pos,
                             **cache_kwargs(self.model, cache), use_cache=True, logits_to_keep=1)
            cache, logits = output_cache(out), out.logits[:, -1, :]
        keep_kv(torch.arange(len(active), device=self.device))
        return self._continuations(tokens, logps, tops, lengths, finished, on_finish, vers)

    def _keeps_kv(self, hook: DecodeHook, state) -> bool:
        """New weights mid-continuation: whether decoding goes on with the keys / values so far (the lean loop then
        re-reads its stacked weights); False where the hook asks for a fresh prefill under the new weights."""
        if hook.recompute_kv:
            return False
        if state is not None:
            self.lean.refresh(state)
        return True

    def _record(self, t: int, active, done, nxt, lp, full, tokens, logps, lengths, vers, tops) -> None:
        """Write decode step ``t``'s tokens, log-probs (and versions, top log-probs) of the live rows."""
        live = (~done).nonzero().flatten()
        rows = active[live].cpu()
        tokens[rows, t] = nxt[live].cpu()
        logps[rows, t] = lp[live].cpu()
        lengths[rows] = t + 1
        if vers is not None:
            vers[rows, t] = self.policy_version
        if tops is not None:
            tops[rows, t] = torch.topk(full[live], min(tops.shape[-1], full.shape[-1]), dim=-1).values.cpu()

    def _stopped(self, t: int, nxt, done, active, stop_t, stop_sequences, tokens) -> torch.Tensor:
        """(A,) bool: live rows that stopped at step ``t`` (a stop id, or their tokens end with a stop sequence)."""
        newly = (~done) & torch.isin(nxt, stop_t)
        if stop_sequences:
            newly |= self._ends_with(tokens[active.cpu(), : t + 1], stop_sequences).to(self.device) & ~done
        return newly

    def _usable_sessions(self, sessions: list[KVSession] | None, hook, pixel_values) -> list[KVSession] | None:
        """``sessions``, or None (each cleared: a later call must not read stale keys) where this call cannot keep
        them: another architecture, images, a partial rollout's hook."""
        if sessions is not None and (not self.kv_sessions or hook is not None or pixel_values is not None):
            for s in sessions:
                s.clear()
            return None
        return sessions

    @staticmethod
    def _layers_kv(state, cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values) (A, kv_heads, columns, hd) of the decode so far: the lean state's filled columns,
        or transformers' cache."""
        if state is not None:
            return [(k[:, :, :state.length], v[:, :, :state.length]) for k, v in zip(state.keys, state.values)]
        return [(layer.keys, layer.values) for layer in cache.layers]

    def _refill(self, prefixes: list[list[int]], tokens: torch.Tensor, active: torch.Tensor, t: int,
                pixel_values: torch.Tensor | None):
        """The decode state of the ``active`` rows after ``t`` generated tokens (of ``tokens``' (B, steps)),
        recomputed by the current weights: a prefill of prefix + tokens[:t] (cache, attention (A, P'), next-token
        logits (A, V), lean state, position of each row's last token (A, 1))."""
        steps = tokens.shape[1]
        rows = active.cpu()
        seqs = [prefixes[i] + tokens[i, :t].tolist() for i in rows.tolist()]
        images = None if pixel_values is None else pixel_values[rows]
        cache, attn, logits, _ = self._prefill(seqs, images)
        state = self.lean.start(cache, attn, steps - t) if self.lean is not None else None
        return cache, attn, logits, state, attn.sum(-1, keepdim=True) - 1

    def _prefill(self, prefixes: list[list[int]], pixel_values: torch.Tensor | None = None,
                 hook: DecodeHook | None = None):
        """Left-padded prefill of the distinct prefixes (with their images, when given), expanded to every row:
        (cache, attention (B, P), next-token logits (B, V), row indices (B,)). A partial rollout's ``hook`` first
        sets the weights of decode step 0."""
        if hook is not None:
            hook.before_step(0)
        distinct: dict[tuple, int] = {}
        keys = [tuple(ids) for ids in prefixes] if pixel_values is None else \
            [(tuple(ids), px.numpy().tobytes()) for ids, px in zip(prefixes, pixel_values.cpu())]
        inverse = torch.tensor([distinct.setdefault(k, len(distinct)) for k in keys])
        first = torch.full((len(distinct),), len(prefixes), dtype=torch.long)
        first = first.scatter_reduce(0, inverse, torch.arange(len(prefixes)), reduce="amin")  # a row of each
        uniq = [prefixes[i] for i in first.tolist()]
        plen = max(len(ids) for ids in uniq)
        input_ids = torch.full((len(uniq), plen), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(uniq), plen), dtype=torch.long)
        for i, ids in enumerate(uniq):
            input_ids[i, plen - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attn[i, plen - len(ids) :] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)  # (U, P)
        cache = DynamicCache(config=self.model.config)
        images = {} if pixel_values is None else {"pixel_values": pixel_values[first].to(self.device)}
        out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=positions,
                         **cache_kwargs(self.model, cache), use_cache=True,
                         logits_to_keep=1, **images)  # the next-token logits only, not (U, P, V)
        cache, logits = output_cache(out), out.logits[:, -1, :]
        idx = inverse.to(self.device)
        if len(uniq) < len(prefixes):
            cache.reorder_cache(idx)
        return cache, attn[idx], logits[idx], torch.arange(len(prefixes), device=self.device)

    def _prefill_sessions(self, prefixes: list[list[int]], sessions: list[KVSession]):
        """:meth:`_prefill`'s outputs for rows that may hold KV sessions: each row feeds only the tokens its session
        does not hold, on top of the cached keys / values (the layout in credo.rollout.kv_reuse)."""
        cached = [s.cached_length(p, self.policy_version) for s, p in zip(sessions, prefixes)]
        if not any(cached):
            for s, p in zip(sessions, prefixes):
                s.prefilled_tokens += len(p)
            return self._prefill(prefixes)
        past, ids, attn, pos = assemble(sessions, cached, prefixes, self.pad_id)
        cache = DynamicCache(config=self.model.config)
        if past is not None:
            past = past.to(self.device)
            for layer in range(past.shape[0]):
                cache.update(past[layer, 0], past[layer, 1], layer)
        for s, p, c in zip(sessions, prefixes, cached):
            s.reused_tokens += c
            s.prefilled_tokens += len(p) - c
        attn = attn.to(self.device)
        out = self.model(input_ids=ids.to(self.device), attention_mask=attn, position_ids=pos.to(self.device),
                         **cache_kwargs(self.model, cache), use_cache=True, logits_to_keep=1)
        return output_cache(out), attn, out.logits[:, -1, :], torch.arange(len(prefixes), device=self.device)

    @classmethod
    def _continuations(cls, tokens, logps, tops, lengths, finished, on_finish=None, vers=None) -> list[Continuation]:
        outs = [cls._continuation(tokens, logps, tops, i, n, bool(finished[i]), vers)
                for i, n in enumerate(lengths.tolist())]
        if on_finish is not None:  # the rows that ran to max_new_tokens (stopped rows were reported as they ended)
            for i, c in enumerate(outs):
                if c.finish_reason == "length":
                    on_finish(i, c)
        return outs

    @staticmethod
    def _continuation(tokens, logps, tops, i: int, n: int, stopped: bool, vers=None) -> Continuation:
        return Continuation(ids=tokens[i, :n].tolist(), logprobs=logps[i, :n].tolist(),
                            finish_reason="stop" if stopped else "length",
                            top_logprobs=tops[i, :n].clone() if tops is not None else None,
                            versions=vers[i, :n].tolist() if vers is not None else None)

    @staticmethod
    def _ends_with(tokens: torch.Tensor, sequences: tuple[tuple[int, ...], ...]) -> torch.Tensor:
        """(A,) bool: rows whose generated tokens (A, t) end with one of ``sequences``."""
        hit = torch.zeros(tokens.shape[0], dtype=torch.bool)
        for seq in sequences:
            if len(seq) <= tokens.shape[1]:
                hit |= (tokens[:, -len(seq):] == torch.tensor(seq)).all(-1)
        return hit

    def _sample(self, logits: torch.Tensor, sp: SamplingParams, u: torch.Tensor):
        """(token (A,), its log-prob (A,), full log-probs (A, V)) under the temperature-scaled logits; ``u`` (A,)
        are the rows' uniform draws (inverse-CDF sampling of the top-k / top-p filtered distribution)."""
        if self.banned is not None:
            logits = logits.index_fill(-1, self.banned.to(logits.device), float("-inf"))
        if sp.greedy or sp.temperature == 0:
            logprobs = logits.log_softmax(-1)
            tok = logits.argmax(-1)
            return tok, logprobs.gather(-1, tok.unsqueeze(-1)).squeeze(-1), logprobs
        logits = logits / sp.temperature
        logprobs = logits.log_softmax(-1)  # (A, V)
        cdf = filter_logits(logits, top_k=sp.top_k, top_p=sp.top_p).softmax(-1).cumsum(-1)  # (A, V)
        target = (u.unsqueeze(-1) * cdf[:, -1:]).clamp(min=torch.finfo(cdf.dtype).tiny)  # never a zero-mass token
        tok = torch.searchsorted(cdf, target).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
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
            policy_version=cont.versions[0] if cont.versions else self.policy_version,
            token_versions=list(cont.versions or ()),
        )


@dataclass
class Continuation:
    """What :meth:`HFRolloutEngine.continue_ids` sampled for one prefix."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS or a stop id, kept as the last token) | "length"
    top_logprobs: torch.Tensor | None = None  # (len(ids), k) when requested
    versions: list[int] | None = None  # partial rollouts: the policy version that sampled each token
    cached_tokens: int | None = None  # vLLM: prefix tokens its prefix cache served (None: this engine keeps no count)


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


# ---------------------------------------------------------------- counter-based draws

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32), without int64 overflow (16-bit halves)."""
    return (((((x >> 16) * c) & _M32) << 16) + (x & 0xFFFF) * c) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (the "lowbias32" xorshift-multiply finaliser), on int64 tensors in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def draw_key(generator: torch.Generator) -> int:
    """A fresh 62-bit key for one generation call."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


def uniform_draws(key: int, rows: torch.Tensor, steps: int | torch.Tensor) -> torch.Tensor:
    """Float32 uniforms in (0, 1), a pure function of (``key``, row index, decode step): the same row of the same
    call draws the same number wherever it runs (another batch, another worker). (A,) for an int ``steps``, (A, S)
    for a (S,) tensor of steps (a decode loop hashes all its steps at once). 24 bits, a float32's mantissa; the
    hash is counter-based, like Philox in vLLM / JAX, with a 32-bit mixer."""
    k = _mix32(torch.tensor([(key >> 31) & _M32]))
    k = _mix32(k ^ torch.tensor([key & _M32]))  # (1,)
    h = _mix32(k ^ _mix32(rows.to(torch.int64) & _M32))  # (A,)
    st = torch.as_tensor(steps, dtype=torch.int64)
    if st.dim() == 1:
        h = h.unsqueeze(1)  # (A, 1) against (S,)
    h = _mix32((h + _mul32(st & _M32, 0x9E3779B9)) & _M32)
    return ((h >> 8).to(torch.float32) + 0.5) / float(1 << 24)
